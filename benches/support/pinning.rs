//! Where the load benchmarks put the server and the load generator: on cores apart, so that the
//! generator's work is neither counted as the server's latency nor steals the server's core.
//!
//! With `n ≥ 2` cores the server gets the first `n / 2` and the generator the rest (on 2 cores:
//! server on core 0, generator on core 1). Pinning uses util-linux `taskset`: a child process is
//! started under `taskset -c`, and a benchmark pins its own process with `taskset -a -p -c` before
//! it starts any thread, so that every thread it starts later inherits the mask. The crate forbids
//! unsafe code, and `taskset` needs no new dependency. On one core, or without `taskset`, nothing
//! is pinned and [`Pinning::describe`] says so.

use std::{
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

/// The cores of the server and of the load generator, as `taskset` lists (`0`, `0-7`).
#[derive(Clone, Debug)]
pub struct Pinning {
    pub server: Option<String>,
    pub generator: Option<String>,
    /// Cores each side has (for thread counts); the whole machine when not pinned.
    pub server_cores: usize,
    pub generator_cores: usize,
}

impl Pinning {
    /// Server on the first half of the cores, generator on the second half, when there are at
    /// least two cores and `taskset` is installed (`NIGHTSHIFT_BENCH_PIN=0` turns pinning off).
    pub fn split() -> Self {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        let wanted = std::env::var("NIGHTSHIFT_BENCH_PIN").map_or(true, |v| v != "0");
        let taskset = Command::new("taskset")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        if n < 2 || !wanted || !taskset {
            return Self {
                server: None,
                generator: None,
                server_cores: n,
                generator_cores: n,
            };
        }
        let half = n / 2;
        let list = |from: usize, to: usize| {
            if from == to {
                from.to_string()
            } else {
                format!("{from}-{to}")
            }
        };
        Self {
            server: Some(list(0, half - 1)),
            generator: Some(list(half, n - 1)),
            server_cores: half,
            generator_cores: n - half,
        }
    }

    /// One line for the benchmark's output.
    pub fn describe(&self) -> String {
        match (&self.server, &self.generator) {
            (Some(s), Some(g)) => format!(
                "pinning (taskset): server on core(s) {s}, load generator on core(s) {g}, of {}",
                self.server_cores + self.generator_cores
            ),
            _ => format!(
                "no pinning (one core, taskset missing or NIGHTSHIFT_BENCH_PIN=0): server and \
                 load generator share the {} core(s)",
                self.server_cores
            ),
        }
    }

    /// Pins this whole process (every thread it has now, and so every thread they start later)
    /// to `cores`; does nothing for `None`. Call it before starting any runtime.
    pub fn pin_self(cores: Option<&str>) {
        let Some(cores) = cores else { return };
        let status = Command::new("taskset")
            .args(["-a", "-p", "-c", cores, &std::process::id().to_string()])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run taskset");
        assert!(status.success(), "taskset -a -p -c {cores} failed");
    }

    /// A command running `program` on `cores` (under `taskset -c`), or as is for `None`.
    // The scaler benchmark's server is started by `scaler_load.rs`, shared with the soak
    // benchmark, which pins nothing.
    #[allow(dead_code)]
    pub fn command(cores: Option<&str>, program: impl AsRef<std::ffi::OsStr>) -> Command {
        match cores {
            Some(cores) => {
                let mut c = Command::new("taskset");
                c.args(["-c", cores]).arg(program);
                c
            }
            None => Command::new(program),
        }
    }
}

/// Interrupts the cores in `cores` (a `taskset` list: `1`, `8-15`) have received to wake a
/// thread so far: rescheduling and function-call interrupts, from `/proc/interrupts`. Sent
/// mostly by the server's cores when an answer finds a generator thread asleep. `None` where
/// the file cannot be read.
pub fn wakeups(cores: &str) -> Option<u64> {
    let wanted = parse_cores(cores)?;
    let text = std::fs::read_to_string("/proc/interrupts").ok()?;
    let mut lines = text.lines();
    // The header names the columns: `CPU0 CPU1 …`, online CPUs only.
    let columns: Vec<usize> = lines
        .next()?
        .split_whitespace()
        .map(|c| c.strip_prefix("CPU")?.parse().ok())
        .collect::<Option<_>>()?;
    let mut sum = 0;
    for line in lines {
        let mut fields = line.split_whitespace();
        if !matches!(fields.next(), Some("RES:" | "CAL:")) {
            continue;
        }
        for (cpu, count) in columns.iter().zip(fields) {
            if wanted.contains(cpu) {
                sum += count.parse::<u64>().ok()?;
            }
        }
    }
    Some(sum)
}

/// The cores of a `taskset` list made of numbers and ranges (`1`, `8-15`, `0,2-3`).
fn parse_cores(list: &str) -> Option<Vec<usize>> {
    let mut cores = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((from, to)) => {
                cores.extend(from.trim().parse::<usize>().ok()?..=to.trim().parse().ok()?)
            }
            None => cores.push(part.trim().parse().ok()?),
        }
    }
    Some(cores)
}

/// Keeps the current thread's tokio runtime from sleeping while it lives: a task that only
/// yields, so that the runtime polls its sockets without waiting on them, and no answer has to
/// wake the thread with an interrupt sent from the server's core (see [`wakeups`]). Only on
/// cores of the generator's own (`own_cores`): sharing the server's core, it would take the
/// server's time. Start it on a runtime whose one thread runs the load beside it, so that no
/// thread of the load waits for the core while this one spins.
pub struct Awake(Option<Arc<AtomicBool>>);

impl Awake {
    pub fn start(own_cores: bool) -> Self {
        Self(own_cores.then(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let stopped = stop.clone();
            tokio::spawn(async move {
                while !stopped.load(Ordering::Relaxed) {
                    tokio::task::yield_now().await;
                }
            });
            stop
        }))
    }
}

impl Drop for Awake {
    fn drop(&mut self) {
        if let Some(stop) = &self.0 {
            stop.store(true, Ordering::Relaxed);
        }
    }
}
