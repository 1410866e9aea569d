//! The admin HTTP port: `/livez`, `/readyz`, `/metrics`, plus routes that components add
//! (the scaler's decision explanations, the pool's status).
//!
//! Owns the readiness registry and the serving of the Prometheus registry. It does not own any
//! metric: components register theirs in the shared [`prometheus_client::registry::Registry`]
//! while they are built, before the admin server starts.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use clap::Args;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::runtime::listen::{self, HttpLimits};

/// Prefix of every metric nightshift exports on `/metrics`.
pub const METRICS_PREFIX: &str = "nightshift";

/// Content type of the Prometheus/OpenMetrics text exposition that `prometheus-client` encodes.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Admin server options.
#[derive(Clone, Debug, Args)]
pub struct AdminArgs {
    /// Address of the admin HTTP server (health, metrics, status, explanations).
    #[arg(long, env = "NIGHTSHIFT_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
}

/// Errors of the admin server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot bind the admin server to {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Named readiness conditions. `/readyz` answers 200 only when every registered condition is
/// ready; each component registers the conditions it needs (e.g. "webhook caches synced").
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    conditions: Arc<Mutex<BTreeMap<&'static str, bool>>>,
}

/// A handle to one readiness condition.
#[derive(Clone, Debug)]
pub struct ReadyHandle {
    name: &'static str,
    conditions: Arc<Mutex<BTreeMap<&'static str, bool>>>,
}

impl Readiness {
    /// Registers a condition, initially not ready.
    pub fn register(&self, name: &'static str) -> ReadyHandle {
        lock(&self.conditions).insert(name, false);
        ReadyHandle {
            name,
            conditions: self.conditions.clone(),
        }
    }

    /// The conditions that are not ready yet, in name order.
    pub fn pending(&self) -> Vec<&'static str> {
        lock(&self.conditions)
            .iter()
            .filter(|(_, ready)| !**ready)
            .map(|(name, _)| *name)
            .collect()
    }
}

impl ReadyHandle {
    /// Marks the condition ready or not ready.
    pub fn set(&self, ready: bool) {
        lock(&self.conditions).insert(self.name, ready);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave the map inconsistent (single inserts), so a
    // poisoned lock is still safe to use.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The base admin router: `/livez`, `/readyz` and `/metrics`. Merge component routes into it.
pub fn router(registry: Arc<Registry>, readiness: Readiness) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .with_state(registry)
        .merge(readiness_router(readiness))
}

/// `GET /readyz` alone: 200 when every registered condition is ready, 503 naming the pending
/// ones otherwise. Also served on the webhook's HTTPS port, so that a readiness probe exercises
/// TLS as the API server will.
pub fn readiness_router(readiness: Readiness) -> Router {
    Router::new()
        .route("/readyz", get(readyz))
        .with_state(readiness)
}

async fn readyz(State(readiness): State<Readiness>) -> impl IntoResponse {
    let pending = readiness.pending();
    if pending.is_empty() {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", pending.join(", ")),
        )
    }
}

async fn metrics(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &registry) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics failed: {e}\n"),
        )
            .into_response(),
    }
}

/// Binds the admin server. Binding is separate from serving so that start-up fails fast on a
/// taken port and tests can bind `127.0.0.1:0` and read the chosen address.
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })
}

/// The admin server's limits (docs/security.md, "Listener limits").
pub fn limits() -> (usize, HttpLimits) {
    (
        // Prometheus (one or two replicas), the kubelet's probes and a person with curl: 64
        // connections is plenty and bounds what a client opening connections in a loop holds.
        64,
        HttpLimits {
            // Scrapers and probes send their headers at once; 30 s also closes idle keep-alive
            // connections well after Prometheus' usual 15-60 s scrape interval would reuse them.
            header_read: Duration::from_secs(30),
            // Every route answers from memory; the kubelet's probe gives up after 1 s and a
            // Prometheus scrape after 10 s by default.
            request: Duration::from_secs(10),
            // Nothing here needs more than a handful of concurrent requests per connection.
            max_streams: 16,
            // As the webhook: a vanished peer frees its place within 50 s.
            keep_alive_interval: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(20),
        },
    )
}

/// Serves `router` on `listener` until `shutdown`, within [`limits`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let (max_connections, http) = limits();
    serve_with(listener, router, max_connections, http, shutdown).await;
    Ok(())
}

/// Serves `router` on `listener` with at most `max_connections` open and `http`'s time limits.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    router: Router,
    max_connections: usize,
    http: HttpLimits,
    shutdown: CancellationToken,
) {
    listen::serve_plain(
        listener,
        router,
        "admin",
        "admin server",
        max_connections,
        http,
        shutdown,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get_status(router: Router, path: &str) -> (StatusCode, String) {
        let response = router
            .oneshot(Request::get(path).body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn readyz_waits_for_every_condition() {
        let readiness = Readiness::default();
        let caches = readiness.register("webhook caches");
        let app = router(Arc::new(Registry::default()), readiness.clone());

        let (status, body) = get_status(app.clone(), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("webhook caches"), "{body}");

        caches.set(true);
        let (status, _) = get_status(app, "/readyz").await;
        assert_eq!(status, StatusCode::OK);
    }

    #[tokio::test]
    async fn metrics_are_served_in_text_format() {
        let mut registry = Registry::with_prefix("nightshift");
        let counter = prometheus_client::metrics::counter::Counter::<u64>::default();
        registry.register("things", "Things counted", counter.clone());
        counter.inc();
        let app = router(Arc::new(registry), Readiness::default());
        let (status, body) = get_status(app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("nightshift_things_total 1"), "{body}");
    }

    /// One connection place, a 300 ms header timeout: an idle connection holds the place, a
    /// second waits (not refused) until the idle one is closed for sending no headers.
    #[tokio::test]
    async fn idle_connections_are_closed_and_excess_ones_wait() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let (_, mut http) = limits();
        http.header_read = std::time::Duration::from_millis(300);
        let app = router(Arc::new(Registry::default()), Readiness::default());
        tokio::spawn(serve_with(listener, app, 1, http, stop.clone()));
        let _stop = stop.drop_guard();

        let started = std::time::Instant::now();
        let mut idle = tokio::net::TcpStream::connect(addr).await.expect("idle");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut next = tokio::net::TcpStream::connect(addr).await.expect("next");
        next.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let deadline = std::time::Duration::from_secs(10);
        let mut answer = Vec::new();
        tokio::time::timeout(deadline, next.read_to_end(&mut answer))
            .await
            .expect("answered in time")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            started.elapsed() >= std::time::Duration::from_millis(300),
            "served before the idle connection was closed: {:?}",
            started.elapsed()
        );
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(deadline, idle.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "the idle connection is closed");
    }

    #[tokio::test]
    async fn livez_is_always_ok() {
        let app = router(Arc::new(Registry::default()), Readiness::default());
        assert_eq!(get_status(app, "/livez").await.0, StatusCode::OK);
    }

    /// How long a waiting request is watched to show it does not get through.
    const HELD: Duration = Duration::from_millis(400);
    /// Bound on anything that must happen.
    const DEADLINE: Duration = Duration::from_secs(10);

    /// Serves `app` within `http` (and 4 connections) on a free loopback port until the guard
    /// drops.
    async fn serve_app(app: Router, http: HttpLimits) -> (SocketAddr, tokio_util::sync::DropGuard) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        tokio::spawn(serve_with(listener, app, 4, http, stop.clone()));
        (addr, stop.drop_guard())
    }

    /// A route that counts its callers and answers each once `gate` has a permit for it.
    fn gated_route(
        gate: Arc<tokio::sync::Semaphore>,
        entered: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Router {
        Router::new().route(
            "/held",
            get(move || async move {
                entered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // The permit goes straight back: one permit releases every caller in turn.
                let _ = gate.acquire().await;
                "released"
            }),
        )
    }

    /// Polls `condition` every 10 ms until it holds, failing after [`DEADLINE`].
    async fn wait_for(what: &str, condition: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while !condition() {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_request_slower_than_the_request_limit_gets_408() {
        let (_, mut http) = limits();
        http.request = Duration::from_millis(300);
        let app = Router::new().route("/never", get(std::future::pending::<&str>));
        let (addr, _stop) = serve_app(app, http).await;
        let started = std::time::Instant::now();
        let response = tokio::time::timeout(DEADLINE, reqwest::get(format!("http://{addr}/never")))
            .await
            .expect("answered in time")
            .expect("response");
        assert_eq!(response.status(), reqwest::StatusCode::REQUEST_TIMEOUT);
        assert!(started.elapsed() >= Duration::from_millis(300));
    }

    /// One stream per connection: a second request on the same HTTP/2 connection waits until
    /// the first ends, while another connection is served meanwhile.
    #[tokio::test]
    async fn http2_streams_above_the_cap_wait_until_one_ends() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let entered = Arc::new(AtomicUsize::new(0));
        let (_, mut http) = limits();
        http.max_streams = 1;
        let (addr, _stop) = serve_app(gated_route(gate.clone(), entered.clone()), http).await;
        let url = format!("http://{addr}/held");
        let h2 = || {
            reqwest::Client::builder()
                .http2_prior_knowledge()
                .build()
                .expect("client")
        };
        let client = h2();
        let first = tokio::spawn(client.get(&url).send());
        wait_for("the first request in the handler", || {
            entered.load(Ordering::SeqCst) == 1
        })
        .await;
        let second = tokio::spawn(client.get(&url).send());
        let other = tokio::spawn(h2().get(&url).send());
        wait_for("the other connection's request in the handler", || {
            entered.load(Ordering::SeqCst) == 2
        })
        .await;
        tokio::time::sleep(HELD).await;
        assert_eq!(
            entered.load(Ordering::SeqCst),
            2,
            "a second stream ran on a connection whose only stream was taken"
        );
        assert!(!second.is_finished());
        gate.add_permits(1);
        for call in [first, second, other] {
            let response = tokio::time::timeout(DEADLINE, call)
                .await
                .expect("answered in time")
                .expect("task")
                .expect("response");
            assert_eq!(response.status(), reqwest::StatusCode::OK);
        }
        assert_eq!(entered.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_http2_peer_that_does_not_answer_pings_is_closed() {
        let (_, mut http) = limits();
        http.keep_alive_interval = Duration::from_millis(100);
        http.keep_alive_timeout = Duration::from_millis(100);
        let app = router(Arc::new(Registry::default()), Readiness::default());
        let (addr, _stop) = serve_app(app, http).await;
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let seen = listen::silent_http2::watch(tcp, DEADLINE).await;
        assert_eq!(
            seen,
            listen::silent_http2::Observed {
                pinged: true,
                closed: true
            }
        );
    }
}
