//! Where the test suites find Debian's `prometheus`: `NIGHTSHIFT_PROMETHEUS_BIN`, else on `PATH`.

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

/// The `prometheus` binary for a test that needs one: `None`, with a note on stderr, where it is
/// not installed, so that the test is skipped on a developer's machine; but in CI (`CI` set),
/// where `.ci/test` installs it, a missing binary fails the test instead of skipping it.
pub fn prometheus_or_skip() -> Option<PathBuf> {
    let bin = prometheus_bin();
    if bin.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "prometheus binary not found: run `bash .ci/test`, which installs it"
        );
        eprintln!(
            "SKIPPED: no prometheus binary (install Debian's `prometheus` or run bash .ci/test)"
        );
    }
    bin
}
