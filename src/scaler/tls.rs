//! The scaler's TLS: gRPC over TLS, or mTLS when a client CA is given, with certificate, key and
//! client CA reloaded from disk. Everything but these choices lives in [`crate::runtime::tls`].

use std::{path::Path, sync::Arc};

use crate::runtime::tls::{self, ServerTls, Settings};

/// The scaler's name in TLS logs and in the `server` label of the TLS metrics.
pub const SERVER: &str = "scaler";

/// gRPC is HTTP/2 only, and gRPC-Go clients such as KEDA's require ALPN `h2`.
const ALPN: &[&[u8]] = &[b"h2"];

/// Loads the certificate, key and (for mTLS) client CA into the scaler's TLS configuration.
pub fn load(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    metrics: &tls::Metrics,
) -> Result<Arc<ServerTls>, tls::Error> {
    let settings = Settings {
        server: SERVER,
        cert,
        key,
        client_ca,
        alpn: ALPN,
    };
    ServerTls::load(&settings, metrics)
}
