//! A ScaledObject trigger's metadata as KEDA passes it.
//!
//! The parse and its invariants: `nightshift::test_support::fuzz::trigger_metadata`, which
//! `tests/fuzz.rs` also runs on every committed seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nightshift::test_support::fuzz::trigger_metadata(data));
