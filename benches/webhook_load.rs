//! HTTPS load on the webhook over loopback with keep-alive connections.
//!
//! `cargo bench --bench webhook_load` starts the webhook in-process, on a runtime of its own, on a
//! free port with a fixed cluster view and a realistic 10 KB research pod, then:
//! 1. sends a fixed rate (`NIGHTSHIFT_BENCH_RATE`, default 2000 reviews/s) over 100 keep-alive
//!    connections for `NIGHTSHIFT_BENCH_SECS` (default 10) seconds and reports p50/p99/max and the
//!    CPU the server's threads used;
//! 2. sends the same load to the same HTTPS server code (same TLS, same HTTP stack, same runtime)
//!    whose `/mutate` only reads the body and answers a fixed small JSON: the transport floor of
//!    this machine and generator, so that the review's own share of the latency shows;
//! 3. if `wrk` is installed, saturates the webhook with `wrk -t2 -c100 --latency` to find the
//!    maximum sustained reviews/s.
//!
//! Under `cargo test` (no `--bench` argument) it only checks that a few reviews succeed.

#[path = "support/cpu_time.rs"]
mod cpu_time;
#[path = "support/localhost_cert.rs"]
mod localhost_cert;
#[path = "support/pod.rs"]
mod pod;
#[path = "support/stats.rs"]
mod stats;

use stats::{env_or, percentile};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use nightshift::webhook::{
    certs,
    cluster::FixedCluster,
    mutate::MutationPolicy,
    review::{Metrics, Reviewer},
    server,
};
use tokio_util::sync::CancellationToken;

/// Connections used by both load phases (the target scenario: 100 concurrent clients).
const CONNECTIONS: usize = 100;

#[tokio::main]
async fn main() {
    nightshift::install_crypto_provider();
    let full = std::env::args().any(|a| a == "--bench");
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, tls) = localhost_cert::generate(dir.path());
    let reviewer = Reviewer {
        policy: Arc::new(MutationPolicy::default()),
        cluster: Arc::new(
            FixedCluster::default()
                .with_namespace("research", &[("nightshift.io/research", "true")])
                .with_class("nightshift-research", -1000, "Never"),
        ),
        metrics: Metrics::default(),
    };
    let router = server::router(reviewer, 3 << 20, nightshift::admin::Readiness::default());
    let webhook = Server::start(router, tls.clone());
    let url = webhook.url.clone();
    let body = serde_json::to_vec(&pod::admission_review(pod::realistic_pod())).expect("body");
    let ca = std::fs::read(dir.path().join(certs::CA_CERT)).expect("ca");
    let client = || {
        reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(&ca).expect("ca")])
            .http1_only()
            .pool_max_idle_per_host(1)
            .build()
            .expect("client")
    };

    if !full {
        let c = client();
        for _ in 0..5 {
            let r = c.post(&url).body(body.clone()).send().await.expect("send");
            assert!(r.status().is_success());
        }
        webhook.stop().await;
        return;
    }

    eprintln!("review body: {} bytes", body.len());
    let rate: f64 = env_or("NIGHTSHIFT_BENCH_RATE", 2000.0);
    let secs: u64 = env_or("NIGHTSHIFT_BENCH_SECS", 10);
    let load = FixedRate {
        rate,
        secs,
        body: body.clone(),
        client: &client,
    };
    let reviews = load.run(&url).await;
    println!(
        "fixed rate {rate:.0}/s target, {CONNECTIONS} keep-alive connections, {secs} s: {reviews}"
    );
    let floor = Server::start(transport_floor_router(), tls);
    let floor_summary = load.run(&floor.url).await;
    println!(
        "same load, same HTTPS server, /mutate answering a fixed body without a review (transport floor): {floor_summary}"
    );
    floor.stop().await;

    match which_wrk() {
        Some(wrk) => {
            let script = dir.path().join("review.lua");
            let body_str = String::from_utf8(body.clone()).expect("utf8");
            std::fs::write(
                &script,
                format!(
                    "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = [==[{body_str}]==]\n"
                ),
            )
            .expect("script");
            let out = tokio::process::Command::new(wrk)
                .args([
                    "-t2",
                    &format!("-c{CONNECTIONS}"),
                    &format!("-d{secs}s"),
                    "--latency",
                    "-s",
                ])
                .arg(&script)
                .arg(&url)
                .kill_on_drop(true)
                .output()
                .await
                .expect("run wrk");
            println!(
                "wrk (saturation, {CONNECTIONS} keep-alive connections):\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        None => println!("wrk not installed: skipping the saturation phase (apt-get install wrk)"),
    }
    webhook.stop().await;
}

fn which_wrk() -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("wrk"))
            .find(|p| p.is_file())
    })
}

/// The webhook's HTTPS server on a runtime of its own, as it has its own process in a cluster:
/// the load generator's tasks must not queue on the server's workers and count as latency.
struct Server {
    url: String,
    runtime: tokio::runtime::Runtime,
    task: tokio::task::JoinHandle<Result<(), nightshift::webhook::Error>>,
    shutdown: CancellationToken,
}

/// Name of the server runtime's threads, by which their CPU time is found in `/proc`.
const SERVER_THREAD: &str = "webhook-bench";

impl Server {
    fn start(router: axum::Router, tls: Arc<nightshift::tls::ServerTls>) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
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

    async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
        self.runtime.shutdown_background();
    }
}

/// An HTTPS endpoint doing no review: reads the body, answers a fixed small JSON.
fn transport_floor_router() -> axum::Router {
    axum::Router::new().route(
        "/mutate",
        axum::routing::post(|body: axum::body::Bytes| async move {
            (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                format!("{{\"received\":{}}}", body.len()),
            )
        }),
    )
}

/// CPU seconds (user + system) used so far by this process's threads named `SERVER_THREAD`.
fn server_cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim_end().starts_with(SERVER_THREAD))
        })
        .map(|t| cpu_time::cpu_seconds(&t.path().join("stat")))
        .sum()
}

/// A fixed request rate spread over `CONNECTIONS` keep-alive connections.
struct FixedRate<'a, C: Fn() -> reqwest::Client> {
    rate: f64,
    secs: u64,
    body: Vec<u8>,
    client: &'a C,
}

impl<C: Fn() -> reqwest::Client> FixedRate<'_, C> {
    /// Runs the load against `url` and summarises latency, errors and the server's CPU use.
    async fn run(&self, url: &str) -> String {
        let per_conn = Duration::from_secs_f64(CONNECTIONS as f64 / self.rate);
        let deadline = Instant::now() + Duration::from_secs(self.secs);
        let mut tasks = Vec::new();
        for i in 0..CONNECTIONS {
            let (c, url, body) = ((self.client)(), url.to_string(), self.body.clone());
            tasks.push(tokio::spawn(async move {
                // Spread the connections' ticks over one period.
                tokio::time::sleep(per_conn.mul_f64(i as f64 / CONNECTIONS as f64)).await;
                let mut ticker = tokio::time::interval(per_conn);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let (mut lat, mut errors) = (Vec::new(), 0u64);
                while Instant::now() < deadline {
                    ticker.tick().await;
                    let start = Instant::now();
                    match c.post(&url).body(body.clone()).send().await {
                        Ok(r) if r.status().is_success() => match r.bytes().await {
                            Ok(_) => lat.push(start.elapsed()),
                            Err(_) => errors += 1,
                        },
                        _ => errors += 1,
                    }
                }
                (lat, errors)
            }));
        }
        let cpu_before = server_cpu_seconds();
        let started = Instant::now();
        let (mut all, mut errors) = (Vec::new(), 0);
        for t in tasks {
            let (lat, e) = t.await.expect("task");
            all.extend(lat);
            errors += e;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let cpu = server_cpu_seconds() - cpu_before;
        all.sort();
        format!(
            "{} requests ({:.0}/s achieved), errors {errors}, p50 {:?}, p90 {:?}, p99 {:?}, max {:?}; server threads {:.0} % of one core ({:.0} µs CPU per request)",
            all.len(),
            all.len() as f64 / elapsed,
            percentile(&all, 0.50),
            percentile(&all, 0.90),
            percentile(&all, 0.99),
            all.last().copied().unwrap_or_default(),
            cpu / elapsed * 100.0,
            cpu / all.len().max(1) as f64 * 1e6,
        )
    }
}
