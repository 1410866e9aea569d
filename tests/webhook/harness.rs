//! A webhook server on a free loopback port with freshly generated certificates, stopped when
//! the test ends.

use std::{collections::BTreeMap, path::Path, sync::Arc, time::Duration};

pub use nightshift::test_support::webhook::research_cluster;
use nightshift::{
    runtime::tls::ServerTls,
    test_support::{self, cluster::FixedCluster},
    webhook::{
        Error,
        certs::{self, GenerateArgs},
        cluster::{ClusterError, ClusterView},
        mutate::{MutationPolicy, PriorityClassInfo, PriorityClasses},
        review::Metrics,
        server,
    },
};
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Body limit used by the test server (small, so the oversize test stays cheap).
pub const MAX_BODY: usize = 256 * 1024;

pub struct Server {
    pub addr: std::net::SocketAddr,
    pub client: reqwest::Client,
    pub ca_pem: Vec<u8>,
    pub cert_args: GenerateArgs,
    pub tls: Arc<ServerTls>,
    pub metrics: Metrics,
    pub shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), Error>>>,
    /// The readiness condition the server's `GET /readyz` waits for (not ready at start).
    pub ready: nightshift::runtime::admin::ReadyHandle,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Server {
    pub async fn start(cluster: FixedCluster) -> Self {
        Self::start_with(Arc::new(cluster)).await
    }

    pub async fn start_with(cluster: Arc<dyn ClusterView>) -> Self {
        Self::start_limited(cluster, server::Limits::default()).await
    }

    /// A webhook server with the given listener limits.
    pub async fn start_limited(cluster: Arc<dyn ClusterView>, limits: server::Limits) -> Self {
        nightshift::install_crypto_provider();
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert_args, tls) = test_support::certs::generate(dir.path());
        let reviewer = test_support::webhook::reviewer(MutationPolicy::default(), cluster);
        let metrics = reviewer.metrics.clone();
        let readiness = nightshift::runtime::admin::Readiness::default();
        let ready = readiness.register("test caches synced");
        let router = server::router(reviewer, MAX_BODY, readiness);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        // Fast polling so rotation tests do not wait long.
        tokio::spawn(
            tls.clone()
                .watch(Duration::from_millis(20), shutdown.clone()),
        );
        let task = tokio::spawn(server::serve(
            listener,
            tls.clone(),
            router,
            limits,
            shutdown.clone(),
        ));
        let ca_pem = std::fs::read(dir.path().join(certs::CA_CERT)).expect("ca");
        let client = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(&ca_pem).expect("ca pem")])
            .build()
            .expect("client");
        Self {
            addr,
            client,
            ca_pem,
            cert_args,
            tls,
            metrics,
            shutdown,
            task: Some(task),
            ready,
            _dir: dir,
        }
    }

    /// The Service-like URL: the name in the certificate, resolved to the loopback port.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}/mutate", self.addr.port())
    }

    /// Waits for the server task to end (after `shutdown`).
    pub async fn join(mut self) -> Result<(), Error> {
        let task = self.task.take().expect("running");
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("server stopped in time")
            .expect("server task")
    }

    /// A TLS connection to the server (no ALPN: HTTP/1.1).
    pub async fn connect_tls(
        &self,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(&self.ca_pem).expect("ca der"))
            .expect("root");
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(self.addr).await?;
        let name = ServerName::try_from("127.0.0.1").expect("name");
        connector.connect(name, tcp).await
    }

    /// The leaf certificate the server presents in a new handshake.
    pub async fn served_leaf(&self) -> Vec<u8> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(&self.ca_pem).expect("ca der"))
            .expect("root");
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect");
        let name = ServerName::try_from("127.0.0.1").expect("name");
        let tls = connector.connect(name, tcp).await.expect("handshake");
        tls.get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .expect("peer cert")
            .to_vec()
    }
}

/// The leaf certificate (DER) in a certificate directory.
pub fn leaf_in(dir: &Path) -> Vec<u8> {
    let pem = std::fs::read(dir.join(certs::TLS_CERT)).expect("tls.crt");
    CertificateDer::from_pem_slice(&pem).expect("der").to_vec()
}

/// Polls `condition` until it holds, failing the test after `deadline`.
pub async fn wait_until<F>(deadline: Duration, mut condition: F)
where
    F: AsyncFnMut() -> bool,
{
    let end = tokio::time::Instant::now() + deadline;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < end,
            "condition not met within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A pod as the API server sends it, with one container requesting GPUs.
pub fn gpu_pod(extra: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "labels": {"app": "train"}},
        "spec": {
            "containers": [{"name": "main", "image": "trainer:1",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "priority": 0,
            "preemptionPolicy": "PreemptLowerPriority",
            "terminationGracePeriodSeconds": 30
        }
    });
    if let (Some(p), Value::Object(e)) = (pod.as_object_mut(), extra) {
        for (k, v) in e {
            match (p.get_mut(&k), v) {
                (Some(Value::Object(dst)), Value::Object(src)) => dst.extend(src),
                (_, v) => {
                    p.insert(k, v);
                }
            }
        }
    }
    pod
}

pub fn admission_review(uid: &str, namespace: &str, mut pod: Value, dry_run: bool) -> Value {
    pod["metadata"]["namespace"] = json!(namespace);
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "train",
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// A cluster whose namespace lookups take a while, to hold a review in flight.
pub struct SlowCluster {
    inner: FixedCluster,
    delay: Duration,
    pub entered: Arc<tokio::sync::Notify>,
}

impl SlowCluster {
    pub fn new(inner: FixedCluster, delay: Duration) -> Self {
        Self {
            inner,
            delay,
            entered: Arc::new(tokio::sync::Notify::new()),
        }
    }
}

impl PriorityClasses for SlowCluster {
    fn priority_class(&self, name: &str) -> Option<PriorityClassInfo> {
        self.inner.priority_class(name)
    }
}

#[async_trait::async_trait]
impl ClusterView for SlowCluster {
    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<Option<BTreeMap<String, String>>, ClusterError> {
        self.entered.notify_one();
        tokio::time::sleep(self.delay).await;
        self.inner.namespace_labels(namespace).await
    }
}
