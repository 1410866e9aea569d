//! Integration tests of the KEDA external scaler: real gRPC on loopback, a vLLM-metrics
//! emulator.

mod emulator;
mod fake_prometheus;
mod grpc;
mod harness;
mod real_prometheus;
