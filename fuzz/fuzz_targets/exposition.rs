//! Prometheus exposition text as scraped from vLLM pods.
//!
//! The parse and its invariants: `nightshift::test_support::fuzz::exposition`, which
//! `tests/fuzz.rs` also runs on every committed seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nightshift::test_support::fuzz::exposition(data));
