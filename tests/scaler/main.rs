//! Integration tests of the KEDA external scaler: real gRPC on loopback, a vLLM-metrics
//! emulator, a counting Prometheus stand-in, a real Prometheus, TLS with generated certificates.

mod capacity;
mod emulator;
mod fake_prometheus;
mod forecast;
mod grpc;
mod harness;
mod limits;
mod logs;
mod policy;
#[path = "../support/prometheus_bin.rs"]
mod prometheus_bin;
mod real_prometheus;
mod tls;
