//! Limits every listener shares, and the HTTP connection loop of the webhook and admin servers.
//!
//! - [`accept`] takes TCP connections only while fewer than a cap are open: excess connections
//!   are not refused, they wait in the kernel's accept backlog until one closes (a burst is
//!   served late rather than failed; a flood fills the backlog, not the process).
//! - [`Limited`] is a connection that frees its place when dropped; it serves tonic too.
//! - [`serve_http`] serves axum over hyper with a header read timeout, a whole-request timeout
//!   (which bounds reading the body), an HTTP/2 stream cap and keep-alive pings, and drains the
//!   requests in flight on shutdown.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    Router,
    extract::Request,
    http::StatusCode,
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use futures::{Stream, StreamExt};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
    service::TowerToHyperService,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;

/// Pause after a failed `accept` (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A connection holding its place under the listener's connection cap until dropped.
pub struct Limited<S> {
    inner: S,
    _permit: OwnedSemaphorePermit,
}

impl<S> Limited<S> {
    /// `inner`, counted against the cap `permit` was taken from.
    pub fn new(inner: S, permit: OwnedSemaphorePermit) -> Self {
        Self {
            inner,
            _permit: permit,
        }
    }

    /// The connection itself.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Limited<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Limited<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Limited<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// A connection that must send its first bytes within a deadline. hyper's header read timeout
/// starts only once it knows the protocol, which it learns from those bytes: a client that
/// connects and stays silent would otherwise hold its connection place for ever.
struct FirstBytes<S> {
    inner: S,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> FirstBytes<S> {
    fn new(inner: S, within: Duration) -> Self {
        Self {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(within))),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FirstBytes<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.deadline = None;
                }
                Poll::Ready(result)
            }
            Poll::Pending => match this.deadline.as_mut().map(|d| d.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no request within the header read timeout",
                ))),
                _ => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FirstBytes<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Accepts a TCP connection once one of `cap`'s places is free (waiting in the kernel backlog
/// until then), or `None` on `shutdown`. Connections are sent without delay (`TCP_NODELAY`):
/// every server here answers small requests.
pub async fn accept_one(
    listener: &TcpListener,
    cap: &Arc<Semaphore>,
    shutdown: &CancellationToken,
    server: &'static str,
) -> Option<(TcpStream, std::net::SocketAddr, OwnedSemaphorePermit)> {
    loop {
        let permit = tokio::select! {
            () = shutdown.cancelled() => return None,
            permit = cap.clone().acquire_owned() => permit.ok()?,
        };
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return None,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((tcp, peer)) => {
                let _ = tcp.set_nodelay(true);
                return Some((tcp, peer, permit));
            }
            Err(e) => {
                tracing::warn!(server, error = %e, "accepting a connection failed");
                drop(permit);
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// Serves `router` over plain HTTP on `listener` until `shutdown`, with at most
/// `max_connections` open and `http`'s time limits: the admin port and the researchers' view.
/// `server` names the listener in logs of its connections; the first log line says `{what}
/// listening` with the address.
pub async fn serve_plain(
    listener: TcpListener,
    router: Router,
    server: &'static str,
    what: &str,
    max_connections: usize,
    http: HttpLimits,
    shutdown: CancellationToken,
) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "{what} listening");
    }
    let incoming = accept(listener, max_connections, shutdown.clone(), server);
    serve_http(incoming, router, http, shutdown).await;
}

/// The plaintext connections of `listener`, at most `max_connections` open at once, until
/// `shutdown`.
pub fn accept(
    listener: TcpListener,
    max_connections: usize,
    shutdown: CancellationToken,
    server: &'static str,
) -> impl Stream<Item = io::Result<Limited<TcpStream>>> + Send + 'static {
    let cap = Arc::new(Semaphore::new(max_connections));
    futures::stream::unfold(
        (listener, cap, shutdown),
        move |(listener, cap, shutdown)| async move {
            let (tcp, _, permit) = accept_one(&listener, &cap, &shutdown, server).await?;
            Some((Ok(Limited::new(tcp, permit)), (listener, cap, shutdown)))
        },
    )
}

/// Time limits and caps of an HTTP server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// HTTP/1.1: how long a connection may take to send a request's headers, counted from when
    /// the server starts waiting for them (so it also closes idle keep-alive connections).
    pub header_read: Duration,
    /// How long one request may take, reading its body included; a slower one gets HTTP 408.
    pub request: Duration,
    /// HTTP/2: streams (requests) one connection may have open at once.
    pub max_streams: u32,
    /// HTTP/2: ping an idle connection this often, and close it if the ping is not answered
    /// within `keep_alive_timeout`, so dead peers do not hold tasks.
    pub keep_alive_interval: Duration,
    pub keep_alive_timeout: Duration,
}

/// Serves `router` on the connections `incoming` yields until `shutdown`, then drains them:
/// requests in flight are answered, idle keep-alive connections are closed.
pub async fn serve_http<S, I>(
    incoming: I,
    router: Router,
    limits: HttpLimits,
    shutdown: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    I: Stream<Item = io::Result<S>> + Send,
{
    let request_limit = limits.request;
    let router = router.layer(middleware::from_fn(move |req: Request, next: Next| {
        request_deadline(request_limit, req, next)
    }));
    let mut incoming = Box::pin(incoming);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            next = incoming.next() => match next {
                Some(Ok(stream)) => {
                    connections.spawn(serve_connection(stream, router.clone(), limits, shutdown.clone()));
                }
                Some(Err(e)) => tracing::debug!(error = %e, "connection not accepted"),
                None => break,
            },
        }
    }
    // Stop accepting (the listener closes) before draining.
    drop(incoming);
    if !connections.is_empty() {
        tracing::info!(
            connections = connections.len(),
            "draining in-flight requests"
        );
    }
    while connections.join_next().await.is_some() {}
}

/// Answers HTTP 408 when a request (body read included) takes longer than `limit`.
async fn request_deadline(limit: Duration, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(response) => response,
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            format!("the request took longer than {limit:?}\n"),
        )
            .into_response(),
    }
}

/// Serves one connection until the client closes it, or, after `shutdown`, until the requests
/// in flight on it are answered.
async fn serve_connection<S>(
    stream: S,
    router: Router,
    limits: HttpLimits,
    shutdown: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .keep_alive_interval(limits.keep_alive_interval)
        .keep_alive_timeout(limits.keep_alive_timeout);
    let stream = FirstBytes::new(stream, limits.header_read);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router));
    tokio::pin!(conn);
    tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error while draining");
            }
        }
    }
}

/// Test support: an HTTP/2 client that opens a connection and then answers nothing (no SETTINGS
/// acknowledgement, no PING answer, no request), to show that a server's keep-alive finds such a
/// dead peer and closes the connection.
#[cfg(any(test, feature = "test-support"))]
pub mod silent_http2 {
    use std::time::Duration;

    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

    /// The client connection preface (RFC 9113, section 3.4) and an empty SETTINGS frame.
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    /// Frame type of PING (RFC 9113, section 6.7), and its ACK flag.
    const PING: u8 = 0x6;
    const ACK: u8 = 0x1;

    /// What the server did within the watch.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Observed {
        /// The server sent a PING asking for an answer.
        pub pinged: bool,
        /// The server closed the connection (end of stream or reset).
        pub closed: bool,
    }

    /// Sends the preface on `stream`, then only reads for at most `within`, noting the server's
    /// PINGs and whether it closes the connection.
    pub async fn watch<S>(mut stream: S, within: Duration) -> Observed
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut seen = Observed::default();
        if stream.write_all(PREFACE).await.is_err() || stream.flush().await.is_err() {
            seen.closed = true;
            return seen;
        }
        let read_frames = async {
            loop {
                // Frame header: 24-bit length, type, flags, stream identifier.
                let mut header = [0u8; 9];
                if stream.read_exact(&mut header).await.is_err() {
                    return;
                }
                let len = usize::from(header[0]) << 16
                    | usize::from(header[1]) << 8
                    | usize::from(header[2]);
                if header[3] == PING && header[4] & ACK == 0 {
                    seen.pinged = true;
                }
                let mut payload = vec![0u8; len];
                if stream.read_exact(&mut payload).await.is_err() {
                    return;
                }
            }
        };
        let closed = tokio::time::timeout(within, read_frames).await.is_ok();
        seen.closed = closed;
        seen
    }
}
