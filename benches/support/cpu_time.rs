//! CPU time of a process or thread from its `/proc/.../stat` file, for the benchmarks that report
//! what the server under load spent per request.

use std::path::Path;

/// CPU seconds (user + system) recorded in the `stat` file at `path` (`/proc/<pid>/stat` or
/// `/proc/<pid>/task/<tid>/stat`); 0 when it cannot be read.
pub fn cpu_seconds(path: &Path) -> f64 {
    // /proc reports times in USER_HZ, which Linux fixes at 100 per second for user space.
    const TICKS_PER_SECOND: f64 = 100.0;
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    // Fields after the parenthesised command: state is the 1st, utime the 12th, stime the 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field(11) + field(12)) as f64 / TICKS_PER_SECOND
}
