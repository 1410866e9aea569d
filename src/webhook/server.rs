//! HTTPS transport: the axum [`router`] (`POST /mutate`, `GET /readyz`) and [`serve`], which
//! takes the connections [`crate::tls::incoming`] has accepted and handshaken and hands each to
//! hyper-util's HTTP/1.1 + HTTP/2 server. On shutdown it stops accepting and lets every
//! connection finish the reviews in flight before closing.

use std::{sync::Arc, time::Duration};

use axum::{
    Router,
    body::Bytes,
    extract::{DefaultBodyLimit, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
    service::TowerToHyperService,
};
use tokio::{
    net::{TcpListener, TcpStream},
    task::JoinSet,
};
use tokio_rustls::server::TlsStream;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::{
    admin::{self, Readiness},
    tls::{self, ServerTls},
};

use super::{
    Error,
    review::{Answer, Reviewer},
};

/// HTTP/1.1: how long a connection may take to send a request's headers, counted from when the
/// server starts waiting for them, so it also closes idle keep-alive connections. Longer than the
/// 90 s after which Go clients (the API server) drop idle connections themselves, so a healthy
/// client always closes first and never races a server-side close with a new review.
const HTTP1_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(120);

/// HTTP/2 (what the API server negotiates): ping an idle connection this often and close it if
/// the ping is not answered within [`HTTP2_KEEP_ALIVE_TIMEOUT`], so dead peers do not hold tasks.
const HTTP2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
const HTTP2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The webhook's routes: `POST /mutate`, and `GET /readyz` (the process's readiness, so that the
/// kubelet's HTTPS probe checks this TLS server too). Bodies above `max_body_bytes` get HTTP 413.
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

/// Serves `router` over TLS on `listener` until `shutdown`, then drains open connections
/// (in-flight reviews are answered, idle keep-alive connections are closed).
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerTls>,
    router: Router,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "webhook listening (HTTPS)");
    }
    let mut accepted = tls::incoming(tls, listener, shutdown.clone());
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            next = accepted.next() => match next {
                Some(Ok(stream)) => {
                    connections.spawn(serve_connection(stream, router.clone(), shutdown.clone()));
                }
                Some(Err(e)) => tracing::debug!(error = %e, "webhook connection not accepted"),
                None => break,
            },
        }
    }
    drop(accepted);
    tracing::info!(
        connections = connections.len(),
        "webhook draining in-flight reviews"
    );
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Serves one handshaken connection until the client closes it, or, after `shutdown`, until
/// the reviews in flight on it are answered.
async fn serve_connection(
    stream: TlsStream<TcpStream>,
    router: Router,
    shutdown: CancellationToken,
) {
    let peer = stream.get_ref().0.peer_addr().ok();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HTTP1_HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(HTTP2_KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(HTTP2_KEEP_ALIVE_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router));
    tokio::pin!(conn);
    tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                tracing::debug!(?peer, error = %e, "webhook connection ended with an error");
            }
        }
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            if let Err(e) = conn.await {
                tracing::debug!(?peer, error = %e, "webhook connection ended with an error while draining");
            }
        }
    }
}
