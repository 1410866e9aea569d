//! Small helpers the load benchmarks share: overrides from the environment, percentiles of
//! sorted latencies, and medians of ratios.

use std::time::Duration;

/// `name` parsed from the environment, or `default` when unset or unreadable.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `p` percentile (0–1) of `sorted`; zero for no samples.
#[allow(dead_code)] // the in-process benchmarks that include this file take none
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// The median of `values` (the lower middle one for an even count); zero for none.
#[allow(dead_code)] // not every benchmark that includes this file takes medians
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values
        .get(values.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0.0)
}
