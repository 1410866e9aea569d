//! Work that stands for time passing and nothing else: the thread stays on its core, reading the
//! clock, and touches no memory, so that what it changes for the code after it is the time, not
//! the caches' contents or the core's idle.

use std::time::{Duration, Instant};

/// Keeps the thread running for `interval`, touching no memory: its core never idles.
pub fn spin(interval: Duration) {
    let started = Instant::now();
    while started.elapsed() < interval {
        std::hint::spin_loop();
    }
}
