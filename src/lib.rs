#![forbid(unsafe_code)]
//! nightshift lends idle LLM-inference GPUs to research jobs and takes them back the moment
//! inference needs them.
//!
//! The crate is laid out in floors; each imports only from the floors below it:
//!
//! - [`core`]: the pure domain models (demand, learned capacity, forecast, reclaim notice,
//!   the shared vocabulary, durations), shared by the live components and the simulator.
//! - [`runtime`]: what the servers share around the components: the supervisor and its one
//!   shutdown signal, the admin port, listener limits, serving TLS, the cluster connection, logs.
//! - The components, peers of each other: [`scaler`] (the KEDA external scaler, gRPC),
//!   [`sources`] (where vLLM metrics come from: Prometheus, direct scrapes of vLLM pods),
//!   [`webhook`] (the mutating admission webhook that marks research pods), [`pool`] (spare-GPU
//!   accounting, spare marks, reclaim notices, preemption tracking, status) and [`view`] (the
//!   researchers' web page of the pool and its JSON).
//! - [`sim`]: the trace-driven simulator, built on [`core`] alone.
//! - [`cli`]: the command line, which starts the components on the runtime.
//! - `test_support`: fixtures, a fixed cluster, certificates, a vLLM emulator and the webhook
//!   as the suites set it up; for tests and benchmarks only (feature `test-support`).

pub mod cli;
pub mod core;
pub mod pool;
pub mod runtime;
pub mod scaler;
pub mod sim;
pub mod sources;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
pub mod view;
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
