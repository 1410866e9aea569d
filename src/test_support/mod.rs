//! What the test suites, benchmarks and unit tests share, compiled for unit tests and with the
//! `test-support` feature only (the integration tests and benchmarks turn it on; the shipped
//! binary never has it).
//!
//! - [`fixtures`]: builders of pods and nodes (`pod("ns", "name").on("n1").gpus(2)`).
//! - [`cluster`]: a fixed cluster the webhook reads namespaces and PriorityClasses from.
//! - [`webhook`]: the webhook's reviewer over a research namespace, as every suite and bench
//!   sets it up.
//! - [`certs`]: a short-lived CA and serving certificate for `localhost` and `127.0.0.1`.
//! - [`emulator`]: an emulator of vLLM's metrics endpoint that a test drives while it runs.
//! - [`prometheus_bin`]: where the suites find a real Prometheus binary.
//! - [`fuzz`]: the fuzz targets' checks, one function per target, that the targets in `fuzz/`
//!   run on libFuzzer's inputs and `tests/fuzz.rs` on every committed seed.
//!
//! Nothing of the product imports this module.

pub mod certs;
pub mod cluster;
pub mod emulator;
pub mod fixtures;
pub mod fuzz;
pub mod prometheus_bin;
pub mod webhook;
