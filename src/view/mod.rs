//! The researchers' view: a read-only web page of the GPU pool (use now, research by namespace,
//! recent preemptions, charts of the last day and week) and the same data as JSON, on a port of
//! its own.
//!
//! - [`page`] (pure): the [`page::View`] data and its HTML.
//! - this module: the options, the thin axum [`router`] over the running pool controller, and
//!   the server.
//!
//! Aggregate data only: node names, namespaces, pod names of preempted pods, GPU counts. No
//! secret, no pod spec, no write.

pub mod page;

use std::net::SocketAddr;

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

use crate::pool::run::{Shared, lock};

/// Options of the researchers' view.
#[derive(Clone, Debug, Args)]
pub struct ViewArgs {
    /// Address of the researchers' web page (read-only pool view, `/` and `/api/view`).
    #[arg(long, env = "NIGHTSHIFT_VIEW_ADDR", default_value = "0.0.0.0:8090")]
    pub view_addr: SocketAddr,
}

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

/// The view of the running controller now.
fn current(controller: &Shared, filter: &Filter) -> page::View {
    let c = lock(controller);
    let report = c.status(Timestamp::now());
    page::build(&report, c.history(), filter.namespace())
}

/// `/` (the page), `/api/view` (its data as JSON) and `/livez`, over a running controller.
pub fn router(controller: Shared) -> Router {
    Router::new()
        .route(
            "/",
            get(
                |State(c): State<Shared>, Query(f): Query<Filter>| async move {
                    let view = current(&c, &f);
                    (
                        [(header::CACHE_CONTROL, "no-store")],
                        Html(page::render(&view)),
                    )
                        .into_response()
                },
            ),
        )
        .route(
            "/api/view",
            get(
                |State(c): State<Shared>, Query(f): Query<Filter>| async move {
                    Json(current(&c, &f))
                },
            ),
        )
        .route("/livez", get(|| async { "ok\n" }))
        .with_state(controller)
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
