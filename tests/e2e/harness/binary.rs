//! The nightshift binary in the end-to-end environment: the real binary (`nightshift run`) started
//! outside the cluster against the test API server, with a serving certificate made by
//! `nightshift certs generate`, and its webhook registered through `manifests/overlays/local`
//! (rendered with kustomize, `caBundle` and URL filled in by a wrapping kustomization, as
//! docs/deploy.md's "Running nightshift outside the cluster" shows).
//!
//! Every port is chosen by the OS (`127.0.0.1:0`) and read back from nightshift's own log; the
//! process is killed when its guard drops, and its log stays in the component log directory
//! (kept when a scenario fails).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::config::Kubeconfig;

use crate::harness::cluster::{Cluster, POOL, POOL_LABEL};
use crate::harness::process::{Process, tail};
use crate::harness::wait;

/// The binary under test, built by cargo for this test target.
pub const BIN: &str = env!("CARGO_BIN_EXE_nightshift");

/// How long nightshift gets to bind its ports, and then to sync its caches: far above the
/// second or two it needs, for a loaded 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Certificate files are checked this often, so that a rotation is picked up within a second
/// (the default, 10 s, would only make the rotation test slower).
const CERT_RELOAD: &str = "500ms";

/// Identity in the pool controller's Lease: the same for every nightshift the suite starts, so
/// that a restarted process takes the Lease back at once instead of waiting for it to expire.
const IDENTITY: &str = "nightshift-e2e";

/// The names of what the local overlay registers, for clean-up.
pub const WEBHOOK_CONFIG: &str = "nightshift";
pub const ADMISSION_POLICY: &str = "nightshift-research-priority";
/// Its bindings: research namespaces, research pod labels.
pub const ADMISSION_POLICY_BINDINGS: [&str; 2] = [
    "nightshift-research-priority-namespaces",
    "nightshift-research-priority-pods",
];
pub const NAMESPACE: &str = "nightshift-system";

/// A running `nightshift run`. Dropping it kills the process.
pub struct Nightshift {
    proc: Process,
    /// HTTPS address of the webhook.
    pub webhook: SocketAddr,
    /// Address of the admin server (`/readyz`, `/metrics`, `/status`).
    pub admin: SocketAddr,
    /// Address of the KEDA external scaler (gRPC, plaintext).
    pub scaler: SocketAddr,
    /// Address of the researchers' view (`/`, `/api/view`).
    pub view: SocketAddr,
    http: reqwest::Client,
}

/// Where nightshift's files live during a scenario: the serving certificate and a private copy
/// of `manifests/` (so that wrapping kustomizations and generated certificates never touch the
/// source tree).
pub struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    pub fn new() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("nightshift-e2e-ws-")
            .tempdir()?;
        copy_tree(&manifests_dir(), &dir.path().join("manifests"))?;
        let ws = Self { dir };
        generate_certs(&ws.certs())?;
        Ok(ws)
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Directory with `ca.crt`, `tls.crt` and `tls.key`.
    pub fn certs(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    /// Renders `manifests/overlays/local` wrapped by a kustomization that points both webhooks
    /// at `https://127.0.0.1:<port>/mutate` and fills `caBundle` with this workspace's CA.
    pub fn render_local_overlay(&self, port: u16) -> Result<String> {
        let url = format!("https://127.0.0.1:{port}/mutate");
        self.render_wrapped(
            "local",
            "../manifests/overlays/local",
            &format!(
                r#"  - target: {{kind: MutatingWebhookConfiguration, name: nightshift}}
    patch: |-
      - {{op: replace, path: /webhooks/0/clientConfig/url, value: "{url}"}}
      - {{op: replace, path: /webhooks/1/clientConfig/url, value: "{url}"}}
"#
            ),
        )
    }

    /// Renders `manifests/base` as production registers it (both webhooks called through the
    /// `nightshift` Service), `caBundle` filled with this workspace's CA, without the objects
    /// that only a real node runs (Deployment, PodDisruptionBudget, NetworkPolicy): the
    /// instances run outside and the scenario lists them in the Service's EndpointSlices.
    pub fn render_service_registration(&self) -> Result<String> {
        let mut patches = String::new();
        for (api_version, kind) in [
            ("apps/v1", "Deployment"),
            ("policy/v1", "PodDisruptionBudget"),
            ("networking.k8s.io/v1", "NetworkPolicy"),
        ] {
            patches.push_str(&format!(
                "  - patch: |-\n      $patch: delete\n      apiVersion: {api_version}\n      \
                 kind: {kind}\n      metadata:\n        name: nightshift\n        \
                 namespace: {NAMESPACE}\n"
            ));
        }
        self.render_wrapped("service", "../manifests/base", &patches)
    }

    /// Renders `resource` wrapped by a kustomization in `<workspace>/<name>` that fills every
    /// webhook's `caBundle` with this workspace's CA and applies `patches` (a YAML list body).
    fn render_wrapped(&self, name: &str, resource: &str, patches: &str) -> Result<String> {
        let wrap = self.dir.path().join(name);
        std::fs::create_dir_all(&wrap)?;
        std::fs::copy(self.certs().join("ca.crt"), wrap.join("ca.crt"))?;
        // kustomize refuses absolute paths to other kustomizations: the path is relative.
        std::fs::write(
            wrap.join("kustomization.yaml"),
            format!(
                r#"resources: ["{resource}"]
secretGenerator:
  - name: e2e-webhook-ca
    files: [ca.crt]
    options:
      disableNameSuffixHash: true
      annotations:
        config.kubernetes.io/local-config: "true"
replacements:
  - source: {{kind: Secret, name: e2e-webhook-ca, fieldPath: "data.[ca.crt]"}}
    targets:
      - select: {{kind: MutatingWebhookConfiguration, name: nightshift}}
        fieldPaths: ["webhooks.*.clientConfig.caBundle"]
        options: {{create: true}}
patches:
{patches}"#
            ),
        )?;
        kustomize_build(&wrap)
    }

    /// Applies the local overlay (namespace, ServiceAccount, RBAC, PriorityClasses, webhook
    /// configuration for `port`, admission policy) as the administrator.
    pub fn apply_local_overlay(&self, cluster: &Cluster, port: u16) -> Result<()> {
        let rendered = self.render_local_overlay(port)?;
        kubectl_ok(cluster, &["apply", "-f", "-"], Some(&rendered))?;
        Ok(())
    }
}

impl Nightshift {
    /// Starts `nightshift run` with `kubeconfig`, every port on `127.0.0.1:0` except the
    /// webhook's when `webhook_port` is given (a restart keeps the registered URL), and waits
    /// until it has reported its addresses.
    pub async fn start(
        cluster: &Cluster,
        name: &str,
        kubeconfig: &Path,
        certs: &Path,
        webhook_port: u16,
    ) -> Result<Self> {
        Self::start_with(cluster, name, kubeconfig, certs, webhook_port, &[]).await
    }

    /// [`Nightshift::start`] with `extra` options appended (a scenario's headroom, windows, ...);
    /// an `--option=value` in `extra` replaces the default of that option.
    pub async fn start_with(
        cluster: &Cluster,
        name: &str,
        kubeconfig: &Path,
        certs: &Path,
        webhook_port: u16,
        extra: &[String],
    ) -> Result<Self> {
        let mut args: Vec<String> = vec![
            "--log-format=json".into(),
            "--log=info".into(),
            "run".into(),
            "--admin-addr=127.0.0.1:0".into(),
            "--scaler-addr=127.0.0.1:0".into(),
            "--view-addr=127.0.0.1:0".into(),
            format!("--webhook-addr=127.0.0.1:{webhook_port}"),
            format!("--webhook-cert={}", certs.join("tls.crt").display()),
            format!("--webhook-key={}", certs.join("tls.key").display()),
            format!("--webhook-cert-reload-interval={CERT_RELOAD}"),
            // The kwok pool's taint, which research GPU pods must tolerate.
            format!("--pool-taints={POOL_LABEL}={POOL}:NoSchedule"),
            format!("--pool-label={POOL_LABEL}"),
            format!("--pool-lease-namespace={NAMESPACE}"),
            format!("--pool-identity={IDENTITY}"),
            // A SIGTERM'd nightshift should not hold the test for the production 20 s.
            "--drain-timeout=2s".into(),
        ];
        // An option in `extra` replaces the default above (a second instance's identity, a
        // webhook address other than loopback).
        args.retain(|a| {
            let Some((flag, _)) = a.split_once('=') else {
                return true;
            };
            !extra.iter().any(|e| e.starts_with(&format!("{flag}=")))
        });
        args.extend_from_slice(extra);
        let mut proc = Process::spawn_with_env(
            name,
            Path::new(BIN),
            &args,
            &[("KUBECONFIG", kubeconfig.display().to_string())],
            cluster.log_dir(),
        )?;
        let log = proc.log_path().to_path_buf();
        let started = Instant::now();
        let (webhook, admin, scaler, view) = loop {
            proc.check_running()?;
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let webhook = logged_addr(&text, "webhook listening (HTTPS)");
            let admin = logged_addr(&text, "admin server listening");
            let scaler = logged_addr(&text, "scaler gRPC server listening");
            let view = logged_addr(&text, "researchers' view listening");
            if let (Some(w), Some(a), Some(s), Some(v)) = (webhook, admin, scaler, view) {
                break (w, a, s, v);
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "{name} did not report its addresses within {START_TIMEOUT:?}; end of its log:\n{}",
                    tail(&log, 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        Ok(Self {
            proc,
            webhook,
            admin,
            scaler,
            view,
            http,
        })
    }

    /// Waits until `/readyz` answers 200 (every cache synced, every server up); returns how
    /// long it took from the call.
    pub async fn wait_ready(&mut self) -> Result<Duration> {
        let t = Instant::now();
        let url = format!("http://{}/readyz", self.admin);
        let proc = &mut self.proc;
        wait::http_ok(
            &format!("{url} to answer 200"),
            &self.http,
            &url,
            START_TIMEOUT,
            || proc.check_running(),
        )
        .await
        .with_context(|| format!("end of the log:\n{}", self.log_tail(30)))?;
        Ok(t.elapsed())
    }

    /// A client of the admin server, independent of the process guard.
    pub fn admin_api(&self) -> AdminApi {
        AdminApi {
            http: self.http.clone(),
            addr: self.admin,
        }
    }

    /// GETs a path of the admin server and returns the body (fails on a non-2xx status).
    pub async fn admin_get(&self, path: &str) -> Result<String> {
        self.admin_api().get(path).await
    }

    /// GET `path` on the researchers' view; the body of a 200 answer.
    pub async fn view_get(&self, path: &str) -> Result<String> {
        let url = format!("http://{}{path}", self.view);
        let response = self.http.get(&url).send().await?;
        let status = response.status();
        let body = response.text().await?;
        anyhow::ensure!(status.is_success(), "{url}: {status}: {body}");
        Ok(body)
    }

    /// The value of a counter or gauge in `/metrics` (summed over label sets); 0 if absent.
    pub async fn metric(&self, name: &str) -> Result<f64> {
        self.admin_api().metric(name).await
    }

    pub fn check_running(&mut self) -> Result<()> {
        self.proc.check_running()
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.proc.log_path()).unwrap_or_default()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        tail(self.proc.log_path(), lines)
    }

    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) the process: a hung webhook that accepts
    /// connections and never answers.
    pub fn freeze(&mut self, frozen: bool) -> Result<()> {
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let status = std::process::Command::new("kill")
            .arg(signal)
            .arg(self.proc.id().to_string())
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill {signal} {} failed: {status}", self.proc.id());
        }
        Ok(())
    }

    /// Kills the process (SIGKILL: no draining, as when a node dies) and waits for it.
    pub fn kill(&mut self) {
        self.proc.kill();
    }
}

/// Opens a new TLS connection to the webhook, verified against `ca.crt` in `certs` for the name
/// `localhost` (as the API server verifies it against `caBundle`), and tells whether the leaf
/// certificate it served is the one now in `tls.crt`.
pub async fn serves_current_certificate(webhook: SocketAddr, certs: &Path) -> Result<bool> {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    let ca = CertificateDer::from_pem_file(certs.join("ca.crt"))?;
    let current = CertificateDer::from_pem_file(certs.join("tls.crt"))?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca)?;
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(webhook).await?;
    let tls = connector
        .connect(ServerName::try_from("localhost")?, tcp)
        .await
        .context("TLS handshake with the webhook")?;
    let served = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .context("the webhook served no certificate")?;
    Ok(served.as_ref() == current.as_ref())
}

/// HTTP client of nightshift's admin server.
#[derive(Clone)]
pub struct AdminApi {
    http: reqwest::Client,
    addr: SocketAddr,
}

impl AdminApi {
    /// GETs a path and returns the body (fails on a non-2xx status).
    pub async fn get(&self, path: &str) -> Result<String> {
        let resp = self
            .http
            .get(format!("http://{}{path}", self.addr))
            .send()
            .await?;
        let status = resp.status();
        let body = resp.text().await?;
        if !status.is_success() {
            bail!("GET {path}: {status}: {body}");
        }
        Ok(body)
    }

    /// The value of a counter or gauge in `/metrics` (summed over label sets, or of one series
    /// when `name` ends with its label set); 0 if absent.
    pub async fn metric(&self, name: &str) -> Result<f64> {
        let text = self.get("/metrics").await?;
        Ok(text
            .lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }
}

/// The address in the first JSON log line whose message is `message` (field `addr`).
fn logged_addr(log: &str, message: &str) -> Option<SocketAddr> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["message"] == message)
        .and_then(|v| {
            // Logged with Display (`127.0.0.1:80`) or Debug of an Option (`Some(127.0.0.1:80)`).
            let addr = v["addr"].as_str()?;
            let addr = addr
                .strip_prefix("Some(")
                .and_then(|a| a.strip_suffix(')'))
                .unwrap_or(addr);
            addr.parse().ok()
        })
}

/// Removes what [`Workspace::apply_local_overlay`] registered cluster-wide (webhook
/// configuration, admission policy and binding), so that later scenarios run without a webhook
/// whose backend is gone. Runs on drop, so also when a scenario fails.
pub struct Registration<'a> {
    cluster: &'a Cluster,
}

impl<'a> Registration<'a> {
    pub fn new(cluster: &'a Cluster) -> Self {
        Self { cluster }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        for (kind, name) in [
            ("mutatingwebhookconfiguration", WEBHOOK_CONFIG),
            (
                "validatingadmissionpolicybinding",
                ADMISSION_POLICY_BINDINGS[0],
            ),
            (
                "validatingadmissionpolicybinding",
                ADMISSION_POLICY_BINDINGS[1],
            ),
            ("validatingadmissionpolicy", ADMISSION_POLICY),
        ] {
            let _ = self
                .cluster
                .kubectl(&["delete", kind, name, "--ignore-not-found"], None);
        }
    }
}

/// Deletes namespace `ns` and waits until it is gone, ending its pods at once: the namespace
/// controller otherwise waits out the pods' grace periods (research pods keep up to 30 s) before
/// it looks again. Terminating namespaces accept no new pods, so controllers cannot refill it.
pub async fn delete_namespace_now(c: &Cluster, ns: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use kube::api::{Api, DeleteParams, ListParams};
    let _ = Api::<Namespace>::all(c.client.clone())
        .delete(ns, &DeleteParams::default())
        .await;
    let _ = Api::<Pod>::namespaced(c.client.clone(), ns)
        .delete_collection(
            &DeleteParams::default().grace_period(0),
            &ListParams::default(),
        )
        .await;
    c.delete_namespace(ns).await
}

/// [`delete_namespace_now`] for several namespaces at once (the namespace controller takes
/// about 5 s per namespace here, concurrently as well as alone). Returns the first error.
pub async fn delete_namespaces_now(c: &Cluster, names: &[&str]) -> Result<()> {
    futures::future::join_all(names.iter().map(|n| delete_namespace_now(c, n)))
        .await
        .into_iter()
        .collect()
}

/// Leaves the pool as a lending scenario found it: its namespaces deleted (pods ended at once)
/// and no spare mark left behind by the nightshift it ran.
pub async fn clean_pool(c: &Cluster, namespaces: &[&str]) -> Result<()> {
    let deleted = delete_namespaces_now(c, namespaces).await;
    deleted.and(remove_spare_marks(c))
}

/// Runs `nightshift certs generate --dir <dir>`: a CA (kept if present) and a serving
/// certificate for localhost/127.0.0.1 (the defaults).
pub fn generate_certs(dir: &Path) -> Result<()> {
    let out = std::process::Command::new(BIN)
        .args(["certs", "generate", "--dir"])
        .arg(dir)
        .output()
        .context("running nightshift certs generate")?;
    if !out.status.success() {
        bail!(
            "nightshift certs generate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Runs kubectl as the administrator; fails with its stderr unless it succeeded.
pub fn kubectl_ok(cluster: &Cluster, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let out = cluster.kubectl(args, stdin)?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The pool controller's spare marks on GPU nodes.
pub const SPARE: &str = "nightshift.io/spare";
pub const SPARE_GPUS: &str = "nightshift.io/spare-gpus";

/// Spare-GPU marks of the pool nodes: node name → `Some(spare GPUs)` when marked spare.
pub async fn spare_marks(c: &Cluster) -> Result<BTreeMap<String, Option<String>>> {
    Ok(spare_labels(c)
        .await?
        .into_iter()
        .map(|(node, labels)| {
            let spare = (labels.get(SPARE).map(String::as_str) == Some("true"))
                .then(|| labels.get(SPARE_GPUS).cloned().unwrap_or_default());
            (node, spare)
        })
        .collect())
}

/// The spare labels (`nightshift.io/spare*`) of every pool node, by node.
pub async fn spare_labels(c: &Cluster) -> Result<BTreeMap<String, BTreeMap<String, String>>> {
    let nodes: Api<Node> = Api::all(c.client.clone());
    let list = nodes
        .list(&ListParams::default().labels(POOL_LABEL))
        .await?;
    Ok(list
        .items
        .into_iter()
        .map(|n| {
            let labels = n.metadata.labels.unwrap_or_default();
            let spare = labels
                .into_iter()
                .filter(|(k, _)| k.starts_with(SPARE))
                .collect();
            (n.metadata.name.unwrap_or_default(), spare)
        })
        .collect())
}

/// Removes the spare marks from every GPU-pool node (as if someone had), so that a scenario can
/// check that nightshift writes them again.
pub fn remove_spare_marks(cluster: &Cluster) -> Result<()> {
    kubectl_ok(
        cluster,
        &[
            "label",
            "nodes",
            "-l",
            POOL_LABEL,
            &format!("{SPARE}-"),
            &format!("{SPARE_GPUS}-"),
        ],
        None,
    )?;
    Ok(())
}

/// Writes a kubeconfig for the test API server (address and CA from the administrator's) that
/// authenticates with `token`.
pub fn token_kubeconfig(cluster: &Cluster, token: &str, path: &Path) -> Result<()> {
    let admin = Kubeconfig::read_from(&cluster.kubeconfig)?;
    let c = admin
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .context("the admin kubeconfig names no cluster")?;
    let server = c
        .server
        .clone()
        .context("no server in the admin kubeconfig")?;
    let ca = c
        .certificate_authority
        .clone()
        .context("no CA file in the admin kubeconfig")?;
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {server}\n    \
             certificate-authority: {ca}\nusers:\n- name: sa\n  user:\n    token: {token}\n\
             contexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: sa\n\
             current-context: e2e\n"
        ),
    )?;
    Ok(())
}

/// The repository's `manifests/` directory.
pub fn manifests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests")
}

/// kustomize: `$NIGHTSHIFT_KUSTOMIZE`, else the copy `.ci/test` caches, else `PATH`.
pub fn kustomize() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("NIGHTSHIFT_KUSTOMIZE") {
        return Ok(PathBuf::from(p));
    }
    let cache = std::env::var_os("NIGHTSHIFT_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/nightshift")));
    if let Some(c) = cache.map(|c| c.join("bin/kustomize"))
        && c.is_file()
    {
        return Ok(c);
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("kustomize"))
                .find(|c| c.is_file())
        })
        .context(
            "kustomize not found: run `bash .ci/test` (it builds kustomize) or set \
             NIGHTSHIFT_KUSTOMIZE=/path/to/kustomize",
        )
}

/// `kustomize build <dir>`.
pub fn kustomize_build(dir: &Path) -> Result<String> {
    let bin = kustomize()?;
    let out = std::process::Command::new(&bin)
        .arg("build")
        .arg(dir)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "kustomize build {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}
