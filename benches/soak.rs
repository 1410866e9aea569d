//! Soak benchmark: steady load for a long time, watching for growth (a plain binary, not run in
//! CI). Run with `cargo bench --bench soak`.
//!
//! 1. The webhook, in-process on a runtime of its own (as `webhook_load`), at a fixed rate
//!    (`NIGHTSHIFT_SOAK_RATE`, default 2,000 reviews/s) over 100 keep-alive HTTPS connections
//!    with the realistic 10 KB research pod.
//! 2. The real `nightshift scaler` binary with 1,000 ScaledObjects polling it (GetMetrics then
//!    IsActive, every ScaledObject once per second) against an in-process Prometheus stand-in.
//!
//! Each phase lasts `NIGHTSHIFT_SOAK_SECS` (default 600) and prints, every
//! `NIGHTSHIFT_SOAK_REPORT_SECS` (default 60): the server process's RSS and open file
//! descriptors, the requests' p99 and the rate achieved; then the growth from the first report
//! to the last, and from the end of warm-up (`NIGHTSHIFT_SOAK_WARMUP_REPORTS`, default the first
//! 2 reports) to the last. `NIGHTSHIFT_SOAK_PHASES` (default `webhook,scaler`) runs only some.

/// The allocator the `nightshift` binary ships with (`src/main.rs`), so that the in-process
/// server is measured as it runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "support/pod.rs"]
mod pod;
#[path = "support/scaler_load.rs"]
mod scaler_load;
#[path = "support/stats.rs"]
mod stats;

use scaler_load::{request, start_scaler};
use stats::{env_or, percentile};
use std::{
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use axum::{Router, http::header::CONTENT_TYPE, routing::get};
use nightshift::scaler::service::proto::external_scaler_client::ExternalScalerClient;
use nightshift::{
    test_support,
    webhook::{certs, server},
};
use tokio_util::sync::CancellationToken;

/// Keep-alive connections carrying the webhook load (the target scenario: 100 clients).
const CONNECTIONS: usize = 100;
/// ScaledObjects polling the scaler, each once per `POLL`.
const SCALED_OBJECTS: usize = 1000;
/// KEDA polls every 30 s by default; once a second is 30 times the default load.
const POLL: Duration = Duration::from_secs(1);

/// Resident set size of the process whose `/proc` directory is `proc`, in MiB.
fn rss_mib(proc: &Path) -> f64 {
    std::fs::read_to_string(proc.join("status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        / 1024.0
}

/// Open file descriptors of the process whose `/proc` directory is `proc`.
fn open_fds(proc: &Path) -> usize {
    std::fs::read_dir(proc.join("fd")).map_or(0, |d| d.count())
}

/// One report line's figures.
struct Sample {
    rss: f64,
    fds: usize,
    p99: Duration,
    rate: f64,
    errors: u64,
}

/// Prints one report line and keeps it for the growth summary.
fn report(phase: &str, minute: usize, s: Sample, seen: &mut Vec<Sample>) {
    println!(
        "{phase} report {minute:>3}: RSS {:>7.1} MiB  open fds {:>4}  p99 {:>9.2?}  {:>7.0}/s  errors {}",
        s.rss, s.fds, s.p99, s.rate, s.errors
    );
    seen.push(s);
}

/// Prints the growth from the first report to the last, then from the end of warm-up (the
/// first `warm_up` reports: allocator pools, connection buffers and caches filling) to the last,
/// which is what a leak would show in.
fn growth(phase: &str, seen: &[Sample], warm_up: usize) {
    let (Some(first), Some(last)) = (seen.first(), seen.last()) else {
        return;
    };
    println!(
        "{phase} growth over {} reports: RSS {:+.1} MiB ({:.1} → {:.1}), open fds {:+} ({} → {}), p99 {:.2?} → {:.2?}",
        seen.len(),
        last.rss - first.rss,
        first.rss,
        last.rss,
        last.fds as i64 - first.fds as i64,
        first.fds,
        last.fds,
        first.p99,
        last.p99
    );
    let base_report = warm_up.max(1);
    if let Some(base) = seen
        .get(base_report - 1)
        .filter(|_| base_report < seen.len())
    {
        println!(
            "{phase} growth after warm-up (report {base_report} → {}): RSS {:+.1} % ({:.1} → {:.1} MiB), open fds {:+} ({} → {})",
            seen.len(),
            100.0 * (last.rss - base.rss) / base.rss,
            base.rss,
            last.rss,
            last.fds as i64 - base.fds as i64,
            base.fds,
            last.fds,
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it,
    // and a soak is not a test: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("soak benchmark: run it with `cargo bench --bench soak`");
        return;
    }
    nightshift::install_crypto_provider();
    let secs: u64 = env_or("NIGHTSHIFT_SOAK_SECS", 600);
    let every: u64 = env_or::<u64>("NIGHTSHIFT_SOAK_REPORT_SECS", 60).max(1);
    let rate: f64 = env_or("NIGHTSHIFT_SOAK_RATE", 2000.0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let warm_up: usize = env_or("NIGHTSHIFT_SOAK_WARMUP_REPORTS", 2);
    let phases: String = env_or("NIGHTSHIFT_SOAK_PHASES", "webhook,scaler".to_string());
    let phases: Vec<&str> = phases.split(',').map(str::trim).collect();
    if let Some(unknown) = phases.iter().find(|p| !["webhook", "scaler"].contains(p)) {
        eprintln!("NIGHTSHIFT_SOAK_PHASES: unknown phase {unknown:?} (webhook, scaler)");
        std::process::exit(2);
    }
    if phases.contains(&"webhook") {
        runtime.block_on(webhook(secs, every, rate, warm_up));
    }
    if phases.contains(&"scaler") {
        runtime.block_on(scaler(secs, every, warm_up));
    }
}

async fn webhook(secs: u64, every: u64, rate: f64, warm_up: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, tls) = test_support::certs::generate(dir.path());
    let reviewer = test_support::webhook::research_reviewer();
    let router = server::router(
        reviewer,
        3 << 20,
        nightshift::runtime::admin::Readiness::default(),
    );
    // The server on a runtime of its own, so that the load generator's tasks never queue on its
    // workers and count as latency.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("soak-webhook")
        .build()
        .expect("server runtime");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let url = format!(
        "https://127.0.0.1:{}/mutate",
        listener.local_addr().expect("addr").port()
    );
    let shutdown = CancellationToken::new();
    let task = server_rt.spawn({
        let shutdown = shutdown.clone();
        async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            server::serve(listener, tls, router, server::Limits::default(), shutdown).await
        }
    });
    let body = serde_json::to_vec(&pod::admission_review(pod::realistic_pod())).expect("body");
    let ca = std::fs::read(dir.path().join(certs::CA_CERT)).expect("ca");
    let clients: Vec<reqwest::Client> = (0..CONNECTIONS)
        .map(|_| {
            reqwest::Client::builder()
                .tls_certs_only([reqwest::Certificate::from_pem(&ca).expect("ca")])
                .http1_only()
                .pool_max_idle_per_host(1)
                .build()
                .expect("client")
        })
        .collect();
    println!(
        "webhook soak: {rate:.0} reviews/s over {CONNECTIONS} keep-alive connections, {secs} s, \
         a report every {every} s (server in this process)"
    );
    let me = Path::new("/proc/self");
    let per_conn = Duration::from_secs_f64(CONNECTIONS as f64 / rate);
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut minute = 0;
    while Instant::now() < end {
        minute += 1;
        let deadline = (Instant::now() + Duration::from_secs(every)).min(end);
        let started = Instant::now();
        let tasks: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let (c, url, body) = (c.clone(), url.clone(), body.clone());
                tokio::spawn(async move {
                    // Spread the connections' ticks over one period.
                    tokio::time::sleep(per_conn.mul_f64(i as f64 / CONNECTIONS as f64)).await;
                    let mut ticker = tokio::time::interval(per_conn);
                    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                    let (mut lat, mut errors) = (Vec::new(), 0u64);
                    while Instant::now() < deadline {
                        ticker.tick().await;
                        let t = Instant::now();
                        let ok = match c.post(&url).body(body.clone()).send().await {
                            Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
                            _ => false,
                        };
                        if ok {
                            lat.push(t.elapsed());
                        } else {
                            errors += 1;
                        }
                    }
                    (lat, errors)
                })
            })
            .collect();
        let (mut all, mut errors) = (Vec::new(), 0);
        for t in tasks {
            let (lat, e) = t.await.expect("load task");
            all.extend(lat);
            errors += e;
        }
        all.sort();
        let s = Sample {
            rss: rss_mib(me),
            fds: open_fds(me),
            p99: percentile(&all, 0.99),
            rate: all.len() as f64 / started.elapsed().as_secs_f64(),
            errors,
        };
        report("webhook", minute, s, &mut seen);
    }
    growth("webhook", &seen, warm_up);
    shutdown.cancel();
    let _ = task.await;
    server_rt.shutdown_background();
}

async fn scaler(secs: u64, every: u64, warm_up: usize) {
    let prom = fake_prometheus().await;
    let (server, channel) = start_scaler(prom, &[], None).await;
    let proc = Path::new("/proc").join(server.id().to_string());
    let client = ExternalScalerClient::new(channel);
    println!(
        "scaler soak: {SCALED_OBJECTS} ScaledObjects, each polling GetMetrics + IsActive every \
         {POLL:?}, {secs} s, a report every {every} s (nightshift scaler process)"
    );
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut minute = 0;
    while Instant::now() < end {
        minute += 1;
        let report_at = (Instant::now() + Duration::from_secs(every)).min(end);
        let started = Instant::now();
        let (mut all, mut errors) = (Vec::new(), 0u64);
        while Instant::now() < report_at {
            let round = Instant::now();
            let tasks: Vec<_> = (0..SCALED_OBJECTS)
                .map(|i| {
                    let mut c = client.clone();
                    let req = request(prom, i);
                    tokio::spawn(async move {
                        let so = req.scaled_object_ref.clone().expect("ref");
                        let t = Instant::now();
                        let ok = c.get_metrics(req).await.is_ok() && c.is_active(so).await.is_ok();
                        (t.elapsed(), ok)
                    })
                })
                .collect();
            for t in tasks {
                let (lat, ok) = t.await.expect("poll task");
                all.push(lat);
                errors += u64::from(!ok);
            }
            tokio::time::sleep(POLL.saturating_sub(round.elapsed())).await;
        }
        all.sort();
        let s = Sample {
            rss: rss_mib(&proc),
            fds: open_fds(&proc),
            p99: percentile(&all, 0.99),
            rate: all.len() as f64 / started.elapsed().as_secs_f64(),
            errors,
        };
        report("scaler", minute, s, &mut seen);
    }
    growth("scaler", &seen, warm_up);
}

/// A Prometheus stand-in answering every query with a vector of two pods per model.
async fn fake_prometheus() -> SocketAddr {
    let answer: &'static str =
        Box::leak(scaler_load::prometheus_answer(SCALED_OBJECTS).into_boxed_str());
    let app = Router::new().route(
        "/api/v1/query",
        get(move || async move { ([(CONTENT_TYPE, "application/json")], answer) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}
