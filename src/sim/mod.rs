//! The trace-driven simulator behind `nightshift simulate`: how many GPU-hours nightshift frees
//! for research, at what cost to inference, compared with the alternatives.
//!
//! A request trace is replayed, its rate shaped by a 24-hour envelope, against a model of vLLM
//! replicas ([`fleet`]), KEDA and the HPA ([`policy`]), and a GPU pool shared with a research
//! backlog ([`pool`]) whose pods the simulated kube-scheduler places and preempts
//! ([`scheduler`], a model of its own: the notice predictor is judged against it). Each policy runs through the same cluster ([`engine`]); the nightshift
//! policy calls the live scaler's [`crate::core::demand::compute`]. Runs are deterministic: the
//! same trace, scenario and seed give the same numbers.
//!
//! This module owns its options and errors; it does no I/O beyond reading the trace and the
//! scenario and writing the chart.

pub mod ceiling;
pub mod config;
pub mod engine;
pub mod fleet;
pub mod hindsight;
pub mod policy;
pub mod pool;
pub mod report;
pub mod scheduler;
pub mod service;
pub mod slo;
pub mod trace;

use std::path::PathBuf;

use clap::Args;

use self::{
    config::Scenario,
    engine::{RunOutcome, run_policy, run_schedule},
    policy::ScalingPolicy,
    report::Report,
    service::Service,
    trace::{Trace, TraceError},
};
use crate::core::demand::{self, DemandError, PerSignal, Totals};

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("service {service:?}: its trace {path}")]
    ServiceTrace {
        service: String,
        path: PathBuf,
        #[source]
        source: TraceError,
    },
    #[error("cannot read scenario {path}")]
    ReadScenario {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("scenario {path} is not valid")]
    ParseScenario {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("scenario: {0}")]
    Invalid(String),
    #[error("scenario: policies.nightshift targets are not valid")]
    Targets(#[source] DemandError),
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Options of `nightshift simulate`.
#[derive(Clone, Debug, Args)]
pub struct SimArgs {
    /// Request trace (CSV: TIMESTAMP, ContextTokens, GeneratedTokens; Azure LLM inference trace
    /// schema).
    #[arg(
        long,
        env = "NIGHTSHIFT_SIM_TRACE",
        default_value = "data/traces/azure-llm-2023-conv.csv"
    )]
    pub trace: PathBuf,

    /// Scenario file (TOML) overriding any default; see `--print-config` for every field.
    #[arg(long, env = "NIGHTSHIFT_SIM_CONFIG")]
    pub config: Option<PathBuf>,

    /// Simulated days (overrides the scenario's `run.days`).
    #[arg(long, env = "NIGHTSHIFT_SIM_DAYS")]
    pub days: Option<f64>,

    /// Seed choosing where the trace replay starts (overrides `run.seed`).
    #[arg(long, env = "NIGHTSHIFT_SIM_SEED")]
    pub seed: Option<u64>,

    /// Print the results as JSON instead of a table.
    #[arg(long, env = "NIGHTSHIFT_SIM_JSON")]
    pub json: bool,

    /// Write an SVG chart of GPUs by use over time to this file.
    #[arg(long, env = "NIGHTSHIFT_SIM_CHART")]
    pub chart: Option<PathBuf>,

    /// Print the effective scenario as TOML and exit.
    #[arg(long, env = "NIGHTSHIFT_SIM_PRINT_CONFIG")]
    pub print_config: bool,

    /// Also choose the night window with hindsight (a sweep of windows and night replicas on
    /// this trace, about 40 more runs) and compare every policy with it.
    #[arg(long, env = "NIGHTSHIFT_SIM_HINDSIGHT")]
    pub hindsight: bool,

    /// Also run the candidate policies, measured for the product but not yet what it does
    /// (today: nightshift with its utilization closed on the measured queue wait).
    #[arg(long, env = "NIGHTSHIFT_SIM_CANDIDATES")]
    pub candidates: bool,
}

/// What a simulation runs beyond the policies of [`ScalingPolicy::ALL`] and the honest ceiling.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extras {
    /// The night window chosen with hindsight ([`hindsight`]).
    pub hindsight: bool,
    /// The policies of [`ScalingPolicy::CANDIDATES`].
    pub candidates: bool,
}

/// Runs `nightshift simulate`: prints the table (or JSON) and writes the chart.
pub fn run(args: SimArgs) -> Result<(), SimError> {
    let SimArgs {
        trace,
        config,
        days,
        seed,
        json,
        chart,
        print_config,
        hindsight,
        candidates,
    } = args;
    let mut scenario = match &config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| SimError::ReadScenario {
                path: path.clone(),
                source,
            })?;
            Scenario::from_toml(&text).map_err(|source| SimError::ParseScenario {
                path: path.clone(),
                source,
            })?
        }
        None => Scenario::default(),
    };
    if let Some(d) = days {
        scenario.run.days = d;
    }
    if let Some(s) = seed {
        scenario.run.seed = s;
    }
    if print_config {
        print!("{}", scenario.to_toml());
        return Ok(());
    }
    let trace = Trace::read(&trace)?;
    let own = service_traces(&scenario, config.as_deref())?;
    let traces: Vec<&Trace> = if scenario.services.is_empty() {
        vec![&trace]
    } else {
        own.iter().map(|t| t.as_ref().unwrap_or(&trace)).collect()
    };
    let started = std::time::Instant::now();
    let extras = Extras {
        hindsight,
        candidates,
    };
    let report = simulate(&scenario, &traces, extras)?;
    tracing::info!(
        elapsed_s = started.elapsed().as_secs_f64(),
        days = scenario.run.days,
        policies = report.policies.len(),
        "simulation finished"
    );
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report)
                .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
    } else {
        print!("{}", report::table(&report));
    }
    if let Some(path) = chart {
        std::fs::write(&path, report::svg(&report))
            .map_err(|source| SimError::Write { path, source })?;
    }
    Ok(())
}

/// The traces the scenario's services name, read from paths relative to the scenario file
/// (`None` for a service that replays the run's trace).
fn service_traces(
    scenario: &Scenario,
    config: Option<&std::path::Path>,
) -> Result<Vec<Option<Trace>>, SimError> {
    let base = config
        .and_then(std::path::Path::parent)
        .unwrap_or(std::path::Path::new("."));
    scenario
        .services
        .iter()
        .map(|s| {
            let Some(path) = &s.trace else {
                return Ok(None);
            };
            let path = base.join(path);
            Trace::read(&path)
                .map(Some)
                .map_err(|source| SimError::ServiceTrace {
                    service: s.name.clone(),
                    path,
                    source,
                })
        })
        .collect()
}

/// Runs every policy through the scenario, computes its honest ceiling and replays it, and runs
/// the `extras` asked for, on several threads; results do not depend on them. `traces` holds
/// each service's trace, in the order of [`Scenario::service_scenarios`] (one when the scenario
/// names no services).
pub fn simulate(
    scenario: &Scenario,
    traces: &[&Trace],
    extras: Extras,
) -> Result<Report, SimError> {
    let hindsight = extras.hindsight;
    scenario.validate().map_err(SimError::Invalid)?;
    let services = Service::all(scenario, traces).map_err(SimError::Invalid)?;
    // The live code validates the targets: a configuration it would refuse is refused here.
    let probe = Totals {
        pods: 1,
        signals: PerSignal {
            waiting: Some(0.0),
            running: Some(0.0),
            kv_cache: Some(0.0),
            generation_tokens: Some(0.0),
            prompt_tokens: Some(0.0),
        },
    };
    demand::compute(&probe, &scenario.policies.nightshift.targets()).map_err(SimError::Targets)?;

    let policies: Vec<ScalingPolicy> = ScalingPolicy::ALL
        .into_iter()
        .chain(
            extras
                .candidates
                .then_some(ScalingPolicy::CANDIDATES)
                .into_iter()
                .flatten(),
        )
        .collect();
    let (ceiling, mut outcomes) = run_in_parallel(scenario, &services, &policies)?;
    let static_peak = match outcomes
        .iter()
        .position(|o| o.result.policy == ScalingPolicy::StaticPeak)
    {
        Some(i) => i,
        None => {
            let kind = ScalingPolicy::StaticPeak;
            outcomes.push(run_policy(kind, scenario, &services, false));
            outcomes.len() - 1
        }
    };
    let bar = slo::bar(outcomes[static_peak].result.minutes_within_slo_share);
    let (replay, chosen) = referee(scenario, &services, &ceiling, bar, hindsight)?;
    let chosen = match chosen {
        Some(bests) => hindsight::pick(scenario, bests, &outcomes[static_peak], bar),
        None => None,
    };
    outcomes.push(replay);
    let window = chosen.map(|(window, outcome)| {
        outcomes.push(outcome);
        window
    });

    let gpr = scenario.model.gpus_per_replica;
    let outcomes: Vec<_> = outcomes
        .into_iter()
        .map(|o| o.against_ceiling(&ceiling, gpr))
        .collect();
    let first = &outcomes[0];
    Ok(Report {
        model: scenario.model.name.clone(),
        days: scenario.run.days,
        seed: scenario.run.seed,
        pool_gpus: scenario.pool.nodes * scenario.pool.gpus_per_node,
        pool_gpu_hours: first.pool_gpu_hours,
        ideal_idle_gpu_hours: first.ideal_idle_gpu_hours,
        ceiling_idle_gpu_hours: ceiling.idle_gpu_hours,
        slo_queue_wait_p99_s: scenario.slo.queue_wait_p99_s,
        slo_bar_share: bar,
        hindsight: window,
        trace_requests: services.iter().map(|s| s.trace.requests.len()).sum(),
        services: services.iter().map(|s| s.name.clone()).collect(),
        timelines: outcomes.iter().map(|o| o.timeline.clone()).collect(),
        policies: outcomes.into_iter().map(|o| o.result).collect(),
    })
}

/// The second round of work, once the ceiling and the bar are known: the ceiling's schedule
/// replayed, and each window of the hindsight grid searched (when asked for), on as many
/// threads as the machine has.
fn referee(
    scenario: &Scenario,
    services: &[Service],
    ceiling: &ceiling::Ceiling,
    bar: f64,
    with_hindsight: bool,
) -> Result<(RunOutcome, Option<Vec<hindsight::WindowBest>>), SimError> {
    enum Work {
        Replay,
        Window((u32, u32)),
    }
    enum Done {
        Replay(Box<RunOutcome>),
        Window(Box<hindsight::WindowBest>),
    }
    let windows = if with_hindsight {
        hindsight::grid()
    } else {
        Vec::new()
    };
    // The windows' searches are the long tasks: they go first, the single replay last.
    let tasks: Vec<Work> = windows
        .into_iter()
        .map(Work::Window)
        .chain([Work::Replay])
        .collect();
    let started = std::time::Instant::now();
    let done = in_parallel(&tasks, |task| match *task {
        Work::Replay => Done::Replay(Box::new(run_schedule(
            &ceiling.services,
            scenario,
            services,
        ))),
        Work::Window(w) => Done::Window(Box::new(hindsight::search_window(
            scenario, services, bar, w,
        ))),
    })?;
    let mut replay = None;
    let mut bests = Vec::new();
    for d in done {
        match d {
            Done::Replay(o) => replay = Some(*o),
            Done::Window(b) => bests.push(*b),
        }
    }
    tracing::debug!(
        elapsed_s = started.elapsed().as_secs_f64(),
        windows = bests.len(),
        runs = bests.iter().map(|b| b.runs).sum::<usize>(),
        "honest ceiling replayed, hindsight window searched"
    );
    let replay =
        replay.ok_or_else(|| SimError::Invalid("the ceiling's replay did not run".into()))?;
    Ok((replay, with_hindsight.then_some(bests)))
}

/// Runs `work` on every task, on as many threads as the machine has (at most one per task),
/// each thread taking the next task in turn; the answers come back in the tasks' order, whatever
/// thread ran what.
fn in_parallel<T: Sync, R: Send>(
    tasks: &[T],
    work: impl Fn(&T) -> R + Sync,
) -> Result<Vec<R>, SimError> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(tasks.len())
        .max(1);
    let finished: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(task) = tasks.get(i) else {
                            break;
                        };
                        done.push((i, work(task)));
                    }
                    done
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join())
            .collect::<Result<Vec<_>, _>>()
            .map(|parts| parts.into_iter().flatten().collect())
    })
    .map_err(|_| SimError::Invalid("a simulation thread panicked".into()))?;
    let mut slots: Vec<Option<R>> = tasks.iter().map(|_| None).collect();
    for (i, r) in finished {
        slots[i] = Some(r);
    }
    slots
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| SimError::Invalid("a simulation task did not finish".into()))
}

/// One piece of a simulation's first round of work.
#[derive(Clone, Copy)]
enum Task {
    /// A policy's run, the `i`-th of those asked for.
    Policy(usize),
    /// A chunk of a service's ceiling: the service's index and the chunk's.
    Ceiling(usize, usize),
}

/// A finished [`Task`].
enum Done {
    Policy(Box<RunOutcome>),
    Ceiling(usize, Vec<u32>),
}

/// Runs the policies and the ceiling's chunks (each service's) on as many threads as the
/// machine has, each thread taking the next task in turn: the long policy runs first, then the
/// short chunks, so that the threads end together (with a thread per policy and per ceiling
/// half, one core sat idle while the slowest finished). Results are put back in order: they do
/// not depend on which thread ran what.
fn run_in_parallel(
    scenario: &Scenario,
    services: &[Service],
    policies: &[ScalingPolicy],
) -> Result<(ceiling::Ceiling, Vec<RunOutcome>), SimError> {
    let tasks: Vec<Task> = (0..policies.len())
        .map(Task::Policy)
        .chain(services.iter().enumerate().flat_map(|(s, service)| {
            (0..ceiling::Plan::chunks_of(&service.sc)).map(move |c| Task::Ceiling(s, c))
        }))
        .collect();
    // A service's ceiling plan replays its arrivals once; the first thread to reach one of its
    // chunks makes it, while the others still run policies.
    let plans: Vec<std::sync::OnceLock<ceiling::Plan<'_>>> = services
        .iter()
        .map(|_| std::sync::OnceLock::new())
        .collect();
    let plan_of = |s: usize| {
        let service = &services[s];
        plans[s].get_or_init(|| ceiling::Plan::new(&service.sc, &service.trace, &service.envelope))
    };
    let started = std::time::Instant::now();
    let finished = in_parallel(&tasks, |task| match *task {
        Task::Policy(i) => {
            let kind = policies[i];
            Done::Policy(Box::new(run_policy(kind, scenario, services, false)))
        }
        Task::Ceiling(s, c) => Done::Ceiling(s, plan_of(s).judge(c)),
    })?;
    let mut outcomes = Vec::new();
    let mut parts: Vec<Vec<Vec<u32>>> = services.iter().map(|_| Vec::new()).collect();
    for done in finished {
        match done {
            Done::Policy(o) => outcomes.push(*o),
            Done::Ceiling(s, need) => parts[s].push(need),
        }
    }
    // Only a run without minutes has no chunk (and no plan made).
    let each = parts
        .into_iter()
        .enumerate()
        .map(|(s, parts)| plan_of(s).ceiling(parts))
        .collect();
    let ceiling = ceiling::Ceiling::shared(each, scenario);
    tracing::debug!(
        elapsed_s = started.elapsed().as_secs_f64(),
        "policies and honest ceiling computed"
    );
    Ok((ceiling, outcomes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_scenario_is_valid_and_the_shared_pool_mixes_shapes_and_mixes() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = root.join("data/scenarios");
        let mut read = 0;
        for entry in std::fs::read_dir(&dir).expect("data/scenarios") {
            let path = entry.expect("entry").path();
            let text = std::fs::read_to_string(&path).expect("readable");
            let sc =
                Scenario::from_toml(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            sc.validate()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let traces = service_traces(&sc, Some(&path))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(traces.len(), sc.services.len());
            read += 1;
        }
        assert!(read >= 7, "{read} scenarios");
        let shared = std::fs::read_to_string(dir.join("shared-pool.toml")).expect("readable");
        let sc = Scenario::from_toml(&shared).expect("valid");
        // At least three services of different days and token mixes, one on a trace of its own.
        assert!(sc.services.len() >= 3);
        let shapes: std::collections::BTreeSet<String> = sc
            .services
            .iter()
            .map(|s| format!("{:?}", s.envelope.hourly))
            .collect();
        let mixes: std::collections::BTreeSet<String> = sc
            .services
            .iter()
            .map(|s| format!("{:?} {:?}", s.mix, s.trace))
            .collect();
        assert_eq!(shapes.len(), sc.services.len());
        assert_eq!(mixes.len(), sc.services.len());
    }

    #[test]
    fn threads_change_nothing_every_policy_and_minute_comes_back_in_its_place() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data/traces/azure-llm-2023-conv.csv");
        let trace = Trace::read(&path).expect("the shipped trace reads");
        let mut sc = Scenario::default();
        // Nine hours: three chunks of the ceiling (4 h, 4 h and 1 h) besides the six policies.
        sc.run.days = 9.0 / 24.0;
        assert_eq!(ceiling::Plan::chunks_of(&sc), 3);
        let services = Service::all(&sc, &[&trace]).expect("one service");

        let (ceiling, outcomes) =
            run_in_parallel(&sc, &services, &ScalingPolicy::ALL).expect("runs");

        let alone = &services[0];
        assert_eq!(
            ceiling,
            ceiling::honest_ceiling(&alone.sc, &alone.trace, &alone.envelope)
        );
        assert_eq!(ceiling.need.len(), 9 * 60);
        let policies: Vec<_> = outcomes.iter().map(|o| o.result.policy).collect();
        assert_eq!(policies, ScalingPolicy::ALL);
    }
}
