//! A request trace (CSV: TIMESTAMP, ContextTokens, GeneratedTokens). Invariants: no panic;
//! a parsed trace is ordered with finite offsets, and replaying it gives finite, ordered
//! arrival times.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nightshift::sim::trace::{Arrivals, Envelope, Trace};

/// Arrivals drawn from each accepted trace: enough to wrap around a short trace a few times.
const REPLAYED: usize = 64;

fuzz_target!(|body: &[u8]| {
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let Ok(trace) = Trace::parse(text) else {
        return;
    };
    assert!(!trace.requests.is_empty());
    assert!(trace.span.is_finite() && trace.span >= 0.0);
    assert!(
        trace
            .requests
            .windows(2)
            .all(|w| w[0].offset <= w[1].offset)
    );
    let envelope = Envelope::new(&[1.0; 24]).expect("a flat envelope is valid");
    let mut last = 0.0;
    for a in Arrivals::new(&trace, &envelope, 7).take(REPLAYED) {
        assert!(a.at.is_finite() && a.at >= last, "{a:?} after {last}");
        last = a.at;
    }
});
