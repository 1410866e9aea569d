//! Serving TLS, once for both servers (the webhook's HTTPS server and the scaler's gRPC
//! server): certificate, key and client CA read from PEM files and reloaded when they change, so
//! a rotation (a renewed Secret, cert-manager) is used for new handshakes without a restart and
//! without disturbing connections or requests already in flight.
//!
//! - [`ReloadingCert`]: the serving certificate, rustls's certificate resolver, swapped in place.
//! - [`ServerTls`]: a server's rustls configuration (TLS 1.2+, its ALPN protocols, the client CA
//!   of mTLS when given), the one reload loop ([`ServerTls::watch`]) and its metrics.
//! - [`incoming`]: the accept loop, a bounded TLS handshake per TCP connection.
//! - [`Metrics`]: the served certificate's expiry, by server.
//!
//! Knows nothing of HTTP or gRPC: each server says which protocols it offers and how it is named.

mod accept;
mod cert;
mod config;
mod metrics;

use std::path::{Path, PathBuf};

pub use accept::{AcceptLimits, TlsConnection, incoming};
pub use cert::ReloadingCert;
pub use config::{ServerTls, Settings};
pub use metrics::Metrics;

/// Errors reading TLS files or building a configuration from them.
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
    #[error("TLS configuration: {0}")]
    Config(#[source] rustls::Error),
}

impl Error {
    fn bad(path: &Path, reason: impl ToString) -> Self {
        Self::BadFile {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }
}

#[cfg(test)]
mod tests;
