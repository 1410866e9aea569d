//! The TLS metrics shared by every server: one family, a `server` label per TLS server, so that a
//! process running both the webhook and the scaler exports it once.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    server: &'static str,
}

/// The served certificates' expiry, by server.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    expiry: Family<ServerLabels, Gauge>,
}

impl Metrics {
    /// Registers `tls_certificate_expiry_timestamp_seconds{server}` (under the registry's
    /// prefix: `nightshift_tls_certificate_expiry_timestamp_seconds`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "When the serving certificate expires (its notAfter), in seconds since the Unix \
             epoch, by server; updated on every (re)load",
            self.expiry.clone(),
        );
    }

    /// The expiry gauge of `server` (the same one on every call).
    pub(super) fn expiry(&self, server: &'static str) -> Gauge {
        self.expiry.get_or_create(&ServerLabels { server }).clone()
    }
}
