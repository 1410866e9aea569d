//! A simulator scenario (TOML).
//!
//! The parse and its invariants: `nightshift::test_support::fuzz::scenario_toml`, which
//! `tests/fuzz.rs` also runs on every committed seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nightshift::test_support::fuzz::scenario_toml(data));
