//! Times the default scenario (7 simulated days, 64 GPUs, the Azure conversation trace shaped by
//! the default envelope, every policy and the honest ceiling) end to end. One timed run per
//! iteration: a run takes seconds, far above timer noise, so no statistics harness is needed.
//!
//! `cargo bench --bench sim` (set `NIGHTSHIFT_SIM_BENCH_RUNS` for more runs).

use std::{path::Path, time::Instant};

use nightshift::sim::{self, config::Scenario, trace::Trace};

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it,
    // where a multi-second release-sized run does not belong.
    if !std::env::args().any(|a| a == "--bench") {
        println!("sim bench: skipped outside `cargo bench`");
        return;
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/traces/azure-llm-2023-conv.csv");
    let trace = match Trace::read(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("bench sim: {e}");
            std::process::exit(1);
        }
    };
    let runs: usize = std::env::var("NIGHTSHIFT_SIM_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let scenario = Scenario::default();
    for run in 1..=runs {
        let started = Instant::now();
        match sim::simulate(&scenario, &[&trace], Default::default()) {
            Ok(report) => {
                let requests: u64 = report.policies.iter().map(|p| p.requests).sum();
                println!(
                    "sim/default_7_days run {run}: {:.2} s wall, {} requests over {} policies",
                    started.elapsed().as_secs_f64(),
                    requests,
                    report.policies.len()
                );
            }
            Err(e) => {
                eprintln!("bench sim: {e}");
                std::process::exit(1);
            }
        }
    }
}
