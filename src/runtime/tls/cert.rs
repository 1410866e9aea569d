//! The serving certificate: read from PEM files, handed to rustls as its certificate resolver,
//! and swapped in place when the files change, so new handshakes get the rotated certificate
//! while connections already open keep the session they negotiated.
//!
//! A half-written rotation (new certificate, old key) is detected because the key must match
//! the certificate; the previous pair stays in use until the files agree again.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, Ordering},
    },
};

use arc_swap::ArcSwap;
use rustls::{
    crypto::CryptoProvider,
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

use super::Error;

/// The serving certificate, reloadable.
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: ArcSwap<CertifiedKey>,
    /// The leaf certificate's notAfter, in seconds since the Unix epoch, of `current`.
    not_after: AtomicI64,
    /// The file contents last loaded, to notice changes cheaply.
    loaded: Mutex<(Vec<u8>, Vec<u8>)>,
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
    /// Loads the certificate chain and key; fails if either is missing, unreadable or they do not
    /// belong together.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<Self>, Error> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let (cert_pem, key_pem) = read_pair(cert_path, key_path)?;
        let served = served_pair(&cert_pem, &key_pem, &provider, cert_path, key_path)?;
        Ok(Arc::new(Self {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            provider,
            current: ArcSwap::from_pointee(served.key),
            not_after: AtomicI64::new(served.not_after),
            loaded: Mutex::new((cert_pem, key_pem)),
        }))
    }

    /// The crypto provider the certificate was loaded with (for building server configurations).
    pub fn provider(&self) -> Arc<CryptoProvider> {
        self.provider.clone()
    }

    /// The certificate file, for logs.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// The DER of the leaf certificate currently served.
    pub fn current_leaf(&self) -> Option<CertificateDer<'static>> {
        self.current.load().cert.first().cloned()
    }

    /// When the leaf certificate currently served expires (its notAfter), in seconds since the
    /// Unix epoch.
    pub fn not_after(&self) -> i64 {
        self.not_after.load(Ordering::Relaxed)
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
        let served = served_pair(
            &cert_pem,
            &key_pem,
            &self.provider,
            &self.cert_path,
            &self.key_path,
        )?;
        self.current.store(Arc::new(served.key));
        self.not_after.store(served.not_after, Ordering::Relaxed);
        *loaded = (cert_pem, key_pem);
        Ok(true)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// Reads a file whole, naming it in the error.
pub(super) fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::ReadFile {
        path: path.to_path_buf(),
        source,
    })
}

fn read_pair(cert_path: &Path, key_path: &Path) -> Result<(Vec<u8>, Vec<u8>), Error> {
    Ok((read(cert_path)?, read(key_path)?))
}

/// A certificate and key that belong together, and the leaf's expiry.
struct ServedPair {
    key: CertifiedKey,
    not_after: i64,
}

fn served_pair(
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
    cert_path: &Path,
    key_path: &Path,
) -> Result<ServedPair, Error> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::bad(cert_path, e))?;
    let Some(leaf) = chain.first() else {
        return Err(Error::bad(cert_path, "no PEM certificate found"));
    };
    let not_after = not_after(leaf).map_err(|reason| Error::bad(cert_path, reason))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| Error::bad(key_path, e))?;
    let key = CertifiedKey::from_der(chain, key, provider).map_err(|e| {
        Error::bad(
            key_path,
            format!("does not match {}: {e}", cert_path.display()),
        )
    })?;
    Ok(ServedPair { key, not_after })
}

/// The notAfter of a DER certificate, in seconds since the Unix epoch.
fn not_after(der: &CertificateDer<'_>) -> Result<i64, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|e| format!("cannot read the certificate's validity: {e}"))?;
    Ok(cert.validity().not_after.timestamp())
}
