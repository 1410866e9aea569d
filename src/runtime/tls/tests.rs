//! The TLS room end to end on loopback: files loaded, connections accepted and handshaken by
//! [`incoming`], rotations picked up by the reload loop, the expiry metric as exported.

use std::{
    io::Write,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use prometheus_client::registry::Registry;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio_util::sync::CancellationToken;

use super::{AcceptLimits, Metrics, ServerTls, Settings, incoming};

/// How often the reload loop re-reads the files in these tests: short, so they take little time.
const RELOAD_INTERVAL: Duration = Duration::from_millis(10);

/// Bound on each wait for the reload loop; it acts within a few intervals.
const DEADLINE: Duration = Duration::from_secs(10);

/// Limits far above what these tests open.
const LIMITS: AcceptLimits = AcceptLimits {
    max_connections: 64,
    max_handshakes: 16,
    handshake_timeout: Duration::from_secs(10),
};

/// A CA that issues `localhost` serving certificates.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A serving certificate and its key, in PEM.
struct Leaf {
    cert: String,
    key: String,
}

impl Ca {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let issuer =
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("ca");
        Self { issuer }
    }

    fn leaf(&self) -> Leaf {
        self.leaf_until(None)
    }

    /// A leaf whose notAfter is midnight UTC of `(year, month, day)` when given.
    fn leaf_until(&self, not_after: Option<(i32, u8, u8)>) -> Leaf {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        if let Some((y, m, d)) = not_after {
            params.not_after = rcgen::date_time_ymd(y, m, d);
        }
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.issuer.der().clone()).expect("root");
        roots
    }
}

fn write(dir: &Path, leaf: &Leaf) {
    std::fs::write(dir.join("tls.crt"), &leaf.cert).expect("write cert");
    std::fs::write(dir.join("tls.key"), &leaf.key).expect("write key");
}

fn load(dir: &Path, server: &'static str, metrics: &Metrics) -> Arc<ServerTls> {
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let settings = Settings {
        server,
        cert: &cert,
        key: &key,
        client_ca: None,
        alpn: &[b"h2"],
    };
    ServerTls::load(&settings, metrics).expect("TLS files load")
}

fn der(leaf: &Leaf) -> Vec<u8> {
    CertificateDer::from_pem_slice(leaf.cert.as_bytes())
        .expect("der")
        .to_vec()
}

/// A server accepting through [`incoming`] with its reload loop running, until dropped.
struct Served {
    addr: std::net::SocketAddr,
    stop: CancellationToken,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn serve(tls: Arc<ServerTls>) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = CancellationToken::new();
    tokio::spawn(tls.clone().watch(RELOAD_INTERVAL, stop.clone()));
    let mut connections = incoming(tls, listener, LIMITS, stop.clone());
    tokio::spawn(async move {
        // Holds each handshaken connection open until the client closes it.
        while let Some(Ok(conn)) = tokio_stream::StreamExt::next(&mut connections).await {
            tokio::spawn(async move {
                let mut conn = conn;
                let _ = tokio::io::AsyncReadExt::read(&mut conn, &mut [0u8; 1]).await;
            });
        }
    });
    Served { addr, stop }
}

/// The leaf certificate a new handshake is served.
async fn served_leaf(addr: std::net::SocketAddr, ca: &Ca) -> Vec<u8> {
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(ca.roots())
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::try_from("localhost").expect("name");
    let tls = connector.connect(name, tcp).await.expect("handshake");
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .expect("peer certificate")
        .to_vec()
}

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let end = tokio::time::Instant::now() + DEADLINE;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < end,
            "{what}: not within {DEADLINE:?}"
        );
        tokio::time::sleep(RELOAD_INTERVAL).await;
    }
}

/// Log lines written while a test runs, for the reload loop's warnings.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_rotated_certificate_is_served_by_the_next_handshake() {
    crate::install_crypto_provider();
    let ca = Ca::new();
    let (old, new) = (ca.leaf(), ca.leaf());
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), &old);
    let tls = load(dir.path(), "test", &Metrics::default());
    let served = serve(tls.clone()).await;
    assert_eq!(served_leaf(served.addr, &ca).await, der(&old));

    write(dir.path(), &new);
    eventually("the rotated certificate served", async || {
        served_leaf(served.addr, &ca).await == der(&new)
    })
    .await;
    assert_eq!(tls.reloads().get(), 1, "one rotation, one reload");
}

#[tokio::test]
async fn a_broken_file_keeps_the_previous_certificate_and_is_logged() {
    crate::install_crypto_provider();
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // The test runtime has one thread, so the reload loop logs through this subscriber.
    let _logging = tracing::subscriber::set_default(subscriber);
    let ca = Ca::new();
    let good = ca.leaf();
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), &good);
    let tls = load(dir.path(), "test", &Metrics::default());
    let served = serve(tls.clone()).await;

    std::fs::write(dir.path().join("tls.crt"), "not a certificate").expect("write");
    eventually("the broken file reported", async || {
        logs.text().contains("cannot be used yet")
    })
    .await;
    let text = logs.text();
    assert!(text.contains("WARN"), "{text}");
    assert!(text.contains("tls.crt"), "the file is named: {text}");
    assert_eq!(served_leaf(served.addr, &ca).await, der(&good));
    assert_eq!(tls.reloads().get(), 0);

    // Once the files are good again, the loop picks them up.
    let next = ca.leaf();
    write(dir.path(), &next);
    eventually("the repaired files served", async || {
        served_leaf(served.addr, &ca).await == der(&next)
    })
    .await;
}

#[tokio::test]
async fn the_expiry_metric_is_the_leaf_not_after_by_server_and_follows_reloads() {
    crate::install_crypto_provider();
    let ca = Ca::new();
    let (webhook_dir, scaler_dir) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    write(webhook_dir.path(), &ca.leaf_until(Some((2031, 5, 17))));
    write(scaler_dir.path(), &ca.leaf_until(Some((2030, 1, 2))));
    let metrics = Metrics::default();
    let mut registry = Registry::with_prefix(crate::runtime::admin::METRICS_PREFIX);
    metrics.register(&mut registry);
    let webhook = load(webhook_dir.path(), "webhook", &metrics);
    let _scaler = load(scaler_dir.path(), "scaler", &metrics);

    let unix = |at: &str| {
        at.parse::<jiff::Timestamp>()
            .expect("timestamp")
            .as_second()
    };
    let line = |server: &str, at: &str| {
        format!(
            "nightshift_tls_certificate_expiry_timestamp_seconds{{server=\"{server}\"}} {}\n",
            unix(at)
        )
    };
    let exported = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        text
    };
    let text = exported();
    assert!(
        text.contains(&line("webhook", "2031-05-17T00:00:00Z")),
        "{text}"
    );
    assert!(
        text.contains(&line("scaler", "2030-01-02T00:00:00Z")),
        "{text}"
    );
    assert_eq!(
        text.matches("# TYPE nightshift_tls_certificate_expiry_timestamp_seconds gauge")
            .count(),
        1,
        "one family for both servers: {text}"
    );

    write(webhook_dir.path(), &ca.leaf_until(Some((2032, 2, 29))));
    assert!(webhook.reload().expect("reload"), "rotated");
    let text = exported();
    assert!(
        text.contains(&line("webhook", "2032-02-29T00:00:00Z")),
        "{text}"
    );
    assert!(
        text.contains(&line("scaler", "2030-01-02T00:00:00Z")),
        "{text}"
    );
}
