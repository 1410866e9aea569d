//! The researchers' view: a read-only web page of the GPU pool (use now, research by namespace,
//! recent preemptions, charts of the last day and week) and the same data as JSON, on a port of
//! its own.
//!
//! - [`model`] (pure): the [`model::View`] data, computed from the pool's status and history.
//! - [`html`] (pure): the page, rendered from a [`model::View`].
//! - [`services`] (pure): demand against replicas per inference service, a week in memory.
//! - [`rebuild`]: the history read back from Prometheus after a restart.
//! - this module: the options, the thin axum [`router`] over a [`Snapshot`] of the running pool
//!   controller, the sampler of the scaler's decisions, and [`start`], which wires them and
//!   serves the view within the same listener limits as the admin server ([`limits`]).
//!
//! Requests never build the page under the controller's lock: the controller's status and
//! history are copied into a [`Snapshot`] at most once per [`SNAPSHOT_FOR`], by the first
//! request that finds the last one older (the lock is held only for that copy), and every
//! request builds its model and renders from the snapshot. A request that finds the lock taken
//! serves the last snapshot rather than wait.
//!
//! Aggregate data only: node names, namespaces, pod names of preempted pods, GPU counts. No
//! secret, no pod spec, no write.

pub mod html;
pub mod model;
pub mod rebuild;
pub mod services;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard, TryLockError},
    time::{Duration, Instant},
};

use arc_swap::ArcSwapOption;

use axum::{
    Json, Router,
    extract::{Query, State},
    http::header,
    response::{Html, IntoResponse},
    routing::get,
};
use clap::Args;
use jiff::Timestamp;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::{
    pool::{
        history::History,
        run::{Shared, lock},
        status::StatusReport,
    },
    runtime::{
        Context,
        listen::{self, HttpLimits},
    },
    scaler::explain::{Decisions, Explanation},
};
use model::HistoryOrigin;
use services::{ServiceKey, Services};

/// Options of the researchers' view.
#[derive(Clone, Debug, Args)]
pub struct ViewArgs {
    /// Address of the researchers' web page (read-only pool view, `/` and `/api/view`).
    #[arg(long, env = "NIGHTSHIFT_VIEW_ADDR", default_value = "0.0.0.0:8090")]
    pub view_addr: SocketAddr,

    /// Prometheus that scrapes nightshift (e.g. `http://prometheus.monitoring:9090`): at start
    /// the view rebuilds the last week of its charts from nightshift's own metrics there.
    /// Without it the charts start empty after a restart.
    #[arg(long, env = "NIGHTSHIFT_VIEW_PROMETHEUS")]
    pub view_prometheus: Option<String>,
}

/// Bound on rebuilding the history from Prometheus: a healthy server answers the six range
/// queries (10,080 points at most each) in about a second; a slow or hung one must not keep
/// the view without its live history for long.
pub const REBUILD_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the scaler's decisions are sampled: the pool history's step.
const SAMPLE_EVERY: Duration = Duration::from_secs(60);
/// A decision older than this is not sampled: KEDA polls every 30 s by default, so an older one
/// belongs to a ScaledObject no longer polled (deleted, or paused).
const STALE_AFTER: i64 = 5 * 60;
/// How long a [`Snapshot`] of the controller serves requests before the next request takes a
/// new one: the page's figures are at most this old, and the controller's lock is taken for the
/// view at most once per this interval, however many people load the page.
pub const SNAPSHOT_FOR: Duration = Duration::from_secs(5);

/// Errors of the view server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot bind the view server to {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The query string: `?namespace=team-a` restricts the research figures to one namespace.
#[derive(Debug, Default, Deserialize)]
pub struct Filter {
    pub namespace: Option<String>,
}

impl Filter {
    fn namespace(&self) -> Option<&str> {
        self.namespace
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
    }
}

/// What the view holds besides the controller: the inference services' history and where the
/// history comes from.
#[derive(Debug)]
pub struct Timeline {
    pub services: Services,
    pub origin: HistoryOrigin,
}

/// Where the view reads the time: the wall clock, or a fixed instant where a test needs the page
/// to be the same whenever it is asked for.
type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// What the view needs from the controller, copied under its lock at one instant: requests
/// build their model and render from it, without the lock.
#[derive(Debug)]
pub struct Snapshot {
    /// When it was taken (monotonic), to know when it is due again.
    taken: Instant,
    pub report: StatusReport,
    pub pool: History,
}

/// What the view reads: the running controller (through [`Snapshot`]s of it), the [`Timeline`]
/// and the clock.
#[derive(Clone)]
pub struct ViewState {
    pub controller: Shared,
    snapshot: Arc<ArcSwapOption<Snapshot>>,
    /// How long a snapshot serves: [`SNAPSHOT_FOR`].
    snapshot_for: Duration,
    timeline: Arc<Mutex<Timeline>>,
    clock: Clock,
}

impl ViewState {
    /// A view of `controller` whose history starts at `started`, on the wall clock.
    pub fn new(controller: Shared, started: Timestamp) -> Self {
        Self {
            controller,
            snapshot: Arc::new(ArcSwapOption::empty()),
            snapshot_for: SNAPSHOT_FOR,
            timeline: Arc::new(Mutex::new(Timeline {
                services: Services::new(),
                origin: HistoryOrigin::SinceStart {
                    at: started,
                    rebuild_failed: None,
                },
            })),
            clock: Arc::new(Timestamp::now),
        }
    }

    /// The same view reading the time from `clock` instead of the wall clock: the page's "now",
    /// which places its charts' steps, the samples it takes and a rebuild's end.
    pub fn with_clock(self, clock: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        // A snapshot taken on the other clock is not this view's.
        self.snapshot.store(None);
        Self {
            clock: Arc::new(clock),
            ..self
        }
    }

    fn now(&self) -> Timestamp {
        (self.clock)()
    }

    /// Locks the timeline (never held across an `.await`).
    pub fn timeline(&self) -> MutexGuard<'_, Timeline> {
        // Every change leaves the timeline consistent; a panic elsewhere does not spoil it.
        self.timeline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The controller's latest [`Snapshot`]: the last one while younger than `snapshot_for`,
    /// else a new one. The controller's lock is held only to copy its status and history; when
    /// another holds it, the last snapshot serves (only the first request ever waits for it).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        let last = self.snapshot.load_full();
        if let Some(s) = &last
            && s.taken.elapsed() < self.snapshot_for
        {
            return s.clone();
        }
        let c = match (self.controller.try_lock(), last) {
            (Ok(c), _) => c,
            (Err(TryLockError::Poisoned(p)), _) => p.into_inner(),
            (Err(TryLockError::WouldBlock), Some(last)) => return last,
            (Err(TryLockError::WouldBlock), None) => lock(&self.controller),
        };
        let fresh = Arc::new(Snapshot {
            taken: Instant::now(),
            report: c.status(self.now()),
            pool: c.history().clone(),
        });
        drop(c);
        self.snapshot.store(Some(fresh.clone()));
        fresh
    }

    /// The view now, from the controller's [`Snapshot`]: built and rendered without its lock.
    fn current(&self, filter: &Filter) -> model::View {
        let snapshot = self.snapshot();
        let t = self.timeline();
        let timeline = model::Timeline {
            pool: &snapshot.pool,
            services: &t.services,
            origin: &t.origin,
        };
        model::build(&snapshot.report, timeline, filter.namespace())
    }

    /// Reads the earlier history from the Prometheus at `address` and adds it, or says why not
    /// (logged, and on the page); the history is never partly filled.
    pub async fn rebuild(&self, address: &str, timeout: Duration) {
        let started = match &self.timeline().origin {
            HistoryOrigin::SinceStart { at, .. } | HistoryOrigin::Rebuilding { at, .. } => *at,
            HistoryOrigin::Prometheus { at, .. } => *at,
        };
        self.timeline().origin = HistoryOrigin::Rebuilding {
            at: started,
            prometheus: address.to_string(),
        };
        tracing::info!(prometheus = %address, "rebuilding the view's history from Prometheus");
        let now = self.now();
        let origin = match rebuild::from_prometheus(address, now, timeout).await {
            Ok(found) => {
                let mut t = self.timeline();
                let mut kept = lock(&self.controller).backfill_history(&found.pool);
                // The next request shows the rebuilt history, not the snapshot before it.
                self.snapshot.store(None);
                for (key, points) in &found.services {
                    kept += t.services.backfill(key, points);
                }
                tracing::info!(prometheus = %address, samples = kept, "view history rebuilt from Prometheus");
                t.origin = HistoryOrigin::Prometheus {
                    at: now,
                    prometheus: address.to_string(),
                    samples: kept,
                };
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, "could not rebuild the view's history from Prometheus; it starts empty");
                HistoryOrigin::SinceStart {
                    at: started,
                    rebuild_failed: Some(e.to_string()),
                }
            }
        };
        self.timeline().origin = origin;
    }

    /// Samples the scaler's latest `decisions` at `now` into the services' history.
    pub fn sample(&self, decisions: &[Explanation], now: Timestamp) {
        let mut t = self.timeline();
        record_decisions(&mut t.services, decisions, now);
    }
}

/// Adds each fresh, successful decision to `services` at `now`: demand is the replicas the
/// scaler asked for, replicas the pods it read. Errors (no demand was reported) and decisions
/// older than [`STALE_AFTER`] are left out; services silent for a week are forgotten.
pub fn record_decisions(services: &mut Services, decisions: &[Explanation], now: Timestamp) {
    let now = now.as_second();
    for d in decisions {
        let (Some(demand), Some(pods)) = (d.replicas, d.pods) else {
            continue;
        };
        if now - d.at.as_second() > STALE_AFTER {
            continue;
        }
        let key = ServiceKey {
            namespace: d.namespace.clone(),
            name: d.name.clone(),
        };
        services.record(&key, now, demand, pods as f64);
    }
    services.forget_older_than(now - 7 * 86_400);
}

/// `/` (the page), `/api/view` (its data as JSON) and `/livez`, over a running controller.
pub fn router(state: ViewState) -> Router {
    Router::new()
        .route(
            "/",
            get(
                |State(v): State<ViewState>, Query(f): Query<Filter>| async move {
                    let view = v.current(&f);
                    (
                        [(header::CACHE_CONTROL, "no-store")],
                        Html(html::render(&view)),
                    )
                        .into_response()
                },
            ),
        )
        .route(
            "/api/view",
            get(
                |State(v): State<ViewState>, Query(f): Query<Filter>| async move {
                    Json(v.current(&f))
                },
            ),
        )
        .route("/livez", get(|| async { "ok\n" }))
        .with_state(state)
}

/// Starts the view over a running `controller`: binds its port and serves it, samples the
/// scaler's `decisions` each minute when the scaler runs in this process, and rebuilds the
/// history from Prometheus in the background when one is configured (start-up never waits for
/// it).
pub async fn start(
    args: ViewArgs,
    controller: Shared,
    decisions: Option<Decisions>,
    ctx: &mut Context,
) -> Result<(), Error> {
    let ViewArgs {
        view_addr,
        view_prometheus,
    } = args;
    let listener = bind(view_addr).await?;
    let state = ViewState::new(controller, Timestamp::now());
    let token = ctx.supervisor.shutdown_token();
    ctx.supervisor.spawn("view", {
        let (router, token) = (router(state.clone()), token.clone());
        async move {
            serve(listener, router, token).await?;
            Ok(())
        }
    });
    if let Some(decisions) = decisions {
        let (state, token) = (state.clone(), token.clone());
        ctx.supervisor.spawn("view-sampler", async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = token.cancelled() => return Ok(()),
                    _ = tick.tick() => state.sample(&decisions.all(), state.now()),
                }
            }
        });
    }
    match view_prometheus.filter(|a| !a.trim().is_empty()) {
        Some(address) => {
            // A one-off task: it ends on its own, which the supervisor would take for a failure.
            tokio::spawn(async move {
                tokio::select! {
                    () = token.cancelled() => {}
                    () = state.rebuild(address.trim(), REBUILD_TIMEOUT) => {}
                }
            });
        }
        None => tracing::info!(
            "no --view-prometheus: the view's history starts empty and fills once a minute"
        ),
    }
    Ok(())
}

/// The view's listener limits (docs/security.md, "Listener limits"): the admin server's, whose
/// every route also answers from memory; a page of the largest pool is rendered in a few
/// milliseconds, far within the request limit.
pub fn limits() -> (usize, HttpLimits) {
    crate::runtime::admin::limits()
}

/// Binds the view's port.
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })
}

/// Serves `router` on `listener` until `token` is cancelled, within [`limits`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    token: CancellationToken,
) -> Result<(), Error> {
    let (max_connections, http) = limits();
    serve_with(listener, router, max_connections, http, token).await;
    Ok(())
}

/// Serves `router` on `listener` with at most `max_connections` open and `http`'s time limits,
/// on the same accept loop and HTTP server as the admin and webhook listeners.
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
        "view",
        "researchers' view",
        max_connections,
        http,
        shutdown,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(name: &str, at: Timestamp, replicas: Option<f64>) -> Explanation {
        Explanation {
            namespace: "inference".into(),
            name: name.into(),
            at,
            source: "test".into(),
            pods: Some(2),
            terms: Vec::new(),
            driver: None,
            replicas,
            metric_value: None,
            active: None,
            activation_threshold: 0.0,
            error: None,
            forecast: None,
            capacity: None,
        }
    }

    #[test]
    fn fresh_successful_decisions_are_sampled_and_others_left_out() {
        let now = Timestamp::from_second(2_000_000_100).expect("ts");
        let old = Timestamp::from_second(2_000_000_100 - STALE_AFTER - 1).expect("ts");
        let mut s = Services::new();
        record_decisions(
            &mut s,
            &[
                decision("fresh", now, Some(1.5)),
                decision("stale", old, Some(9.0)),
                decision("failed", now, None),
            ],
            now,
        );
        let series = s.series(0, i64::MAX, services::STEP);
        assert_eq!(series.len(), 1);
        assert_eq!(series[0].name, "fresh");
        let p = series[0].latest.expect("point");
        assert_eq!((p.demand, p.replicas), (1.5, 2.0));
    }

    /// An empty pool's controller, as the view shares it.
    fn controller() -> Shared {
        use crate::{
            core::vocabulary::Vocabulary,
            pool::{
                controller::{Controller, LendingPolicy, Metrics},
                windows::Windows,
            },
        };
        Arc::new(Mutex::new(Controller::new(
            LendingPolicy {
                vocabulary: Vocabulary::default(),
                headroom: 8,
                windows: Windows::default(),
            },
            Metrics::default(),
        )))
    }

    /// `path` of `app`: its status and body.
    async fn get_body(app: Router, path: &str) -> (axum::http::StatusCode, String) {
        use tower::ServiceExt;
        let response = app
            .oneshot(
                axum::http::Request::get(path)
                    .body(axum::body::Body::empty())
                    .expect("request"),
            )
            .await
            .expect("infallible");
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 24)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// With every snapshot due at once (so each request would take a new one if it could), a
    /// request made while another thread holds the controller's lock is answered from the last
    /// snapshot, the same page and JSON as before, without waiting for the lock. Two workers:
    /// a request that blocked on the lock would hold one, and the deadline still fires.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_are_served_from_the_snapshot_while_the_controller_is_locked() {
        const DEADLINE: Duration = Duration::from_secs(10);
        let controller = controller();
        let at = Timestamp::from_second(2_000_000_000).expect("ts");
        let mut state = ViewState::new(controller.clone(), at).with_clock(move || at);
        state.snapshot_for = Duration::ZERO;
        let app = router(state);
        let before_page = get_body(app.clone(), "/").await;
        let before_json = get_body(app.clone(), "/api/view").await;
        assert_eq!(before_page.0, axum::http::StatusCode::OK);
        assert_eq!(before_json.0, axum::http::StatusCode::OK);

        // Another thread takes the controller's lock and keeps it until told to let go.
        let (locked_tx, locked) = std::sync::mpsc::channel();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _guard = lock(&controller);
            locked_tx.send(()).expect("test waits");
            let _ = held.recv();
        });
        locked.recv().expect("the lock is taken");

        for (path, before) in [("/", before_page), ("/api/view", before_json)] {
            let request = tokio::spawn(get_body(app.clone(), path));
            let deadline = Instant::now() + DEADLINE;
            while !request.is_finished() {
                assert!(
                    Instant::now() < deadline,
                    "{path} waited for the controller's lock"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(!holder.is_finished(), "the lock was held throughout");
            assert_eq!(request.await.expect("task"), before, "{path}");
        }
        release.send(()).expect("holder waits");
        holder.join().expect("holder");
    }

    /// The view's listener within small limits: one connection place and a 300 ms header
    /// timeout. A connection that sends nothing holds the place, a second waits (not refused)
    /// until the silent one is closed, then is served; a request slower than the request limit
    /// gets HTTP 408.
    #[tokio::test]
    async fn the_view_listener_keeps_its_limits() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const DEADLINE: Duration = Duration::from_secs(10);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let (_, mut http) = limits();
        http.header_read = Duration::from_millis(300);
        http.request = Duration::from_millis(300);
        let at = Timestamp::from_second(2_000_000_000).expect("ts");
        let app = router(ViewState::new(controller(), at).with_clock(move || at))
            .route("/never", get(std::future::pending::<&str>));
        tokio::spawn(serve_with(listener, app, 1, http, stop.clone()));
        let _stop = stop.drop_guard();

        let started = Instant::now();
        let mut silent = tokio::net::TcpStream::connect(addr).await.expect("silent");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut next = tokio::net::TcpStream::connect(addr).await.expect("next");
        next.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut answer = Vec::new();
        tokio::time::timeout(DEADLINE, next.read_to_end(&mut answer))
            .await
            .expect("answered in time")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "served before the silent connection was closed: {:?}",
            started.elapsed()
        );
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(DEADLINE, silent.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "the silent connection is closed");

        // Headers never finished: the connection is closed without an answer.
        let mut slow = tokio::net::TcpStream::connect(addr).await.expect("slow");
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("write");
        let mut answer = Vec::new();
        tokio::time::timeout(DEADLINE, slow.read_to_end(&mut answer))
            .await
            .expect("closed in time")
            .expect("read");
        assert!(
            !String::from_utf8_lossy(&answer).contains("200 OK"),
            "{}",
            String::from_utf8_lossy(&answer)
        );

        // A request slower than the request limit: HTTP 408.
        let response = tokio::time::timeout(DEADLINE, reqwest::get(format!("http://{addr}/never")))
            .await
            .expect("answered in time")
            .expect("response");
        assert_eq!(response.status(), reqwest::StatusCode::REQUEST_TIMEOUT);
    }
}
