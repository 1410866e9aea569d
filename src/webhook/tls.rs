//! The webhook's TLS: HTTPS with HTTP/2 and HTTP/1.1 offered (TLS 1.2+), its serving certificate
//! reloaded from disk. Everything but these choices lives in [`crate::runtime::tls`].

use std::{path::Path, sync::Arc};

use crate::runtime::tls::{self, ServerTls, Settings};

/// The webhook's name in TLS logs and in the `server` label of the TLS metrics.
pub const SERVER: &str = "webhook";

/// The API server calls admission webhooks over HTTP/1.1 (it offers only `http/1.1`, so that
/// concurrent reviews open connections of their own and spread over the Service's endpoints);
/// HTTP/2 is offered to the clients that prefer it (probes, curl, other callers).
const ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

/// Loads the serving certificate and key into the webhook's TLS configuration.
pub fn load(cert: &Path, key: &Path, metrics: &tls::Metrics) -> Result<Arc<ServerTls>, tls::Error> {
    let settings = Settings {
        server: SERVER,
        cert,
        key,
        client_ca: None,
        alpn: ALPN,
    };
    ServerTls::load(&settings, metrics)
}
