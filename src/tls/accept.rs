//! The accept loop of both TLS servers: a rustls handshake per TCP connection, bounded in time,
//! with the configuration current at that moment; handshaken connections come out as a stream,
//! which tonic serves directly and the webhook hands to hyper one by one.

use std::{sync::Arc, time::Duration};

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::ServerTls;

/// A handshake that has not finished by then is dropped: a slow or silent client must not hold
/// a task and a socket for ever. The API server and KEDA complete one in milliseconds.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause after a failed `accept` (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Handshaken connections waiting for the server to take them; servers take them at once, so
/// this only smooths bursts.
const PENDING_CONNECTIONS: usize = 64;

/// Accepts connections on `listener` and yields them after a TLS handshake with the
/// configuration current at that moment, until `shutdown` (the listener is closed then).
/// Failed handshakes (no or unknown client certificate, plaintext, timeout) are logged and
/// dropped. Connections are sent without delay (`TCP_NODELAY`): both servers answer small
/// requests.
pub fn incoming(
    tls: Arc<ServerTls>,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(PENDING_CONNECTIONS);
    let server = tls.server();
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(server, error = %e, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = tls.acceptor();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(server, %peer, error = %e, "TLS handshake failed");
                    }
                    Err(_) => {
                        tracing::debug!(server, %peer, "TLS handshake timed out");
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
