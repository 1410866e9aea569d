//! CPU time of a process or thread from `/proc`, for the benchmarks that report what the server
//! under load spent per request, and how often a thread went to sleep.
//!
//! Read from `schedstat`, the scheduler's own count of the nanoseconds a thread ran (user and
//! kernel alike), not from `stat`'s user and system times: those are sampled at each clock tick
//! (10 ms), so a phase of a second or two on a server that sleeps between calls is a few dozen
//! samples, and the CPU per call they give moves by ±10 % from one phase to the next.
//! `stat` is the fallback on a kernel without `schedstat`.

use std::path::Path;

/// CPU seconds thread `task` has run, `task` being a `/proc/<pid>/task/<tid>` directory; 0 when
/// it cannot be read.
pub fn cpu_seconds(task: &Path) -> f64 {
    if let Some(ns) = std::fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
    {
        return ns as f64 / 1e9;
    }
    // /proc reports times in USER_HZ, which Linux fixes at 100 per second for user space.
    const TICKS_PER_SECOND: f64 = 100.0;
    let stat = std::fs::read_to_string(task.join("stat")).unwrap_or_default();
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

/// How many times thread `task` (a `/proc/<pid>/task/<tid>` directory) gave up its core of its
/// own accord: each time it found nothing to do and slept (`voluntary_ctxt_switches`); 0 when it
/// cannot be read.
#[allow(dead_code)] // each bench includes this file and uses what it needs
pub fn sleeps(task: &Path) -> u64 {
    std::fs::read_to_string(task.join("status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// CPU seconds the live threads of process `pid` have run, summed.
#[allow(dead_code)] // each bench includes this file and uses one of the two
pub fn process_cpu_seconds(pid: u32) -> f64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| tasks.flatten().map(|t| cpu_seconds(&t.path())).sum())
        .unwrap_or(0.0)
}
