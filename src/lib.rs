#![forbid(unsafe_code)]
//! nightshift lends idle LLM-inference GPUs to research jobs and takes them back the moment
//! inference needs them.
//!
//! The crate is laid out along the architecture:
//!
//! - [`demand`]: the pure composite-demand math and the vLLM [`demand::Signal`]s, at the bottom:
//!   it imports nothing of the crate; the scaler, the sources and the simulator build on it.
//! - [`notice`]: the pure reclaim-notice decisions (when inference will need more replicas, and
//!   which research pods the scheduler will preempt for them), beside [`demand`] at the bottom.
//! - [`forecast`]: the pure forecast of a service's daily demand shape (by time of day and day
//!   of week), beside [`demand`] at the bottom; the scaler's `forecast` signal and the simulator
//!   share it.
//! - [`scaler`]: the KEDA external scaler (gRPC) that turns vLLM metrics into demand.
//! - [`sources`]: where vLLM metrics come from (Prometheus, direct scrape of vLLM pods).
//! - [`webhook`]: the mutating admission webhook that marks research pods.
//! - [`pool`]: spare-GPU accounting, spare marks on nodes, preemption tracking, status.
//! - [`view`]: the researchers' web page of the pool (and its JSON), on a port of its own.
//! - [`vocabulary`]: the names the webhook and the pool share (labels, PriorityClasses, the GPU
//!   resource), set once for both.
//! - [`sim`]: the trace-driven simulator that estimates the GPU-hours freed.
//! - [`admin`], [`telemetry`], [`runtime`], [`cli`]: operations around them; [`tls`]: serving
//!   TLS (certificates reloaded from disk, accept loop, expiry metric) for the webhook and the
//!   scaler.
//!
//! Decision logic (demand, patches, accounting) is pure and lives apart from transport code.

pub mod admin;
pub mod capacity;
pub mod cli;
pub mod cluster;
pub mod demand;
pub mod duration;
pub mod forecast;
pub mod listen;
pub mod notice;
pub mod pool;
pub mod runtime;
pub mod scaler;
pub mod sim;
pub mod sources;
pub mod telemetry;
pub mod tls;
pub mod view;
pub mod vocabulary;
pub mod webhook;

/// Installs the process-wide rustls crypto provider (aws-lc-rs).
///
/// reqwest, tonic, kube and the webhook all use rustls; with more than one provider compiled in
/// and none installed, rustls refuses to build a configuration at run time. Call this once at
/// start-up, before any TLS client or server is built. Calling it again is harmless.
pub fn install_crypto_provider() {
    // An `Err` only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
