//! Where the test suites find Debian's `prometheus`: `NIGHTSHIFT_PROMETHEUS_BIN`, else on `PATH`.
//! Included by path (`#[path]`) into each suite that starts a real Prometheus.

use std::path::PathBuf;

/// The `prometheus` binary, if there is one.
pub fn prometheus_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NIGHTSHIFT_PROMETHEUS_BIN").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file())
}
