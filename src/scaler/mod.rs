//! The KEDA external scaler: turns vLLM metrics into a demand figure per inference service.
//!
//! [`demand`] holds the pure decision math shared with the simulator.

pub mod demand;
