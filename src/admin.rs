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
    #[error("admin server failed: {0}")]
    Serve(#[source] std::io::Error),
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

/// Serves `router` on `listener` until `shutdown` is cancelled, then drains open requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "admin server listening");
    }
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .map_err(Error::Serve)
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

    #[tokio::test]
    async fn livez_is_always_ok() {
        let app = router(Arc::new(Registry::default()), Readiness::default());
        assert_eq!(get_status(app, "/livez").await.0, StatusCode::OK);
    }
}
