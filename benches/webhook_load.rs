//! HTTPS load on the webhook over loopback with keep-alive connections, beside its transport floor.
//!
//! `cargo bench --bench webhook_load` starts two HTTPS servers in this process, each on a runtime
//! of its own, on free loopback ports: the webhook (fixed cluster view, realistic 10 KB research
//! pod, the binary's allocator and logging) and the transport floor (the same server code, TLS
//! configuration, HTTP stack and runtime, whose `/mutate` reads the body and answers the
//! webhook's own answer to it, reviewed once beforehand: the same bytes each way, and no
//! review). The load generator runs in a process of its own (this executable with
//! `--generator`), pinned to cores apart from the servers' ([`pinning`]). Then:
//! 1. a fixed rate (`NIGHTSHIFT_BENCH_RATE`, default 2000 reviews/s) over 100 keep-alive
//!    connections for `NIGHTSHIFT_BENCH_SECS` (default 10) seconds, on the webhook and on the
//!    floor, each reported with p50/p90/p99/max, the server threads' CPU per request and how
//!    often they ran out of work and slept (per request);
//! 2. saturation of each, for the maximum sustained rate and the server's CPU per request there,
//!    in `NIGHTSHIFT_BENCH_SAT_PAIRS` (default 6) pairs of `NIGHTSHIFT_BENCH_SAT_SECS` (default
//!    3) seconds each, by each [`Saturator`], pinned like the generator: the bench's generator
//!    (HTTP/1.1, 100 connections, as the API server calls webhooks; the target is measured with
//!    it) and, for comparison, the load-testing tools installed, whose threads sleep while they
//!    wait: `wrk -c100` (HTTP/1.1) and `h2load -c1 -m100` (HTTP/2, 100 streams on one
//!    connection);
//! 3. the ratios of webhook to floor, measured in this one run.
//!
//! Beside the webhook's CPU per request, each run reports the review's own mean time in the
//! server, read from the webhook's `webhook_admission_duration_seconds` histogram before and
//! after the run: what the review costs among the TLS, HTTP and kernel work around it, where `cargo bench --bench
//! webhook` times it in a hot loop.
//!
//! When the generator has cores of its own, each run also counts the interrupts those cores
//! received to wake a sleeping thread, per request ([`pinning::wakeups`]): none for the bench's
//! generator, which never sleeps; what a sleeping generator makes the server pay for otherwise.
//!
//! `NIGHTSHIFT_BENCH_ROUNDS` (default 1) repeats phase 1. Rounds and pairs alternate which of
//! the two goes first (webhook, floor; floor, webhook; …), so that a change in the machine's
//! speed during the run meets both alike. `NIGHTSHIFT_BENCH_FLOOR_WORK_US` (default 0) makes the
//! floor compute that long per request before answering, touching no memory: set to the
//! review's own time in the server, it tells what any work of that length costs the transport
//! from what the review's memory footprint adds.
//!
//! Under `cargo test` (no `--bench` argument) it only checks that a few reviews succeed.

/// The allocator the `nightshift` binary ships with (`src/main.rs`), so that the in-process
/// server is measured as it runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "support/busy.rs"]
mod busy;
#[path = "support/cpu_time.rs"]
mod cpu_time;
#[path = "support/generator.rs"]
mod generator;
#[path = "support/pinning.rs"]
mod pinning;
#[path = "support/pod.rs"]
mod pod;
#[path = "support/stats.rs"]
mod stats;

use pinning::Pinning;
use stats::{env_or, median};
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use nightshift::{
    test_support,
    webhook::{
        certs,
        review::{Answer, Metrics, Reviewer},
        server,
    },
};
use tokio_util::sync::CancellationToken;

/// Connections used by every load phase (the target scenario: 100 concurrent clients).
const CONNECTIONS: usize = 100;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--generator") {
        generator::main(&args[at + 1..]);
        return;
    }
    let full = args.iter().any(|a| a == "--bench");
    let pinning = if full {
        Pinning::split()
    } else {
        Pinning {
            server: None,
            generator: None,
            server_cores: 1,
            generator_cores: 1,
        }
    };
    // Before any thread starts: every thread of this process inherits the server's cores.
    Pinning::pin_self(pinning.server.as_deref());
    shipped_logging();
    nightshift::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, tls) = test_support::certs::generate(dir.path());
    let reviewer = test_support::webhook::research_reviewer();
    let body = serde_json::to_vec(&pod::admission_review(pod::realistic_pod())).expect("body");
    // Reviewed by a copy with metrics of its own, so that the webhook's counters start at zero.
    let answer = canned_answer(
        &Reviewer {
            metrics: Metrics::default(),
            ..reviewer.clone()
        },
        &body,
    );
    let _ = REVIEWS.set(reviewer.metrics.clone());
    let router = server::router(
        reviewer,
        3 << 20,
        nightshift::runtime::admin::Readiness::default(),
    );
    let webhook = Server::start(router, tls.clone(), pinning.server_cores);
    let ca = dir.path().join(certs::CA_CERT);
    let body_file = dir.path().join("review.json");
    std::fs::write(&body_file, &body).expect("body file");

    if !full {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let uri: hyper::Uri = webhook.url.parse().expect("url");
            let mut c = generator::http1_connection(&uri, &std::fs::read(&ca).expect("ca")).await;
            let body = axum::body::Bytes::from(body.clone());
            for _ in 0..5 {
                let (status, answer) = generator::post(&mut c, &uri, &body).await.expect("answer");
                assert!(status.is_success(), "{status}");
                let json = answer.to_bytes();
                assert!(json.starts_with(b"{\"apiVersion\":\"admission.k8s.io/v1\""));
            }
        });
        webhook.stop();
        return;
    }

    let floor_work = Duration::from_micros(env_or("NIGHTSHIFT_BENCH_FLOOR_WORK_US", 0));
    let floor = Server::start(
        transport_floor_router(answer, floor_work),
        tls,
        pinning.server_cores,
    );
    let rate: f64 = env_or("NIGHTSHIFT_BENCH_RATE", 2000.0);
    let secs: u64 = env_or("NIGHTSHIFT_BENCH_SECS", 10);
    let rounds: usize = env_or("NIGHTSHIFT_BENCH_ROUNDS", 1);
    println!("{}", pinning.describe());
    if !floor_work.is_zero() {
        println!(
            "the floor computes {} µs per request before answering (registers only, no memory)",
            floor_work.as_micros()
        );
    }
    println!(
        "review body: {} bytes; server runtime: {} worker thread(s)",
        body.len(),
        pinning.server_cores
    );
    let load = FixedRate {
        rate,
        secs,
        ca: &ca,
        body: &body_file,
        pinning: &pinning,
    };
    let mut pairs = Vec::new();
    for round in 0..rounds {
        let (review, mut floor_run) =
            in_turn(round, || load.run(&webhook.url), || load.run(&floor.url));
        // As for saturation: the floor reviews nothing.
        floor_run.server.review_mean = None;
        println!(
            "webhook, fixed {rate:.0}/s, {CONNECTIONS} keep-alive connections, {secs} s: {review}"
        );
        println!("floor (same HTTPS server, no review), same load: {floor_run}");
        pairs.push((review, floor_run));
    }

    let saturators = Saturator::installed(dir.path(), &body, &body_file, &ca);
    let saturation: Vec<_> = saturators
        .iter()
        .map(|s| saturate_in_pairs(s, &webhook.url, &floor.url, &pinning))
        .collect();

    for (i, (review, floor_run)) in pairs.iter().enumerate() {
        println!(
            "ratios, round {}: p50 {:.2}×, p99 {:.2}× (target ≤ 2×); CPU per request {:.0} µs vs floor {:.0} µs = {:.2}× (target ≤ 100 µs)",
            i + 1,
            review.report.p50.as_secs_f64() / floor_run.report.p50.as_secs_f64().max(1e-9),
            review.report.p99.as_secs_f64() / floor_run.report.p99.as_secs_f64().max(1e-9),
            review.server.cpu_per_request * 1e6,
            floor_run.server.cpu_per_request * 1e6,
            review.server.cpu_per_request / floor_run.server.cpu_per_request.max(1e-9),
        );
    }
    for (saturator, runs) in saturators.iter().zip(&saturation) {
        report_saturation(saturator, runs);
    }
    floor.stop();
    webhook.stop();
}

/// Saturates the webhook and the floor with `saturator` in `NIGHTSHIFT_BENCH_SAT_PAIRS` pairs of
/// `NIGHTSHIFT_BENCH_SAT_SECS` seconds each, alternating which goes first, and prints each pair.
fn saturate_in_pairs(
    saturator: &Saturator,
    webhook: &str,
    floor: &str,
    pinning: &Pinning,
) -> Vec<(Saturation, Saturation)> {
    let pairs: usize = env_or("NIGHTSHIFT_BENCH_SAT_PAIRS", 6);
    let secs: u64 = env_or("NIGHTSHIFT_BENCH_SAT_SECS", 3);
    let saturate = |url: &str| Saturation::run(saturator, url, secs, pinning);
    (0..pairs.max(1))
        .map(|pair| {
            let (review, mut floor_sat) = in_turn(pair, || saturate(webhook), || saturate(floor));
            // The floor reviews nothing: reviews that end during its run are the webhook's last,
            // answered after its generator stopped counting.
            floor_sat.server.review_mean = None;
            println!(
                "saturation, pair {} ({}, {secs} s each): webhook {review}; floor {floor_sat}",
                pair + 1,
                saturator.shape(),
            );
            (review, floor_sat)
        })
        .collect()
}

/// The median share of the floor's rate over the pairs, each pair's share, and the medians of
/// the CPU per request of each side (and of the interrupts that woke the generator, when
/// counted).
fn report_saturation(saturator: &Saturator, runs: &[(Saturation, Saturation)]) {
    let shares: Vec<f64> = runs
        .iter()
        .map(|(review, floor_sat)| review.rate / floor_sat.rate.max(1e-9) * 100.0)
        .collect();
    let listed: Vec<String> = shares.iter().map(|s| format!("{s:.0} %")).collect();
    let cpu = |pick: fn(&(Saturation, Saturation)) -> &Saturation| {
        median(
            runs.iter()
                .map(|r| pick(r).server.cpu_per_request * 1e6)
                .collect(),
        )
    };
    let review = median(
        runs.iter()
            .filter_map(|r| r.0.server.review_mean)
            .map(|m| m * 1e6)
            .collect(),
    );
    let wakeups = |pick: fn(&(Saturation, Saturation)) -> &Saturation| {
        let counted: Vec<f64> = runs
            .iter()
            .filter_map(|r| pick(r).server.wakeups_per_request)
            .collect();
        (!counted.is_empty()).then(|| median(counted))
    };
    let woken = match (wakeups(|r| &r.0), wakeups(|r| &r.1)) {
        (Some(w), Some(f)) => {
            format!("; interrupts to wake the generator per request: webhook {w:.3}, floor {f:.3}")
        }
        _ => String::new(),
    };
    let target = if saturator.is_target() {
        "target ≥ 50 %"
    } else {
        "for comparison: a generator that sleeps, see docs/performance.md"
    };
    println!(
        "ratio, saturation ({}): median {:.0} % of the floor's rate ({target}), pairs {}; server CPU per request, medians: webhook {:.0} µs (the review itself {review:.0} µs), floor {:.0} µs{woken}",
        saturator.shape(),
        median(shares),
        listed.join(", "),
        cpu(|r| &r.0),
        cpu(|r| &r.1),
    );
}

/// Runs `review` and `floor`, the review first in even turns and the floor first in odd ones,
/// and returns their results in that order.
fn in_turn<T>(turn: usize, review: impl FnOnce() -> T, floor: impl FnOnce() -> T) -> (T, T) {
    if turn.is_multiple_of(2) {
        let r = review();
        (r, floor())
    } else {
        let f = floor();
        (review(), f)
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

/// The webhook's HTTPS server on a runtime of its own, as it has its own process in a cluster.
struct Server {
    url: String,
    runtime: tokio::runtime::Runtime,
    task: tokio::task::JoinHandle<Result<(), nightshift::webhook::Error>>,
    shutdown: CancellationToken,
}

/// Name of the server runtimes' threads, by which their CPU time is found in `/proc`.
const SERVER_THREAD: &str = "webhook-bench";

impl Server {
    fn start(
        router: axum::Router,
        tls: Arc<nightshift::runtime::tls::ServerTls>,
        workers: usize,
    ) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .enable_all()
            .thread_name(SERVER_THREAD)
            .build()
            .expect("server runtime");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        let task = runtime.spawn({
            let shutdown = shutdown.clone();
            async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                server::serve(listener, tls, router, server::Limits::default(), shutdown).await
            }
        });
        Self {
            url: format!("https://127.0.0.1:{}/mutate", addr.port()),
            runtime,
            task,
            shutdown,
        }
    }

    fn stop(self) {
        self.shutdown.cancel();
        let _ = self.runtime.block_on(self.task);
        self.runtime.shutdown_background();
    }
}

/// The binary's logging as it ships (`NIGHTSHIFT_LOG`, default `info`, to stderr), so that what
/// a review logs is measured with it.
fn shipped_logging() {
    use clap::Parser;

    #[derive(Parser)]
    struct Logging {
        #[command(flatten)]
        log: nightshift::runtime::telemetry::LogArgs,
    }
    Logging::parse_from(["webhook_load"])
        .log
        .init()
        .expect("logging");
}

/// The webhook's answer to `body`, reviewed once in this process: what the floor answers.
fn canned_answer(reviewer: &Reviewer, body: &[u8]) -> axum::body::Bytes {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    match runtime.block_on(reviewer.review(body)) {
        Answer::Review(json) => json.into(),
        Answer::BadRequest(message) => panic!("the bench's review is refused: {message}"),
    }
}

/// An HTTPS endpoint doing no review: reads the body and answers `answer`, the webhook's own
/// answer to the bench's review, so that both move the same bytes each way and differ only by
/// the review (parse, decision, answer encoding).
///
/// With a non-zero `work` (`NIGHTSHIFT_BENCH_FLOOR_WORK_US`), it first spins that long on the
/// clock: work that stands for a review of that cost but touches no memory, so that the webhook
/// beside it shows what the review costs beyond its own time (the caches it leaves the
/// transport) apart from what any work of that length costs (a generator that now waits).
fn transport_floor_router(answer: axum::body::Bytes, work: Duration) -> axum::Router {
    axum::Router::new().route(
        "/mutate",
        axum::routing::post(move |body: axum::body::Bytes| {
            let answer = answer.clone();
            async move {
                // Read, as the review reads it, so that the body is not dropped unseen.
                std::hint::black_box(&body);
                // Only when asked: the default floor reads no clock, so that it stays the bare
                // transport it is measured as.
                if !work.is_zero() {
                    busy::spin(work);
                }
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    answer,
                )
            }
        }),
    )
}

/// What this process's threads named `SERVER_THREAD` have used so far.
#[derive(Clone, Copy, Default)]
struct ServerUsage {
    /// CPU seconds (user + system).
    cpu: f64,
    /// Times a server thread found no work and slept ([`cpu_time::sleeps`]).
    sleeps: u64,
    /// The webhook's reviews so far and their summed time, from its own histogram.
    reviews: u64,
    review_seconds: f64,
    /// Interrupts the generator's cores received to wake a thread ([`pinning::wakeups`]).
    wakeups: Option<u64>,
}

/// The webhook's metrics, read around each run for the review's own time in the server.
static REVIEWS: std::sync::OnceLock<Metrics> = std::sync::OnceLock::new();

/// How many reviews the webhook timed, and their time in seconds.
fn reviewed() -> (u64, f64) {
    REVIEWS
        .get()
        .map(Metrics::timed)
        .map_or((0, 0.0), |t| (t.reviews, t.seconds))
}

impl ServerUsage {
    /// Use so far, with the interrupts to the generator's `cores` when it has its own.
    fn now(generator_cores: Option<&str>) -> Self {
        let (reviews, review_seconds) = reviewed();
        let start = Self {
            reviews,
            review_seconds,
            wakeups: generator_cores.and_then(pinning::wakeups),
            ..Self::default()
        };
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return start;
        };
        tasks
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim_end().starts_with(SERVER_THREAD))
            })
            .fold(start, |sum, t| Self {
                cpu: sum.cpu + cpu_time::cpu_seconds(&t.path()),
                sleeps: sum.sleeps + cpu_time::sleeps(&t.path()),
                ..sum
            })
    }

    /// What was used since `before`.
    fn since(self, before: Self) -> Self {
        Self {
            cpu: self.cpu - before.cpu,
            sleeps: self.sleeps.saturating_sub(before.sleeps),
            reviews: self.reviews.saturating_sub(before.reviews),
            review_seconds: self.review_seconds - before.review_seconds,
            wakeups: self
                .wakeups
                .zip(before.wakeups)
                .map(|(now, then)| now.saturating_sub(then)),
        }
    }

    /// The review's mean time in the server over these reviews; `None` when none ended.
    fn review_mean(&self) -> Option<f64> {
        (self.reviews > 0).then(|| self.review_seconds / self.reviews as f64)
    }
}

/// `; the review itself N µs of it` when the run reviewed, else nothing.
fn review_share(mean: Option<f64>) -> String {
    mean.map(|m| format!("; the review itself {:.0} µs of it (mean)", m * 1e6))
        .unwrap_or_default()
}

/// A fixed request rate spread over `CONNECTIONS` keep-alive connections, sent by the
/// [`generator`] process on the generator's cores.
struct FixedRate<'a> {
    rate: f64,
    secs: u64,
    ca: &'a Path,
    body: &'a Path,
    pinning: &'a Pinning,
}

/// What one fixed-rate run measured.
struct Summary {
    report: generator::Report,
    server: ServerShare,
}

/// What the server spent on a run's requests.
struct ServerShare {
    /// Server threads' CPU seconds per answered request.
    cpu_per_request: f64,
    /// Server threads' CPU as a share of one core.
    cpu_share: f64,
    /// Times the server threads slept, per answered request.
    sleeps_per_request: f64,
    /// Interrupts sent to the generator's cores to wake it, per answered request
    /// ([`pinning::wakeups`]); `None` when the generator is not on cores of its own.
    wakeups_per_request: Option<f64>,
    /// The review's mean time in the server ([`ServerUsage::review_mean`]).
    review_mean: Option<f64>,
}

impl ServerShare {
    fn new(used: &ServerUsage, requests: f64, elapsed: f64) -> Self {
        let requests = requests.max(1.0);
        Self {
            cpu_per_request: used.cpu / requests,
            cpu_share: used.cpu / elapsed,
            sleeps_per_request: used.sleeps as f64 / requests,
            wakeups_per_request: used.wakeups.map(|w| w as f64 / requests),
            review_mean: used.review_mean(),
        }
    }
}

impl std::fmt::Display for ServerShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "server threads {:.0} % of one core ({:.0} µs CPU and {:.3} sleeps per request{}",
            self.cpu_share * 100.0,
            self.cpu_per_request * 1e6,
            self.sleeps_per_request,
            review_share(self.review_mean),
        )?;
        if let Some(w) = self.wakeups_per_request {
            write!(f, "; {w:.3} interrupts per request to wake the generator")?;
        }
        f.write_str(")")
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = &self.report;
        write!(
            f,
            "{} requests ({:.0}/s achieved), errors {}, p50 {:?}, p90 {:?}, p99 {:?}, max {:?}; {}",
            r.requests, r.rate, r.errors, r.p50, r.p90, r.p99, r.max, self.server,
        )
    }
}

impl FixedRate<'_> {
    /// Runs the load against `url` in a generator process and summarises latency, errors and
    /// the server's CPU use over the same interval.
    fn run(&self, url: &str) -> Summary {
        let load = generator::Load {
            rate: Some(self.rate),
            secs: self.secs,
            threads: self.pinning.generator_cores,
        };
        let (report, server) = measured(self.pinning, url, self.ca, self.body, load);
        Summary { report, server }
    }
}

/// Runs the [`generator`] with `load` on `url`, and what the server spent meanwhile. The
/// generator connects first: the handshakes are not counted.
fn measured(
    pinning: &Pinning,
    url: &str,
    ca: &Path,
    body: &Path,
    load: generator::Load,
) -> (generator::Report, ServerShare) {
    let cores = pinning.generator.as_deref();
    let started_generator = generator::Generator::spawn(cores, url, ca, body, load);
    with_server_share(cores, || {
        let report = started_generator.run();
        (report, report.requests as f64)
    })
}

/// Runs `load`, which returns what it measured and the requests answered, and what the server
/// spent meanwhile (with the interrupts to the generator's `cores`).
fn with_server_share<T>(cores: Option<&str>, load: impl FnOnce() -> (T, f64)) -> (T, ServerShare) {
    let before = ServerUsage::now(cores);
    let started = Instant::now();
    let (measured, requests) = load();
    let elapsed = started.elapsed().as_secs_f64();
    let used = ServerUsage::now(cores).since(before);
    (measured, ServerShare::new(&used, requests, elapsed))
}

/// A load generator that keeps 100 requests in flight, each sent again as soon as it is answered.
enum Saturator {
    /// The bench's own [`generator`]: HTTP/1.1 over `CONNECTIONS` keep-alive connections, one
    /// request in flight on each, as the API server calls a webhook (it offers only HTTP/1.1,
    /// and opens a connection per review in flight), from threads that never sleep on cores of
    /// their own. The saturation target is measured with it.
    Generator { ca: PathBuf, body: PathBuf },
    /// A load-testing tool, for comparison: its threads sleep when they wait for answers.
    Tool(Tool),
}

/// The load-testing tools the bench runs when they are installed.
enum Tool {
    /// `wrk`: HTTP/1.1 over `CONNECTIONS` keep-alive connections, one request in flight on each.
    Wrk { bin: PathBuf, script: PathBuf },
    /// `h2load` (nghttp2): HTTP/2, `CONNECTIONS` concurrent streams on one connection, for the
    /// clients that speak it (the webhook allows 100 streams per connection).
    H2load { bin: PathBuf, body: PathBuf },
}

impl Saturator {
    /// The bench's generator, then the tools installed, each set up to send `body` (also
    /// written at `body_file`) trusting the CA at `ca`.
    fn installed(dir: &Path, body: &[u8], body_file: &Path, ca: &Path) -> Vec<Self> {
        let mut found = vec![Self::Generator {
            ca: ca.to_path_buf(),
            body: body_file.to_path_buf(),
        }];
        match which("wrk") {
            Some(bin) => {
                let script = dir.join("review.lua");
                let body = String::from_utf8_lossy(body);
                std::fs::write(
                    &script,
                    format!(
                        "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = [==[{body}]==]\n"
                    ),
                )
                .expect("script");
                found.push(Self::Tool(Tool::Wrk { bin, script }));
            }
            None => println!("wrk not installed: no comparison with wrk (apt-get install wrk)"),
        }
        match which("h2load") {
            Some(bin) => found.push(Self::Tool(Tool::H2load {
                bin,
                body: body_file.to_path_buf(),
            })),
            None => println!(
                "h2load not installed: no HTTP/2 saturation (apt-get install nghttp2-client)"
            ),
        }
        found
    }

    fn shape(&self) -> String {
        match self {
            Self::Generator { .. } => {
                format!("the bench's generator, HTTP/1.1, {CONNECTIONS} connections")
            }
            Self::Tool(Tool::Wrk { .. }) => format!("wrk, HTTP/1.1, {CONNECTIONS} connections"),
            Self::Tool(Tool::H2load { .. }) => {
                format!("h2load, HTTP/2, {CONNECTIONS} streams on 1 connection")
            }
        }
    }

    /// Whether the saturation target is measured with this generator.
    fn is_target(&self) -> bool {
        matches!(self, Self::Generator { .. })
    }
}

impl Tool {
    /// The command that loads `url` for `secs` seconds, pinned like the generator, with one
    /// thread per generator core.
    fn command(&self, url: &str, secs: u64, pinning: &Pinning) -> std::process::Command {
        let threads = format!("-t{}", pinning.generator_cores.max(1));
        match self {
            Self::Wrk { bin, script } => {
                let mut c = Pinning::command(pinning.generator.as_deref(), bin);
                c.args([&threads, &format!("-c{CONNECTIONS}"), &format!("-d{secs}s")])
                    .args(["--latency", "-s"])
                    .arg(script)
                    .arg(url);
                c
            }
            Self::H2load { bin, body } => {
                let mut c = Pinning::command(pinning.generator.as_deref(), bin);
                // One thread: the one connection is served by one thread whatever `-t` says.
                c.args([
                    "-t1",
                    "-c1",
                    &format!("-m{CONNECTIONS}"),
                    &format!("-D{secs}"),
                ])
                .args(["-H", "content-type: application/json", "-d"])
                .arg(body)
                .arg(url);
                c
            }
        }
    }

    /// Requests answered, their rate, and a latency summary, from the generator's report.
    fn read(&self, report: &str) -> (f64, f64, String) {
        let line = |needle: &str| {
            report
                .lines()
                .map(str::trim)
                .find(|l| l.contains(needle))
                .unwrap_or_default()
        };
        let number = |text: &str, before: &str| -> f64 {
            text.split(before)
                .next()
                .and_then(|head| head.split([' ', ',']).rfind(|w| !w.is_empty()))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0.0)
        };
        match self {
            Self::Wrk { .. } => {
                let field = |prefix: &str| {
                    report
                        .lines()
                        .map(str::trim)
                        .find_map(|l| l.strip_prefix(prefix))
                        .map(|v| v.trim().to_string())
                        .unwrap_or_default()
                };
                // "N requests in 10.00s, ..." counts what the server answered.
                let requests = number(line(" requests in "), " requests in ");
                let rate = field("Requests/sec:").parse().unwrap_or(0.0);
                let latency = format!("p50 {}, p99 {}", field("50%"), field("99%"));
                (requests, rate, latency)
            }
            Self::H2load { .. } => {
                // "requests: N total, N started, N done, N succeeded, N failed, ..."
                let counts = line("requests:");
                let requests = number(counts, " succeeded");
                let failed = number(counts, " failed");
                let rate = number(line("req/s"), " req/s");
                // "time for request:  min  max  mean  sd  +/- sd"
                let times: Vec<&str> = line("time for request:")
                    .trim_start_matches("time for request:")
                    .split_whitespace()
                    .collect();
                let latency = match times[..] {
                    [_, max, mean, ..] => format!("mean {mean}, max {max}, {failed} failed"),
                    _ => format!("{failed} failed"),
                };
                (requests, rate, latency)
            }
        }
    }
}

/// What a saturating generator measured, with the server's CPU over the same interval.
struct Saturation {
    rate: f64,
    latency: String,
    server: ServerShare,
}

impl std::fmt::Display for Saturation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.0} requests/s, {}; {}",
            self.rate, self.latency, self.server
        )
    }
}

impl Saturation {
    /// `saturator` on `url` for `secs` seconds.
    fn run(saturator: &Saturator, url: &str, secs: u64, pinning: &Pinning) -> Self {
        match saturator {
            Saturator::Generator { ca, body } => {
                let load = generator::Load {
                    rate: None,
                    secs,
                    threads: pinning.generator_cores,
                };
                let (report, server) = measured(pinning, url, ca, body, load);
                Self {
                    rate: report.rate,
                    latency: format!(
                        "p50 {:?}, p99 {:?}, errors {}",
                        report.p50, report.p99, report.errors
                    ),
                    server,
                }
            }
            Saturator::Tool(tool) => {
                let ((rate, latency), server) =
                    with_server_share(pinning.generator.as_deref(), || {
                        let out = tool
                            .command(url, secs, pinning)
                            .output()
                            .expect("run the load generator");
                        let (requests, rate, latency) =
                            tool.read(&String::from_utf8_lossy(&out.stdout));
                        ((rate, latency), requests)
                    });
                Self {
                    rate,
                    latency,
                    server,
                }
            }
        }
    }
}
