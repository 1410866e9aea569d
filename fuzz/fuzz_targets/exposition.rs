//! Prometheus exposition text as scraped from vLLM pods. Invariants: no panic; every reading
//! returned, sums over engines included, is finite and non-negative.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nightshift::sources::exposition::parse;

fuzz_target!(|body: &[u8]| {
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let matchers = [
        vec![],
        vec![(
            "model_name".to_string(),
            "meta-llama/Llama-3.1-8B-Instruct".to_string(),
        )],
    ];
    for m in &matchers {
        if let Ok(readings) = parse(text, m) {
            for r in readings.values() {
                for v in [r.waiting, r.running, r.kv_cache, r.generation_tokens_total]
                    .into_iter()
                    .flatten()
                {
                    assert!(v.is_finite() && v >= 0.0, "{r:?}");
                }
            }
        }
    }
});
