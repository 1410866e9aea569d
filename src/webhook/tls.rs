//! TLS for the webhook: a rustls server configuration (TLS 1.2 and 1.3 only) whose certificate
//! is a [`ReloadingCert`] (see [`crate::tls`]), so a rotated certificate is used for new
//! handshakes without a restart and without disturbing requests in flight.

use std::sync::Arc;

use rustls::ServerConfig;

pub use crate::tls::ReloadingCert;

use super::Error;

/// A rustls server configuration for the webhook: TLS 1.2+ only, HTTP/2 and HTTP/1.1 offered.
pub fn server_config(cert: Arc<ReloadingCert>) -> Result<Arc<ServerConfig>, Error> {
    let provider = cert.provider();
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| Error::TlsConfig(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
