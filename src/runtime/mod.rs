//! The runtime floor: what every server of the process shares around the components, and nothing
//! of their decisions.
//!
//! - [`Context`] and [`Supervisor`]: wire the components together under one shutdown signal and
//!   end the process if any of them dies.
//! - [`admin`]: the admin port (`/livez`, `/readyz`, `/metrics`) and the metrics registry's prefix.
//! - [`listen`]: the limits every listener shares and the HTTP connection loop.
//! - [`tls`]: serving certificates reloaded from disk, the TLS accept loop, the expiry metric.
//! - [`cluster`]: the optional Kubernetes connection.
//! - [`telemetry`]: plain or JSON logs.
//!
//! It builds on [`crate::core`] only; the components (scaler, webhook, pool, view) build on it.

pub mod admin;
pub mod cluster;
mod context;
pub mod listen;
pub mod telemetry;
pub mod tls;

pub use context::{Context, Supervisor};
