//! Scaler benchmarks (a plain binary, not timed tests): run with `cargo bench --bench scaler`.
//!
//! Starts the real `nightshift scaler` binary on loopback against an in-process Prometheus
//! stand-in that counts queries, then reports:
//! - the scaler's own work per cached evaluation, called in this process without gRPC (what a
//!   call adds over the transport, with warm caches), and the same over 64 ScaledObjects in turn
//!   with memory touched between calls (with the caches as the server's transport leaves them);
//! - idle RSS of the server;
//! - cached `GetMetrics` round-trip p50/p99 with 1 and 64 concurrent clients, and the server's CPU
//!   time per call;
//! - the same for the stock `grpc.health.v1` `Check` on the same server and connection: the
//!   gRPC transport's floor on this machine, so that the scaler's own share shows;
//! - upstream queries per polling round with 1,000 ScaledObjects, and RSS after that load.
//!
//! The server runs on cores apart from this process (the clients and the Prometheus stand-in)
//! when the machine has two or more ([`pinning`]); each latency line reports the server's CPU per
//! call, and a ratio line compares `GetMetrics` with the health floor measured in the same run.
//! On cores of their own the clients never sleep during the latency runs ([`Awake`]), like the
//! webhook bench's generator: KEDA's operator runs elsewhere, and an answer that finds a client
//! asleep would charge the server's core the interrupt that wakes it. Each latency line
//! counts the interrupts the clients' cores received to wake a thread, per call.
//! The two are timed in alternating phases, `NIGHTSHIFT_BENCH_ROUNDS` (default 3) rounds of
//! each, summed up by the median over the rounds; then once more interleaved in blocks
//! (alternating `GetMetrics` and `Check`: one client 50 calls in a row, 64 clients 10 calls each,
//! all switching together; a few milliseconds to a few tens each, the server's CPU read between
//! blocks), so that a disturbance or a change of the machine's speed meets both alike and the
//! ratios read the calls, not the moment. The server's CPU is the
//! scheduler's nanosecond count (`cpu_time.rs`).
//!
//! `cargo bench --bench scaler -- --only GetMetrics|Check SECONDS` runs instead 64 clients making
//! that one kind of call for that long, and prints the server's process id, the calls made and
//! the server's CPU per call: a steady load of one kind for a profiler recording the server's
//! core (`perf record -C 0`).

#[path = "support/caches.rs"]
mod caches;
#[path = "support/cpu_time.rs"]
mod cpu_time;
#[path = "support/pinning.rs"]
mod pinning;
#[path = "support/scaler_load.rs"]
mod scaler_load;
#[path = "support/stats.rs"]
mod stats;

use pinning::{Awake, Pinning};
use scaler_load::{ScalerProcess, request, start_scaler};
use stats::{env_or, median, percentile};
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::{Query, State},
    http::header::CONTENT_TYPE,
    routing::get,
};
use cpu_time::process_cpu_seconds;
use nightshift::scaler::service::proto::external_scaler_client::ExternalScalerClient;
use tonic::transport::Channel;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// ScaledObjects (and models) in the load phase.
const SCALED_OBJECTS: usize = 1000;
/// Round trips per latency run, shared among the clients (at least 200 per client), so the
/// run stays short on a small machine.
const CALLS_PER_RUN: usize = 10_000;

/// Each client's calls in a latency run of `concurrency` clients ([`CALLS_PER_RUN`] shared
/// among them, at least 200 each).
fn calls_per_client(concurrency: usize) -> usize {
    (CALLS_PER_RUN / concurrency).max(200)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

async fn start_server(
    ttl: &str,
    prom: SocketAddr,
    cores: Option<&str>,
) -> (ScalerProcess, Channel) {
    start_scaler(prom, &["--scaler-cache-ttl", ttl], cores).await
}

async fn fake_prometheus(queries: Arc<AtomicUsize>) -> SocketAddr {
    async fn query(
        State(q): State<Arc<AtomicUsize>>,
        Query(_p): Query<HashMap<String, String>>,
    ) -> ([(axum::http::HeaderName, &'static str); 1], String) {
        q.fetch_add(1, Ordering::SeqCst);
        (
            [(CONTENT_TYPE, "application/json")],
            scaler_load::prometheus_answer(SCALED_OBJECTS),
        )
    }
    let app = Router::new()
        .route("/api/v1/query", get(query))
        .with_state(queries);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// One kind of round trip the latency runs time.
#[derive(Clone)]
enum Rpc {
    /// A `GetMetrics` answered from the scaler's cache (the fake Prometheus's address; each
    /// client asks for its own ScaledObject).
    GetMetrics(SocketAddr),
    /// The stock health service's `Check`: no scaler code, only the gRPC stack.
    HealthCheck,
}

impl Rpc {
    /// The call's name.
    fn name(&self) -> &'static str {
        match self {
            Self::GetMetrics(_) => "GetMetrics",
            Self::HealthCheck => "Check",
        }
    }

    async fn call(&self, channel: &Channel, client: usize) {
        match self {
            Self::GetMetrics(prom) => {
                ExternalScalerClient::new(channel.clone())
                    .get_metrics(request(*prom, client % SCALED_OBJECTS))
                    .await
                    .expect("GetMetrics");
            }
            Self::HealthCheck => {
                HealthClient::new(channel.clone())
                    .check(HealthCheckRequest::default())
                    .await
                    .expect("Check");
            }
        }
    }
}

/// What one latency run measured.
struct Latency {
    p50: Duration,
    p99: Duration,
    /// Server CPU seconds per call.
    cpu_per_call: f64,
}

/// Interrupts per call that woke a thread on the clients' `cores` between two readings of
/// [`pinning::wakeups`], as the latency lines print them (nothing when not pinned).
fn woken(cores: Option<&str>, before: Option<u64>, calls: usize) -> String {
    match cores.and_then(pinning::wakeups).zip(before) {
        Some((after, before)) => format!(
            "; {:.3} interrupts per call to wake the clients",
            (after - before) as f64 / calls as f64
        ),
        None => String::new(),
    }
}

/// `calls` calls of `client` in a row, each one's round trip.
async fn timed(rpc: Rpc, channel: Channel, client: usize, calls: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        rpc.call(&channel, client).await;
        samples.push(started.elapsed());
    }
    samples
}

async fn latency(
    server: &ScalerProcess,
    channel: &Channel,
    rpc: Rpc,
    concurrency: usize,
    clients: Option<&str>,
) -> Latency {
    let label = match rpc {
        Rpc::GetMetrics(_) => "cached GetMetrics",
        Rpc::HealthCheck => "health Check (transport floor)",
    };
    let cpu_before = process_cpu_seconds(server.id());
    let wakeups_before = clients.and_then(pinning::wakeups);
    let mut tasks = Vec::new();
    for client in 0..concurrency {
        // All clients share one HTTP/2 connection, as KEDA's operator shares one connection
        // among the ScaledObjects that name the same scalerAddress and TLS settings.
        let (channel, rpc) = (channel.clone(), rpc.clone());
        tasks.push(tokio::spawn(timed(
            rpc,
            channel,
            client,
            calls_per_client(concurrency),
        )));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("join"));
    }
    let cpu = process_cpu_seconds(server.id()) - cpu_before;
    let woken = woken(clients, wakeups_before, all.len());
    all.sort();
    println!(
        "{label}, {concurrency:>2} concurrent client(s): p50 {:>7.1} µs  p99 {:>7.1} µs  ({} calls; server CPU {:.0} µs per call{woken})",
        percentile(&all, 0.50).as_secs_f64() * 1e6,
        percentile(&all, 0.99).as_secs_f64() * 1e6,
        all.len(),
        cpu / all.len() as f64 * 1e6,
    );
    Latency {
        p50: percentile(&all, 0.50),
        p99: percentile(&all, 0.99),
        cpu_per_call: cpu / all.len() as f64,
    }
}

/// The scaler's own work per cached evaluation: a `Scaler` in this process, the same trigger
/// evaluated over and over (its first call fills the cache), timed without gRPC.
async fn in_process(prom: SocketAddr) {
    use nightshift::{
        scaler::{Options, Scaler, metrics::ScalerMetrics},
        sources::{metrics::SourceMetrics, policy::SourcePolicy},
    };
    // Enough calls for a steady figure in about a tenth of a second.
    const CALLS: u32 = 20_000;
    let options = Options {
        cache_ttl: Duration::from_secs(3600),
        stream_interval: Duration::from_secs(5),
        policy: SourcePolicy::permissive(),
        forecast: Default::default(),
    };
    let scaler = Scaler::new(
        options,
        None,
        SourceMetrics::default(),
        ScalerMetrics::default(),
        tokio_util::sync::CancellationToken::new(),
    )
    .expect("scaler");
    let so = request(prom, 0).scaled_object_ref.expect("ref");
    evaluate(&scaler, &so).await;
    let mut runs = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        for _ in 0..CALLS {
            std::hint::black_box(evaluate(&scaler, &so).await);
        }
        runs.push(started.elapsed().as_secs_f64() / f64::from(CALLS) * 1e6);
    }
    println!(
        "in-process cached evaluation (no gRPC): {:.1} µs per call (median of 3 × {CALLS})",
        median(runs)
    );
    in_process_cold(&scaler, prom).await;
}

/// One cached evaluation of `so`'s trigger by the in-process `scaler`, as a `GetMetrics` asks it.
async fn evaluate(
    scaler: &nightshift::scaler::Scaler,
    so: &nightshift::scaler::service::proto::ScaledObjectRef,
) -> nightshift::scaler::Evaluation {
    let evaluation = scaler.evaluate(&so.namespace, &so.name, &so.scaler_metadata);
    evaluation.await.expect("evaluation")
}

/// The same evaluation as the server makes it: 64 ScaledObjects in turn, as 64 clients call,
/// with memory touched between two calls as the transport's work touches it, so that each
/// evaluation finds what it reads pushed out of the caches. Only the evaluations are timed. The
/// sizes: none (each ScaledObject's state, 64 of them, in the caches), 1 MiB (about a core's
/// second-level cache), 4 MiB (beyond it).
async fn in_process_cold(scaler: &nightshift::scaler::Scaler, prom: SocketAddr) {
    // Rounds of 20 passes over the 64 objects: about a second in all at 4 MiB a call.
    const ROUNDS: usize = 3;
    const PASSES: usize = 20;
    const OBJECTS: usize = 64;
    let objects: Vec<_> = (0..OBJECTS)
        .map(|i| request(prom, i).scaled_object_ref.expect("ref"))
        .collect();
    for so in &objects {
        evaluate(scaler, so).await;
    }
    let mut figures = Vec::new();
    for mib in [0, 1, 4] {
        let mut touched = vec![0u8; mib << 20];
        let mut runs = Vec::new();
        for _ in 0..ROUNDS {
            let mut spent = Duration::ZERO;
            for so in std::iter::repeat_n(&objects, PASSES).flatten() {
                caches::touch(&mut touched);
                let started = Instant::now();
                std::hint::black_box(evaluate(scaler, so).await);
                spent += started.elapsed();
            }
            runs.push(spent.as_secs_f64() / (PASSES * OBJECTS) as f64 * 1e6);
        }
        figures.push(format!("{:.1} µs with {mib} MiB", median(runs)));
    }
    println!(
        "in-process, {OBJECTS} ScaledObjects in turn, memory touched between calls: {} (median of {ROUNDS} × {})",
        figures.join(", "),
        PASSES * OBJECTS
    );
}

/// One client's calls of one kind in a row in the interleaved run: short enough (a few
/// milliseconds) that a change in the machine's speed meets both kinds alike, long enough that
/// reading the server's CPU between blocks (a few `/proc` reads, on the client's core) is not
/// what is measured.
const BLOCK: usize = 50;

/// Each client's calls of one kind in a row when many clients are interleaved: all of them
/// switch kind together, so a block is a queue of one kind only; ten calls each make a block of
/// 640 calls with 64 clients (a few tens of milliseconds), mostly the steady queue rather than
/// its filling at the start and its draining at the end.
const BLOCK_PER_CLIENT: usize = 10;

/// `GetMetrics` and `Check` interleaved in blocks: each kind's sorted latencies and the server
/// CPU seconds its blocks used, and the interrupts per call that woke the clients over both
/// ([`woken`]).
struct Interleaved {
    real: (Vec<Duration>, f64),
    floor: (Vec<Duration>, f64),
    woken: String,
}

/// `concurrency` clients calling `GetMetrics` and `Check` in alternating blocks: one client
/// [`BLOCK`] calls in a row, many clients [`BLOCK_PER_CLIENT`] calls each, started together and
/// all finished before the next block starts. As many calls of each kind as a phase of
/// [`latency`] makes.
async fn interleaved(
    server: &ScalerProcess,
    channel: &Channel,
    prom: SocketAddr,
    concurrency: usize,
    clients: Option<&str>,
) -> Interleaved {
    let per_client = if concurrency == 1 {
        BLOCK
    } else {
        BLOCK_PER_CLIENT
    };
    let calls = calls_per_client(concurrency) * concurrency;
    let wakeups_before = clients.and_then(pinning::wakeups);
    let mut runs = Interleaved {
        real: (Vec::with_capacity(calls), 0.0),
        floor: (Vec::with_capacity(calls), 0.0),
        woken: String::new(),
    };
    for block in 0..2 * calls / (per_client * concurrency) {
        let (rpc, (samples, cpu)) = if block % 2 == 0 {
            (Rpc::GetMetrics(prom), &mut runs.real)
        } else {
            (Rpc::HealthCheck, &mut runs.floor)
        };
        let cpu_before = process_cpu_seconds(server.id());
        let tasks: Vec<_> = (0..concurrency)
            .map(|client| tokio::spawn(timed(rpc.clone(), channel.clone(), client, per_client)))
            .collect();
        for t in tasks {
            samples.extend(t.await.expect("join"));
        }
        *cpu += process_cpu_seconds(server.id()) - cpu_before;
    }
    runs.woken = woken(clients, wakeups_before, 2 * calls);
    runs.real.0.sort();
    runs.floor.0.sort();
    runs
}

/// Prints the interleaved run's figures and ratios.
fn report_interleaved(concurrency: usize, runs: &Interleaved) {
    let Interleaved { real, floor, woken } = runs;
    let at = |s: &[Duration], p| percentile(s, p).as_secs_f64();
    let per_call = |(s, cpu): &(Vec<Duration>, f64)| cpu / s.len() as f64 * 1e6;
    let block = if concurrency == 1 {
        format!("blocks of {BLOCK}, 1 client")
    } else {
        format!("blocks of {BLOCK_PER_CLIENT} per client, {concurrency} clients")
    };
    println!(
        "  interleaved in {block}: GetMetrics p50 {:.1} µs p99 {:.1} µs, CPU {:.0} µs per call; Check p50 {:.1} µs p99 {:.1} µs, CPU {:.0} µs per call: p50 {:.2}×, p99 {:.2}× (target ≤ 1.25×), CPU floor + {:.0} µs (target ≤ + 10 µs){woken}",
        at(&real.0, 0.50) * 1e6,
        at(&real.0, 0.99) * 1e6,
        per_call(real),
        at(&floor.0, 0.50) * 1e6,
        at(&floor.0, 0.99) * 1e6,
        per_call(floor),
        at(&real.0, 0.50) / at(&floor.0, 0.50),
        at(&real.0, 0.99) / at(&floor.0, 0.99),
        per_call(real) - per_call(floor),
    );
}

/// One `GetMetrics` for each of the 64 clients' ScaledObjects, so that every later call is
/// answered from the scaler's cache.
async fn warm(channel: &Channel, prom: SocketAddr) {
    for i in 0..64 {
        ExternalScalerClient::new(channel.clone())
            .get_metrics(request(prom, i))
            .await
            .expect("warm");
    }
}

/// What `--only KIND SECONDS` asks for (after `--bench`): calls of one kind only, from 64
/// clients for that long, so that a profiler recording the server's cores sees one kind
/// (docs/performance.md, "How to re-measure").
struct Only {
    get_metrics: bool,
    seconds: u64,
}

impl Only {
    /// `--only` and its two values in `args`; `None` without it, an error when they are not
    /// `GetMetrics` or `Check` and a number of seconds.
    fn from_args(args: &[String]) -> Option<Result<Self, String>> {
        let at = args.iter().position(|a| a == "--only")?;
        let (kind, seconds) = (args.get(at + 1), args.get(at + 2));
        let seconds = seconds.and_then(|s| s.parse().ok()).filter(|&s| s > 0);
        Some(match (kind.map(String::as_str), seconds) {
            (Some("GetMetrics"), Some(seconds)) => Ok(Only {
                get_metrics: true,
                seconds,
            }),
            (Some("Check"), Some(seconds)) => Ok(Only {
                get_metrics: false,
                seconds,
            }),
            _ => Err("usage: --only GetMetrics|Check SECONDS".to_string()),
        })
    }
}

/// 64 clients making one kind of call for `only.seconds`: the calls made, the server's CPU per
/// call, and its process id (for a profiler attached to it).
async fn only(pinning: Pinning, only: Only) {
    nightshift::install_crypto_provider();
    println!("{}", pinning.describe());
    let prom = fake_prometheus(Arc::new(AtomicUsize::new(0))).await;
    let (server, channel) = start_server("1h", prom, pinning.server.as_deref()).await;
    warm(&channel, prom).await;
    let rpc = if only.get_metrics {
        Rpc::GetMetrics(prom)
    } else {
        Rpc::HealthCheck
    };
    let clients = 64;
    println!(
        "scaler pid {}: {clients} clients, {} only, {} s",
        server.id(),
        rpc.name(),
        only.seconds
    );
    let _awake = Awake::start(pinning.generator.is_some());
    let cpu_before = process_cpu_seconds(server.id());
    let deadline = Instant::now() + Duration::from_secs(only.seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let (channel, rpc) = (channel.clone(), rpc.clone());
            tokio::spawn(async move {
                let mut calls = 0_u64;
                while Instant::now() < deadline {
                    rpc.call(&channel, client).await;
                    calls += 1;
                }
                calls
            })
        })
        .collect();
    let mut calls = 0;
    for t in tasks {
        calls += t.await.expect("join");
    }
    let cpu = process_cpu_seconds(server.id()) - cpu_before;
    println!(
        "{calls} calls ({:.0} per second), server CPU {:.1} µs per call",
        calls as f64 / only.seconds as f64,
        cpu / calls as f64 * 1e6
    );
}

async fn run(pinning: Pinning) {
    nightshift::install_crypto_provider();
    println!("{}", pinning.describe());
    let server_cores = pinning.server.as_deref();
    let queries = Arc::new(AtomicUsize::new(0));
    let prom = fake_prometheus(queries.clone()).await;
    in_process(prom).await;

    // Latency with a cache that never expires during the run.
    let (server, channel) = start_server("1h", prom, server_cores).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("idle RSS: {:.1} MiB", rss_kib(server.id()) as f64 / 1024.0);
    warm(&channel, prom).await;
    let rounds: usize = env_or("NIGHTSHIFT_BENCH_ROUNDS", 3).max(1);
    let clients = pinning.generator.as_deref();
    let awake = Awake::start(clients.is_some());
    for concurrency in [1, 64] {
        // Alternating phases, so that a passing disturbance shows as a gap between rounds.
        let (mut p99_ratios, mut cpu_over) = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            let real = latency(
                &server,
                &channel,
                Rpc::GetMetrics(prom),
                concurrency,
                clients,
            )
            .await;
            let floor = latency(&server, &channel, Rpc::HealthCheck, concurrency, clients).await;
            let p99_ratio = real.p99.as_secs_f64() / floor.p99.as_secs_f64();
            let over = (real.cpu_per_call - floor.cpu_per_call) * 1e6;
            println!(
                "  ratios, {concurrency} client(s), round {round}: p50 {:.2}×, p99 {p99_ratio:.2}× (target ≤ 1.25×); CPU per call {:.0} µs vs floor {:.0} µs = floor + {over:.0} µs (target ≤ + 10 µs)",
                real.p50.as_secs_f64() / floor.p50.as_secs_f64(),
                real.cpu_per_call * 1e6,
                floor.cpu_per_call * 1e6,
            );
            p99_ratios.push(p99_ratio);
            cpu_over.push(over);
        }
        let runs = interleaved(&server, &channel, prom, concurrency, clients).await;
        report_interleaved(concurrency, &runs);
        println!(
            "  median of {rounds} round(s), {concurrency} client(s): p99 {:.2}×, CPU per call floor + {:.0} µs",
            median(p99_ratios),
            median(cpu_over),
        );
    }
    drop(awake);
    println!(
        "RSS after latency runs: {:.1} MiB",
        rss_kib(server.id()) as f64 / 1024.0
    );
    drop(server);

    // 1,000 ScaledObjects, each polling GetMetrics then IsActive like KEDA, for 3 rounds
    // spaced by the default 1 s cache TTL.
    let (server, channel) = start_server("1s", prom, server_cores).await;
    let client = ExternalScalerClient::new(channel);
    let rounds = 3;
    queries.store(0, Ordering::SeqCst);
    for _ in 0..rounds {
        let round_started = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..SCALED_OBJECTS {
            let mut c = client.clone();
            let req = request(prom, i);
            tasks.push(tokio::spawn(async move {
                let so = req.scaled_object_ref.clone().expect("ref");
                c.get_metrics(req).await.expect("GetMetrics");
                c.is_active(so).await.expect("IsActive");
            }));
        }
        for t in tasks {
            t.await.expect("join");
        }
        let left = Duration::from_millis(1100).saturating_sub(round_started.elapsed());
        tokio::time::sleep(left).await;
    }
    println!(
        "{SCALED_OBJECTS} ScaledObjects × {rounds} polling rounds (GetMetrics + IsActive): {} upstream queries = {:.1} per round (metric families in use: 2)",
        queries.load(Ordering::SeqCst),
        queries.load(Ordering::SeqCst) as f64 / rounds as f64
    );
    println!(
        "RSS with {SCALED_OBJECTS} ScaledObjects: {:.1} MiB",
        rss_kib(server.id()) as f64 / 1024.0
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it,
    // and a benchmark is not a test: do nothing then.
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        println!("scaler benchmark: run it with `cargo bench --bench scaler`");
        return;
    }
    let only_one = match Only::from_args(&args).transpose() {
        Ok(only_one) => only_one,
        Err(usage) => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let pinning = Pinning::split();
    // Before any thread starts: this process (clients, Prometheus stand-in) keeps to the
    // generator's cores; the scaler is started on the server's.
    Pinning::pin_self(pinning.generator.as_deref());
    // One thread: the clients, and the task that keeps them awake ([`Awake`]), share it, so
    // that no thread of theirs waits for the core while another spins.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match only_one {
        Some(one) => runtime.block_on(only(pinning, one)),
        None => runtime.block_on(run(pinning)),
    }
}
