//! TLS for the scaler's gRPC server, reloaded from disk: the serving certificate is a
//! [`ReloadingCert`] (shared with the webhook) and the client CA of mTLS is re-read with it, so
//! rotated files are used for new connections without a restart while connections (and calls)
//! already in flight carry on with the session they negotiated.
//!
//! Connections are accepted here (a rustls handshake per TCP connection, bounded in time) and
//! handed to tonic as a stream of TLS streams, so every handshake sees the current configuration.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use rustls::{RootCertStore, ServerConfig, server::WebPkiClientVerifier};
use rustls_pki_types::{CertificateDer, pem::PemObject};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::tls::{Error, ReloadingCert};

/// A handshake that has not finished by then is dropped: a slow or silent client must not hold
/// a task and a socket for ever. KEDA completes one in milliseconds.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause after a failed `accept` (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Handshaken connections waiting for tonic to take them; tonic takes them at once, so this
/// only smooths bursts.
const PENDING_CONNECTIONS: usize = 64;

/// The scaler's TLS configuration, reloadable.
pub struct ScalerTls {
    cert: Arc<ReloadingCert>,
    client_ca_path: Option<PathBuf>,
    /// The client CA file's content last loaded.
    client_ca_loaded: Mutex<Vec<u8>>,
    config: ArcSwap<ServerConfig>,
    reloads: Counter,
}

impl ScalerTls {
    /// Loads the certificate, key and (for mTLS) client CA; fails if any is missing, unreadable
    /// or invalid.
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Arc<Self>, Error> {
        let cert = ReloadingCert::load(cert, key)?;
        let ca_pem = client_ca.map(read).transpose()?;
        let config = server_config(&cert, client_ca.zip(ca_pem.as_deref()))?;
        Ok(Arc::new(Self {
            cert,
            client_ca_path: client_ca.map(Path::to_path_buf),
            client_ca_loaded: Mutex::new(ca_pem.unwrap_or_default()),
            config: ArcSwap::from_pointee(config),
            reloads: Counter::default(),
        }))
    }

    /// `TLS` or `mTLS`.
    pub fn mode(&self) -> &'static str {
        if self.client_ca_path.is_some() {
            "mTLS"
        } else {
            "TLS"
        }
    }

    /// Successful reloads of the certificate or the client CA.
    pub fn reloads(&self) -> Counter {
        self.reloads.clone()
    }

    /// An acceptor with the current configuration.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.load_full())
    }

    /// Re-reads the files; uses what changed if it is valid. Returns whether anything new is now
    /// in use. A bad file leaves the previous material in use (and is reported).
    pub fn reload(&self) -> Result<bool, Error> {
        // Both are tried every time, so that a bad certificate does not hold back a good CA.
        let cert = self.cert.reload();
        let ca = self.reload_client_ca();
        let changed = matches!(cert, Ok(true)) || matches!(ca, Ok(true));
        if changed {
            self.reloads.inc();
        }
        cert?;
        ca?;
        Ok(changed)
    }

    fn reload_client_ca(&self) -> Result<bool, Error> {
        let Some(path) = &self.client_ca_path else {
            return Ok(false);
        };
        let pem = read(path)?;
        let mut loaded = self
            .client_ca_loaded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if *loaded == pem {
            return Ok(false);
        }
        // The certificate resolver is shared: only the client verifier is new.
        let config = server_config(&self.cert, Some((path, &pem)))?;
        self.config.store(Arc::new(config));
        *loaded = pem;
        Ok(true)
    }

    /// Polls the files every `interval` until `shutdown`.
    pub async fn watch(self: Arc<Self>, interval: Duration, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                () = shutdown.cancelled() => return,
            }
            match self.reload() {
                Ok(true) => tracing::info!(mode = self.mode(), "scaler TLS files reloaded"),
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    error = %e,
                    "scaler TLS files changed but cannot be used yet; still serving the previous ones"
                ),
            }
        }
    }

    /// Accepts connections on `listener` and yields them after a TLS handshake with the
    /// configuration current at that moment, until `shutdown`. Failed handshakes (no client
    /// certificate, unknown CA, plaintext) are logged and dropped.
    pub fn incoming(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
        let (tx, rx) = tokio::sync::mpsc::channel(PENDING_CONNECTIONS);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = shutdown.cancelled() => break,
                    accepted = listener.accept() => accepted,
                };
                let (tcp, peer) = match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "scaler: accepting a connection failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = self.acceptor();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send(Ok(stream)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "scaler: TLS handshake failed");
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "scaler: TLS handshake timed out");
                        }
                    }
                });
            }
        });
        ReceiverStream::new(rx)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::ReadFile {
        path: path.to_path_buf(),
        source,
    })
}

/// TLS 1.2+ only, HTTP/2 only (gRPC; gRPC-Go clients such as KEDA's require ALPN `h2`), client
/// certificates from `client_ca` required when given.
fn server_config(
    cert: &Arc<ReloadingCert>,
    client_ca: Option<(&Path, &[u8])>,
) -> Result<ServerConfig, Error> {
    let provider = cert.provider();
    let bad = |path: &Path, reason: String| Error::BadFile {
        path: path.to_path_buf(),
        reason,
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| bad(Path::new("(TLS configuration)"), e.to_string()))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some((path, pem)) => {
            let mut roots = RootCertStore::empty();
            for der in CertificateDer::pem_slice_iter(pem) {
                let der = der.map_err(|e| bad(path, e.to_string()))?;
                roots.add(der).map_err(|e| bad(path, e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(bad(path, "no PEM certificate found".into()));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| bad(path, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(cert.clone());
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}
