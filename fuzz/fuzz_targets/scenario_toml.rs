//! A simulator scenario (TOML). Invariants: no panic in reading or validating; a scenario read
//! back from its own rendering renders the same (compared as text: NaN is a valid TOML float).
#![no_main]

use libfuzzer_sys::fuzz_target;
use nightshift::sim::config::Scenario;

fuzz_target!(|body: &[u8]| {
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let Ok(scenario) = Scenario::from_toml(text) else {
        return;
    };
    let _ = scenario.validate();
    let rendered = scenario.to_toml();
    let back = Scenario::from_toml(&rendered)
        .unwrap_or_else(|e| panic!("rendered scenario does not read back: {e}\n{rendered}"));
    assert_eq!(back.to_toml(), rendered);
});
