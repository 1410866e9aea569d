//! HTTPS transport: the axum [`router`] (`POST /mutate`, `GET /readyz`) and [`serve`], which
//! takes the connections [`crate::runtime::tls::incoming`] has accepted and handshaken and serves
//! them with [`crate::runtime::listen::serve_http`], within the webhook's [`Limits`]. On shutdown
//! it stops accepting and lets every connection finish the reviews in flight before closing.

use std::{sync::Arc, time::Duration};

use axum::{
    Router,
    body::Bytes,
    extract::{DefaultBodyLimit, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{
    runtime::admin::{self, Readiness},
    runtime::listen::{self, HttpLimits},
    runtime::tls::{self, AcceptLimits, ServerTls},
};

use super::{
    Error,
    review::{Answer, Reviewer},
};

/// The webhook's limits (docs/security.md, "Listener limits").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub accept: AcceptLimits,
    pub http: HttpLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            accept: AcceptLimits {
                // The API server calls webhooks over HTTP/1.1: one connection per review in
                // flight, up to 25 kept idle per webhook host (client-go's pool), the kubelet
                // one per probe. 256 leaves room for the concurrent reviews of several API
                // server replicas and for reconnect storms, and bounds memory and file
                // descriptors against a flood (the port is open to all, see the NetworkPolicy);
                // a connection beyond it waits in the listen backlog, it is not refused.
                max_connections: 256,
                // A handshake costs a signature (~0.1-1 ms of CPU); 32 at once keeps a burst of
                // new connections from starving reviews in flight on existing ones.
                max_handshakes: 32,
                // The API server completes a handshake in milliseconds; its webhook call times
                // out after 5 s (timeoutSeconds), so a handshake slower than that is useless.
                handshake_timeout: Duration::from_secs(10),
            },
            http: HttpLimits {
                // Longer than the 90 s after which Go clients (the API server) drop idle
                // connections themselves, so a healthy client always closes first and never
                // races a server-side close with a new review.
                header_read: Duration::from_secs(120),
                // A review is answered from memory in well under a millisecond; the API server
                // gives up after timeoutSeconds (5 s, at most 30 s). A request still reading its
                // body after 10 s is a slow client holding a task.
                request: Duration::from_secs(10),
                // For HTTP/2 clients (the API server itself uses HTTP/1.1): 100 streams per
                // connection, Go's own default, bounds what one connection holds at once.
                max_streams: 100,
                // An HTTP/2 peer that vanished without closing (a node lost, a partition) is
                // found within 50 s instead of holding a connection place and a task for ever;
                // a live client answers pings at once, and one ping per 30 s costs nothing. An
                // idle HTTP/1.1 connection is closed by `header_read`.
                keep_alive_interval: Duration::from_secs(30),
                keep_alive_timeout: Duration::from_secs(20),
            },
        }
    }
}

/// The webhook's routes: `POST /mutate`, reviewed on the connection's own task, and `GET /readyz`
/// (the process's readiness, so that the kubelet's HTTPS probe checks this TLS server too).
/// Bodies above `max_body_bytes` get HTTP 413.
pub fn router(reviewer: Reviewer, max_body_bytes: usize, readiness: Readiness) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(Arc::new(reviewer))
        .merge(admin::readiness_router(readiness))
}

async fn mutate(State(reviewer): State<Arc<Reviewer>>, body: Bytes) -> Response {
    match reviewer.review(&body).await {
        Answer::Review(json) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            json,
        )
            .into_response(),
        Answer::BadRequest(message) => (StatusCode::BAD_REQUEST, message).into_response(),
    }
}

/// Serves `router` over TLS on `listener` within `limits` until `shutdown`, then drains open
/// connections (in-flight reviews are answered, idle keep-alive connections are closed).
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerTls>,
    router: Router,
    limits: Limits,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "webhook listening (HTTPS)");
    }
    let accepted = tls::incoming(tls, listener, limits.accept, shutdown.clone());
    listen::serve_http(accepted, router, limits.http, shutdown).await;
    Ok(())
}
