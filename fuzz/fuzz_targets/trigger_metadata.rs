//! A ScaledObject trigger's metadata as KEDA passes it. The input is the ScaledObject's
//! namespace on the first line, then one `key: value` per line (the YAML of a trigger's
//! `metadata`). Invariants: no panic; parsing is deterministic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nightshift::scaler::metadata::{Table, parse};

fuzz_target!(|body: &[u8]| {
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let mut lines = text.lines();
    let namespace = lines.next().unwrap_or_default();
    let raw: Table = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let first = parse(&raw, namespace);
    assert_eq!(first, parse(&raw, namespace));
});
