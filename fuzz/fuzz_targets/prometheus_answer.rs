//! A Prometheus HTTP API answer (`/api/v1/query`).
//!
//! The parse and its invariants: `nightshift::test_support::fuzz::prometheus_answer`, which
//! `tests/fuzz.rs` also runs on every committed seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nightshift::test_support::fuzz::prometheus_answer(data));
