//! The researchers' view: a read-only web page of the GPU pool (use now, research by namespace,
//! recent preemptions, charts of the last day and week) and the same data as JSON, on a port of
//! its own.
//!
//! - [`model`] (pure): the [`model::View`] data, computed from the pool's status and history.
//! - [`html`] (pure): the page, rendered from a [`model::View`].
//! - [`services`] (pure): demand against replicas per inference service, a week in memory.
//! - [`rebuild`]: the history read back from Prometheus after a restart.
//! - this module: the options, the thin axum [`router`] over the running pool controller, the
//!   sampler of the scaler's decisions, and [`start`], which wires them.
//!
//! Aggregate data only: node names, namespaces, pod names of preempted pods, GPU counts. No
//! secret, no pod spec, no write.

pub mod html;
pub mod model;
pub mod rebuild;
pub mod services;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

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
    pool::run::{Shared, lock},
    runtime::Context,
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

/// Errors of the view server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot bind the view server to {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("view server failed: {0}")]
    Serve(#[source] std::io::Error),
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

/// What the view reads: the running controller, the [`Timeline`] and the clock.
#[derive(Clone)]
pub struct ViewState {
    pub controller: Shared,
    timeline: Arc<Mutex<Timeline>>,
    clock: Clock,
}

impl ViewState {
    /// A view of `controller` whose history starts at `started`, on the wall clock.
    pub fn new(controller: Shared, started: Timestamp) -> Self {
        Self {
            controller,
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

    /// The view now. The timeline is locked before the controller, everywhere.
    fn current(&self, filter: &Filter) -> model::View {
        let t = self.timeline();
        let c = lock(&self.controller);
        let report = c.status(self.now());
        let timeline = model::Timeline {
            pool: c.history(),
            services: &t.services,
            origin: &t.origin,
        };
        model::build(&report, timeline, filter.namespace())
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

/// Binds the view's port.
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })
}

/// Serves `router` on `listener` until `token` is cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    token: CancellationToken,
) -> Result<(), Error> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "researchers' view listening");
    }
    axum::serve(listener, router)
        .with_graceful_shutdown(token.cancelled_owned())
        .await
        .map_err(Error::Serve)
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
}
