//! Integration tests of the KEDA external scaler: real gRPC on loopback, a vLLM-metrics
//! emulator, a counting Prometheus stand-in, a real Prometheus, TLS with generated certificates.

use nightshift::test_support::{emulator, prometheus_bin};

mod capacity;
mod fake_prometheus;
mod forecast;
mod grpc;
mod harness;
mod limits;
mod logs;
mod policy;
mod real_prometheus;
mod tls;
