//! Scaler benchmarks (a plain binary, not timed tests): run with `cargo bench --bench scaler`.
//!
//! Starts the real `nightshift scaler` binary on loopback against an in-process Prometheus
//! stand-in that counts queries, then reports:
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

#[path = "support/cpu_time.rs"]
mod cpu_time;
#[path = "support/pinning.rs"]
mod pinning;
#[path = "support/scaler_load.rs"]
mod scaler_load;

use pinning::Pinning;
use scaler_load::{ScalerProcess, request, start_scaler};
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
use cpu_time::cpu_seconds;
use nightshift::scaler::service::proto::external_scaler_client::ExternalScalerClient;
use tonic::transport::Channel;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// ScaledObjects (and models) in the load phase.
const SCALED_OBJECTS: usize = 1000;
/// Round trips per latency run, shared among the clients (at least 200 per client), so the
/// run stays short on a small machine.
const CALLS_PER_RUN: usize = 10_000;

/// The `stat` file of process `pid`.
fn proc_stat(pid: u32) -> std::path::PathBuf {
    format!("/proc/{pid}/stat").into()
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

async fn latency(
    server: &ScalerProcess,
    channel: &Channel,
    rpc: Rpc,
    concurrency: usize,
) -> Latency {
    let label = match rpc {
        Rpc::GetMetrics(_) => "cached GetMetrics",
        Rpc::HealthCheck => "health Check (transport floor)",
    };
    let cpu_before = cpu_seconds(&proc_stat(server.id()));
    let mut tasks = Vec::new();
    for client in 0..concurrency {
        // All clients share one HTTP/2 connection, as KEDA's operator shares one connection
        // among the ScaledObjects that name the same scalerAddress and TLS settings.
        let (channel, rpc) = (channel.clone(), rpc.clone());
        tasks.push(tokio::spawn(async move {
            let calls = (CALLS_PER_RUN / concurrency).max(200);
            let mut samples = Vec::with_capacity(calls);
            for _ in 0..calls {
                let started = Instant::now();
                rpc.call(&channel, client).await;
                samples.push(started.elapsed());
            }
            samples
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("join"));
    }
    let cpu = cpu_seconds(&proc_stat(server.id())) - cpu_before;
    all.sort();
    println!(
        "{label}, {concurrency:>2} concurrent client(s): p50 {:>7.1} µs  p99 {:>7.1} µs  ({} calls; server CPU {:.0} µs per call)",
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

async fn run(pinning: Pinning) {
    nightshift::install_crypto_provider();
    println!("{}", pinning.describe());
    let server_cores = pinning.server.as_deref();
    let queries = Arc::new(AtomicUsize::new(0));
    let prom = fake_prometheus(queries.clone()).await;

    // Latency with a cache that never expires during the run.
    let (server, channel) = start_server("1h", prom, server_cores).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("idle RSS: {:.1} MiB", rss_kib(server.id()) as f64 / 1024.0);
    for i in 0..64 {
        ExternalScalerClient::new(channel.clone())
            .get_metrics(request(prom, i))
            .await
            .expect("warm");
    }
    for concurrency in [1, 64] {
        // Twice each, alternating, so that a passing disturbance shows as a gap between rounds.
        for round in 1..=2 {
            let real = latency(&server, &channel, Rpc::GetMetrics(prom), concurrency).await;
            let floor = latency(&server, &channel, Rpc::HealthCheck, concurrency).await;
            println!(
                "  ratios, {concurrency} client(s), round {round}: p50 {:.2}×, p99 {:.2}× (target ≤ 1.25×); CPU per call {:.0} µs vs floor {:.0} µs = floor + {:.0} µs (target ≤ + 10 µs)",
                real.p50.as_secs_f64() / floor.p50.as_secs_f64(),
                real.p99.as_secs_f64() / floor.p99.as_secs_f64(),
                real.cpu_per_call * 1e6,
                floor.cpu_per_call * 1e6,
                (real.cpu_per_call - floor.cpu_per_call) * 1e6,
            );
        }
    }
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
    if !std::env::args().any(|a| a == "--bench") {
        println!("scaler benchmark: run it with `cargo bench --bench scaler`");
        return;
    }
    let pinning = Pinning::split();
    // Before any thread starts: this process (clients, Prometheus stand-in) keeps to the
    // generator's cores; the scaler is started on the server's.
    Pinning::pin_self(pinning.generator.as_deref());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(pinning));
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}
