//! Serving certificates read from PEM files and swapped in place when the files change, shared
//! by the webhook's HTTPS server and the scaler's gRPC server: a rotated certificate (a renewed
//! Secret, cert-manager) is used for new handshakes without a restart and without disturbing
//! connections or requests already in flight.
//!
//! A half-written rotation (new certificate, old key) is detected because the key must match
//! the certificate; the previous pair stays in use until the files agree again.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use rustls::{
    crypto::CryptoProvider,
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio_util::sync::CancellationToken;

/// Errors reading TLS files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {}: {source}", path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {reason}", path.display())]
    BadFile { path: PathBuf, reason: String },
}

/// The serving certificate, reloadable.
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: ArcSwap<CertifiedKey>,
    /// The file contents last loaded, to notice changes cheaply.
    loaded: Mutex<(Vec<u8>, Vec<u8>)>,
    reloads: Counter,
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// The crypto provider the certificate was loaded with (for building server configurations).
    pub fn provider(&self) -> Arc<CryptoProvider> {
        self.provider.clone()
    }

    /// Loads the certificate chain and key; fails if either is missing, unreadable or they do not
    /// belong together.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<Self>, Error> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let (cert_pem, key_pem) = read_pair(cert_path, key_path)?;
        let key = certified_key(&cert_pem, &key_pem, &provider, cert_path, key_path)?;
        Ok(Arc::new(Self {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            provider,
            current: ArcSwap::from_pointee(key),
            loaded: Mutex::new((cert_pem, key_pem)),
            reloads: Counter::default(),
        }))
    }

    /// Counter of successful reloads (each server registers it under its own name).
    pub fn reloads(&self) -> Counter {
        self.reloads.clone()
    }

    /// The DER of the leaf certificate currently served.
    pub fn current_leaf(&self) -> Option<CertificateDer<'static>> {
        self.current.load().cert.first().cloned()
    }

    /// Re-reads the files; swaps the certificate if they changed and are valid. Returns whether
    /// a new certificate is now served.
    pub fn reload(&self) -> Result<bool, Error> {
        let (cert_pem, key_pem) = read_pair(&self.cert_path, &self.key_path)?;
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if loaded.0 == cert_pem && loaded.1 == key_pem {
            return Ok(false);
        }
        let key = certified_key(
            &cert_pem,
            &key_pem,
            &self.provider,
            &self.cert_path,
            &self.key_path,
        )?;
        self.current.store(Arc::new(key));
        *loaded = (cert_pem, key_pem);
        self.reloads.inc();
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
                Ok(true) => tracing::info!(
                    cert = %self.cert_path.display(),
                    "serving certificate reloaded"
                ),
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    error = %e,
                    "certificate files changed but cannot be used yet; still serving the previous certificate"
                ),
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

fn read_pair(cert_path: &Path, key_path: &Path) -> Result<(Vec<u8>, Vec<u8>), Error> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| Error::ReadFile {
            path: path.to_path_buf(),
            source,
        })
    };
    Ok((read(cert_path)?, read(key_path)?))
}

fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
    cert_path: &Path,
    key_path: &Path,
) -> Result<CertifiedKey, Error> {
    let bad = |path: &Path, reason: String| Error::BadFile {
        path: path.to_path_buf(),
        reason,
    };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(cert_path, e.to_string()))?;
    if chain.is_empty() {
        return Err(bad(cert_path, "no PEM certificate found".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| bad(key_path, e.to_string()))?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| {
        bad(
            key_path,
            format!("does not match {}: {e}", cert_path.display()),
        )
    })
}
