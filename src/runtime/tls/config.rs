//! A server's rustls configuration, reloadable: the serving certificate (a [`ReloadingCert`]) and,
//! for mTLS, the client CA, both re-read by the one reload loop ([`ServerTls::watch`]) that the
//! webhook and the scaler run. Every handshake takes the configuration current at that moment.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use arc_swap::ArcSwap;
use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use rustls::{RootCertStore, ServerConfig, server::WebPkiClientVerifier};
use rustls_pki_types::{CertificateDer, pem::PemObject};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::{Error, Metrics, ReloadingCert, cert::read};

/// What a TLS server is served with.
#[derive(Clone, Copy, Debug)]
pub struct Settings<'a> {
    /// Names the server in logs and in the `server` label of [`Metrics`].
    pub server: &'static str,
    /// PEM certificate chain, leaf first.
    pub cert: &'a Path,
    /// PEM private key of the leaf.
    pub key: &'a Path,
    /// PEM CA bundle that client certificates must chain to (mTLS); `None`: no client
    /// certificate is asked for.
    pub client_ca: Option<&'a Path>,
    /// Application protocols offered in ALPN, most preferred first.
    pub alpn: &'a [&'a [u8]],
}

/// The client CA file of mTLS and its content last loaded.
struct ClientCa {
    path: PathBuf,
    loaded: Mutex<Vec<u8>>,
}

/// A server's TLS configuration, reloadable.
pub struct ServerTls {
    server: &'static str,
    cert: Arc<ReloadingCert>,
    client_ca: Option<ClientCa>,
    alpn: Vec<Vec<u8>>,
    config: ArcSwap<ServerConfig>,
    reloads: Counter,
    expiry: Gauge,
}

impl ServerTls {
    /// Loads the certificate, key and (for mTLS) client CA; fails if any is missing, unreadable
    /// or invalid. The certificate's expiry is reported in `metrics` from now on.
    pub fn load(settings: &Settings<'_>, metrics: &Metrics) -> Result<Arc<Self>, Error> {
        let cert = ReloadingCert::load(settings.cert, settings.key)?;
        let alpn: Vec<Vec<u8>> = settings.alpn.iter().map(|p| p.to_vec()).collect();
        let ca_pem = settings.client_ca.map(read).transpose()?;
        let config = server_config(&cert, &alpn, settings.client_ca.zip(ca_pem.as_deref()))?;
        let expiry = metrics.expiry(settings.server);
        expiry.set(cert.not_after());
        Ok(Arc::new(Self {
            server: settings.server,
            cert,
            client_ca: settings.client_ca.zip(ca_pem).map(|(path, pem)| ClientCa {
                path: path.to_path_buf(),
                loaded: Mutex::new(pem),
            }),
            alpn,
            config: ArcSwap::from_pointee(config),
            reloads: Counter::default(),
            expiry,
        }))
    }

    /// The server's name, as in [`Settings::server`].
    pub fn server(&self) -> &'static str {
        self.server
    }

    /// `TLS` or `mTLS`.
    pub fn mode(&self) -> &'static str {
        if self.client_ca.is_some() {
            "mTLS"
        } else {
            "TLS"
        }
    }

    /// Successful reloads of the certificate or the client CA (each server registers it under
    /// its own name).
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
        if matches!(cert, Ok(true)) {
            self.expiry.set(self.cert.not_after());
        }
        let changed = matches!(cert, Ok(true)) || matches!(ca, Ok(true));
        if changed {
            self.reloads.inc();
        }
        cert?;
        ca?;
        Ok(changed)
    }

    /// The reload loop: re-reads the files every `interval` until `shutdown`, logging what was
    /// loaded and what cannot be used yet.
    pub async fn watch(self: Arc<Self>, interval: Duration, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                () = shutdown.cancelled() => return,
            }
            match self.reload() {
                Ok(true) => tracing::info!(
                    server = self.server,
                    mode = self.mode(),
                    cert = %self.cert.cert_path().display(),
                    "TLS files reloaded"
                ),
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    server = self.server,
                    error = %e,
                    "TLS files changed but cannot be used yet; still serving the previous ones"
                ),
            }
        }
    }

    fn reload_client_ca(&self) -> Result<bool, Error> {
        let Some(ca) = &self.client_ca else {
            return Ok(false);
        };
        let pem = read(&ca.path)?;
        let mut loaded = ca
            .loaded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if *loaded == pem {
            return Ok(false);
        }
        // The certificate resolver is shared: only the client verifier is new.
        let config = server_config(&self.cert, &self.alpn, Some((&ca.path, &pem)))?;
        self.config.store(Arc::new(config));
        *loaded = pem;
        Ok(true)
    }
}

/// TLS 1.2+ only, `alpn` offered, client certificates from `client_ca` required when given.
fn server_config(
    cert: &Arc<ReloadingCert>,
    alpn: &[Vec<u8>],
    client_ca: Option<(&Path, &[u8])>,
) -> Result<ServerConfig, Error> {
    let provider = cert.provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(Error::Config)?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some((path, pem)) => {
            let mut roots = RootCertStore::empty();
            for der in CertificateDer::pem_slice_iter(pem) {
                let der = der.map_err(|e| Error::bad(path, e))?;
                roots.add(der).map_err(|e| Error::bad(path, e))?;
            }
            if roots.is_empty() {
                return Err(Error::bad(path, "no PEM certificate found"));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| Error::bad(path, e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(cert.clone());
    config.alpn_protocols = alpn.to_vec();
    Ok(config)
}
