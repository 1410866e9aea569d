//! The accept loop of both TLS servers: a rustls handshake per TCP connection, bounded in time
//! and in number, with the configuration current at that moment; handshaken connections come
//! out as a stream, which tonic serves directly and the webhook hands to hyper one by one.

use std::{sync::Arc, time::Duration};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::ServerTls;
use crate::runtime::listen::{self, Limited};

/// Handshaken connections waiting for the server to take them; servers take them at once, so
/// this only smooths bursts.
const PENDING_CONNECTIONS: usize = 64;

/// How many connections a TLS server holds, and how it treats handshakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcceptLimits {
    /// Connections open at once, handshaking or handshaken; more wait in the kernel backlog.
    pub max_connections: usize,
    /// Handshakes in flight at once (each costs a signature); more wait in the kernel backlog.
    pub max_handshakes: usize,
    /// A handshake that has not finished by then is dropped: a slow or silent client must not
    /// hold a task, a socket and a handshake place for ever.
    pub handshake_timeout: Duration,
}

/// A handshaken connection, holding its place under the connection cap.
pub type TlsConnection = Limited<TlsStream<TcpStream>>;

/// Accepts connections on `listener` within `limits` and yields them after a TLS handshake with
/// the configuration current at that moment, until `shutdown` (the listener is closed then).
/// Failed handshakes (no or unknown client certificate, plaintext, timeout) are logged and
/// dropped, freeing their places.
pub fn incoming(
    tls: Arc<ServerTls>,
    listener: TcpListener,
    limits: AcceptLimits,
    shutdown: CancellationToken,
) -> ReceiverStream<Result<TlsConnection, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(PENDING_CONNECTIONS);
    let server = tls.server();
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let handshakes = Arc::new(Semaphore::new(limits.max_handshakes));
    tokio::spawn(async move {
        loop {
            // A handshake place first, then a connection place and the connection itself.
            let handshake = tokio::select! {
                () = shutdown.cancelled() => break,
                permit = handshakes.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let Some((tcp, peer, place)) =
                listen::accept_one(&listener, &connections, &shutdown, server).await
            else {
                break;
            };
            let acceptor = tls.acceptor();
            let tx = tx.clone();
            tokio::spawn(async move {
                let handshaken =
                    tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await;
                drop(handshake);
                match handshaken {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(Limited::new(stream, place))).await;
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
