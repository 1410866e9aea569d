//! The control plane under test: etcd, kube-apiserver, kube-scheduler, kube-controller-manager
//! and kwok (fake GPU and CPU nodes), started from binaries built by
//! `tests/e2e/scripts/build-control-plane.sh`, on free loopback ports, in a temporary directory.
//!
//! Dropping the [`Cluster`] kills every process and removes the data directory; component logs
//! are kept (and their paths printed) when a scenario failed.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};
use serde_json::json;
use tempfile::TempDir;

use crate::harness::keda_stack::Keda;
use crate::harness::process::{Process, free_port, tail};
use crate::harness::wait::{self, Check};

/// Environment variable naming the directory with the control-plane binaries.
pub const BIN_DIR_ENV: &str = "NIGHTSHIFT_E2E_BIN_DIR";

/// Token of the cluster administrator (group `system:masters`), used by the test client, the
/// scheduler, the controller manager and kwok. Only ever valid for this throw-away cluster.
const ADMIN_TOKEN: &str = "nightshift-e2e-admin";

/// GPUs per fake GPU node, and how many of them form the pool.
pub const GPUS_PER_NODE: u32 = 8;
pub const GPU_NODES: u32 = 4;
/// Name of the GPU pool, its node label and the taint that keeps other pods off it.
pub const POOL: &str = "gpu";
pub const POOL_LABEL: &str = "nightshift.io/pool";
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Users whose API requests the API server writes to the audit log (request metadata only):
/// nightshift's ServiceAccount, so that a scenario can compare the calls it makes with its RBAC.
const AUDITED_USERS: &[&str] = &["system:serviceaccount:nightshift-system:nightshift"];

/// How long each component gets to become ready: generous for a loaded 2-core machine (the API
/// server alone needs ~5-15 s there to install its APIs).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Binaries the environment needs, all in one directory.
const BINARIES: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubectl",
    "kwok",
];

/// The running environment, shared by every scenario of a test run.
pub struct Cluster {
    /// Client with cluster-admin rights.
    pub client: kube::Client,
    /// Kubeconfig file of the administrator (token auth, CA file).
    pub kubeconfig: PathBuf,
    pub bin_dir: PathBuf,
    /// The API server's audit log (JSON lines) of the requests of [`AUDITED_USERS`].
    pub audit_log: PathBuf,
    /// The real KEDA operator and metrics adapter, started by the first scenario that asks.
    keda: tokio::sync::OnceCell<Keda>,
    work_dir: PathBuf,
    env: Env,
}

/// Owns the processes and directories; its `Drop` tears everything down. Separate from
/// [`Cluster`] so that a half-started environment is torn down too.
struct Env {
    procs: Mutex<Vec<Process>>,
    failed: AtomicBool,
    work: Option<TempDir>,
    logs: Option<TempDir>,
    log_dir: PathBuf,
}

/// Finds the directory with the control-plane binaries: `NIGHTSHIFT_E2E_BIN_DIR`, else the cache
/// directory that `build-control-plane.sh` fills (asked from the script itself, so the versions
/// are written down in one place).
pub fn find_bin_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os(BIN_DIR_ENV) {
        Some(d) => PathBuf::from(d),
        None => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/e2e/scripts/build-control-plane.sh");
            let out = std::process::Command::new("bash")
                .arg(&script)
                .arg("--print-bin-dir")
                .output()
                .with_context(|| format!("running {}", script.display()))?;
            if !out.status.success() {
                bail!(
                    "{} --print-bin-dir failed: {}",
                    script.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    let missing: Vec<&str> = BINARIES
        .iter()
        .copied()
        .filter(|b| !dir.join(b).is_file())
        .collect();
    if !missing.is_empty() {
        bail!(
            "control-plane binaries missing in {}: {}.\n\
             Build them with `bash tests/e2e/scripts/build-control-plane.sh` (needs Go; `bash .ci/test` does \
             this), or point {BIN_DIR_ENV} at a directory that has them, or set \
             NIGHTSHIFT_E2E_SKIP=1 to skip the end-to-end tests deliberately.",
            dir.display(),
            missing.join(", ")
        );
    }
    Ok(dir)
}

struct Pki {
    ca_pem: String,
    serving_cert_pem: String,
    serving_key_pem: String,
    /// Client certificate of the API server's aggregation layer (the front proxy), signed by the
    /// same CA, with the name that `--requestheader-allowed-names` accepts.
    proxy_cert_pem: String,
    proxy_key_pem: String,
    sa_key_pem: String,
    sa_pub_pem: String,
}

fn make_pki() -> Result<Pki> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "nightshift-e2e-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["localhost".to_string()])?;
    params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    let cert = params.signed_by(&key, &issuer)?;

    let proxy_key = KeyPair::generate()?;
    let mut proxy = CertificateParams::new(Vec::<String>::new())?;
    proxy
        .distinguished_name
        .push(DnType::CommonName, FRONT_PROXY_NAME);
    proxy.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let proxy_cert = proxy.signed_by(&proxy_key, &issuer)?;

    let sa = KeyPair::generate()?;
    Ok(Pki {
        ca_pem: ca_cert.pem(),
        serving_cert_pem: cert.pem(),
        serving_key_pem: key.serialize_pem(),
        proxy_cert_pem: proxy_cert.pem(),
        proxy_key_pem: proxy_key.serialize_pem(),
        sa_key_pem: sa.serialize_pem(),
        sa_pub_pem: sa.public_key_pem(),
    })
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

fn s(v: impl Into<String>) -> String {
    v.into()
}

impl Env {
    fn spawn(&self, name: &str, program: &Path, args: &[String]) -> Result<()> {
        self.spawn_with_env(name, program, args, &[])
    }

    fn spawn_with_env(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        vars: &[(&str, String)],
    ) -> Result<()> {
        let p = Process::spawn_with_env(name, program, args, vars, &self.log_dir)?;
        self.procs
            .lock()
            .map_err(|_| anyhow::anyhow!("process list poisoned"))?
            .push(p);
        Ok(())
    }

    /// Runs `f` on the component called `name`.
    fn with_process(&self, name: &str, f: impl FnOnce(&mut Process) -> Result<()>) -> Result<()> {
        let mut procs = self
            .procs
            .lock()
            .map_err(|_| anyhow::anyhow!("process list poisoned"))?;
        let p = procs
            .iter_mut()
            .find(|p| p.name() == name)
            .with_context(|| format!("no {name} process"))?;
        f(p)
    }

    /// Fails if any component process has exited.
    fn check_processes(&self) -> Result<()> {
        let mut procs = self
            .procs
            .lock()
            .map_err(|_| anyhow::anyhow!("process list poisoned"))?;
        for p in procs.iter_mut() {
            p.check_running()?;
        }
        Ok(())
    }

    fn print_log_tails(&self) {
        let Ok(procs) = self.procs.lock() else { return };
        for p in procs.iter() {
            eprintln!(
                "----- {} (full log: {}) -----\n{}",
                p.name(),
                p.log_path().display(),
                tail(p.log_path(), 25)
            );
        }
    }
}

impl Env {
    /// Kills every process, in reverse start order: clients before the API server, etcd last.
    fn stop(&self) {
        if let Ok(mut procs) = self.procs.lock() {
            while let Some(mut p) = procs.pop() {
                p.kill();
            }
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.stop();
        drop(self.work.take());
        if let Some(logs) = self.logs.take()
            && self.failed.load(Ordering::SeqCst)
        {
            let kept = logs.keep();
            eprintln!("e2e: component logs kept in {}", kept.display());
        }
    }
}

impl Cluster {
    /// Starts the whole environment and waits until the nodes are ready and the controllers run.
    /// On error everything started so far is stopped and the logs are kept.
    pub async fn start(bin_dir: PathBuf) -> Result<Self> {
        let work = tempfile::Builder::new()
            .prefix("nightshift-e2e-")
            .tempdir()?;
        let logs = tempfile::Builder::new()
            .prefix("nightshift-e2e-logs-")
            .tempdir()?;
        let dir = work.path().to_path_buf();
        let log_dir = logs.path().to_path_buf();
        let env = Env {
            procs: Mutex::new(Vec::new()),
            failed: AtomicBool::new(false),
            work: Some(work),
            logs: Some(logs),
            log_dir: log_dir.clone(),
        };
        let started = Instant::now();
        match boot(&env, &bin_dir, &dir).await {
            Ok((client, api_url)) => {
                eprintln!(
                    "e2e: control plane ready in {:.1} s (API server {api_url}, logs in {})",
                    started.elapsed().as_secs_f64(),
                    log_dir.display()
                );
                let cluster = Self {
                    client,
                    kubeconfig: dir.join("admin.kubeconfig"),
                    audit_log: dir.join("audit.log"),
                    bin_dir,
                    keda: tokio::sync::OnceCell::new(),
                    work_dir: dir.clone(),
                    env,
                };
                // kubectl is part of the environment too (scenarios apply manifests with it).
                let out = cluster.kubectl(&["get", "nodes", "-o", "wide"], None)?;
                if !out.status.success() {
                    cluster.mark_failed();
                    bail!(
                        "kubectl get nodes failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                eprint!("{}", String::from_utf8_lossy(&out.stdout));
                Ok(cluster)
            }
            Err(e) => {
                env.failed.store(true, Ordering::SeqCst);
                env.print_log_tails();
                Err(e)
            }
        }
    }

    /// Fails if any component process has exited.
    pub fn check_processes(&self) -> Result<()> {
        self.env.check_processes()
    }

    /// The real KEDA operator and metrics adapter on this control plane, started (and waited
    /// for) on the first call only, so that scenarios that do not need KEDA do not pay for it.
    /// They then run, like every component, until the control plane stops.
    pub async fn keda(&self) -> Result<&Keda> {
        self.keda.get_or_try_init(|| Keda::start(self)).await
    }

    /// Starts a further component of the environment (it lives and dies with the control plane
    /// and is checked by [`Cluster::check_processes`]).
    pub fn spawn_component(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        vars: &[(&str, String)],
    ) -> Result<()> {
        self.env.spawn_with_env(name, program, args, vars)
    }

    /// The control plane's private directory (removed when it stops).
    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    /// Waits until the service-account controller created `default` in `ns` (pods cannot be
    /// created before that).
    pub async fn wait_default_service_account(&self, ns: &str) -> Result<()> {
        wait_default_service_account(&self.env, &self.client, ns).await
    }

    /// Creates a namespace with the given labels and waits until pods can be created in it.
    pub async fn create_namespace(&self, name: &str, labels: serde_json::Value) -> Result<()> {
        let nss: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels},
        }))?;
        nss.create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        self.wait_default_service_account(name).await
    }

    /// Deletes a namespace and waits until it is gone (all its pods deleted), so that the GPUs it
    /// used are free for the next scenario.
    pub async fn delete_namespace(&self, name: &str) -> Result<()> {
        let nss: Api<Namespace> = Api::all(self.client.clone());
        let _ = nss.delete(name, &DeleteParams::default()).await;
        wait::until(
            &format!("namespace {name} to be deleted"),
            START_TIMEOUT,
            || {
                let nss = nss.clone();
                async move {
                    Ok(match nss.get_opt(name).await? {
                        None => Check::Done(()),
                        Some(ns) => {
                            Check::Pending(format!("{:?}", ns.status.and_then(|s| s.conditions)))
                        }
                    })
                }
            },
        )
        .await
    }

    /// Runs the kubectl built with the control plane against this cluster, as administrator.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<std::process::Output> {
        use std::io::Write;
        let mut cmd = std::process::Command::new(self.bin_dir.join("kubectl"));
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .stdin(if stdin.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            });
        let mut child = cmd.spawn().context("starting kubectl")?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes())?;
        }
        Ok(child.wait_with_output()?)
    }

    /// Directory of the component logs (kept when a scenario failed): processes that
    /// scenarios start log there too.
    pub fn log_dir(&self) -> &Path {
        &self.env.log_dir
    }

    /// Records that a scenario failed: logs are kept on drop.
    pub fn mark_failed(&self) {
        self.env.failed.store(true, Ordering::SeqCst);
    }

    /// Prints the path and the end of every component log.
    pub fn print_log_tails(&self) {
        self.env.print_log_tails();
    }

    /// Kills a component (SIGKILL, as when its node dies) until [`Cluster::restart_component`];
    /// the API server's clients see refused connections, etcd keeps the state.
    pub fn kill_component(&self, name: &str) -> Result<()> {
        self.env.with_process(name, |p| {
            p.kill();
            Ok(())
        })
    }

    /// Starts a component again with the flags, ports and data of its first start (its log
    /// continues in the same file), in the same place of the stop order.
    pub fn restart_component(&self, name: &str) -> Result<()> {
        self.env.with_process(name, Process::restart)
    }

    /// Kills the API server: [`Cluster::kill_component`] of `kube-apiserver`.
    pub fn kill_apiserver(&self) -> Result<()> {
        self.kill_component("kube-apiserver")
    }

    /// Starts the API server again and waits until it is ready; returns how long that took.
    pub async fn start_apiserver(&self) -> Result<Duration> {
        let t = Instant::now();
        self.restart_component("kube-apiserver")?;
        wait_apiserver_ready(&self.env, &self.client).await?;
        Ok(t.elapsed())
    }

    /// Kills every component process now (dropping the cluster does it too).
    pub fn stop(&self) {
        self.env.stop();
    }
}

/// Writes keys and configuration, starts every component in order and waits for each.
async fn boot(env: &Env, bin: &Path, dir: &Path) -> Result<(kube::Client, String)> {
    let pki = make_pki()?;
    let d = |f: &str| dir.join(f).display().to_string();
    write(&dir.join("ca.crt"), &pki.ca_pem)?;
    write(&dir.join("apiserver.crt"), &pki.serving_cert_pem)?;
    write(&dir.join("apiserver.key"), &pki.serving_key_pem)?;
    write(&dir.join("front-proxy.crt"), &pki.proxy_cert_pem)?;
    write(&dir.join("front-proxy.key"), &pki.proxy_key_pem)?;
    write(&dir.join("sa.key"), &pki.sa_key_pem)?;
    write(&dir.join("sa.pub"), &pki.sa_pub_pem)?;
    write(
        &dir.join("tokens.csv"),
        &format!("{ADMIN_TOKEN},admin,admin,\"system:masters\"\n"),
    )?;

    let users = AUDITED_USERS
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    write(
        &dir.join("audit-policy.yaml"),
        &format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
             - level: Metadata\n  users: [{users}]\n- level: None\n"
        ),
    )?;

    let etcd_client = free_port()?;
    let etcd_peer = free_port()?;
    let api_port = free_port()?;
    let api_url = format!("https://127.0.0.1:{api_port}");
    let kubeconfig = dir.join("admin.kubeconfig");
    write(
        &kubeconfig,
        &kubeconfig_yaml(&api_url, &dir.join("ca.crt"), ADMIN_TOKEN),
    )?;

    let client_url = format!("http://127.0.0.1:{etcd_client}");
    let peer_url = format!("http://127.0.0.1:{etcd_peer}");
    env.spawn(
        "etcd",
        &bin.join("etcd"),
        &[
            s("--name=e2e"),
            format!("--data-dir={}", d("etcd")),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=e2e={peer_url}"),
            // A throw-away store: fsync only costs time on a shared disk.
            s("--unsafe-no-fsync=true"),
            s("--log-level=warn"),
        ],
    )?;

    let apiserver_args = vec![
        format!("--etcd-servers={client_url}"),
        s("--bind-address=127.0.0.1"),
        s("--advertise-address=127.0.0.1"),
        format!("--secure-port={api_port}"),
        format!("--cert-dir={}", d("apiserver-certs")),
        format!("--tls-cert-file={}", d("apiserver.crt")),
        format!("--tls-private-key-file={}", d("apiserver.key")),
        format!("--client-ca-file={}", d("ca.crt")),
        format!("--token-auth-file={}", d("tokens.csv")),
        s("--authorization-mode=RBAC"),
        s("--service-cluster-ip-range=10.96.0.0/16"),
        s("--service-account-issuer=https://kubernetes.default.svc.cluster.local"),
        format!("--service-account-key-file={}", d("sa.pub")),
        format!("--service-account-signing-key-file={}", d("sa.key")),
        s("--allow-privileged=true"),
        // The `kubernetes` Service cannot point at a loopback address; nothing here uses it.
        s("--endpoint-reconciler-type=none"),
        s("--profiling=false"),
        format!("--audit-policy-file={}", d("audit-policy.yaml")),
        format!("--audit-log-path={}", d("audit.log")),
        // The aggregation layer, for KEDA's external metrics API (an APIService served by the
        // adapter): the API server proxies with the front-proxy client certificate and passes
        // the caller's identity in these headers, which the adapter trusts for certificates of
        // this CA with the allowed name.
        format!("--requestheader-client-ca-file={}", d("ca.crt")),
        format!("--requestheader-allowed-names={FRONT_PROXY_NAME}"),
        s("--requestheader-username-headers=X-Remote-User"),
        s("--requestheader-group-headers=X-Remote-Group"),
        s("--requestheader-extra-headers-prefix=X-Remote-Extra-"),
        format!("--proxy-client-cert-file={}", d("front-proxy.crt")),
        format!("--proxy-client-key-file={}", d("front-proxy.key")),
        // Services reached by the API server itself (the external metrics APIService, a webhook
        // registered through a Service) are dialled at an endpoint of their EndpointSlices, as in
        // a cluster without a Service network on the control-plane host: there is no kube-proxy
        // here to make a ClusterIP reachable.
        s("--enable-aggregator-routing=true"),
        s("--v=1"),
    ];
    env.spawn(
        "kube-apiserver",
        &bin.join("kube-apiserver"),
        &apiserver_args,
    )?;

    let client = client_from_kubeconfig(&kubeconfig).await?;
    wait_apiserver_ready(env, &client).await?;

    let kc = kubeconfig.display().to_string();
    // The scheduler runs with the shipped example configuration: the default profile and
    // nightshift's packing profile, plus what a config file must say instead of flags.
    let scheduler_config = dir.join("kube-scheduler.yaml");
    let example = std::fs::read_to_string(scheduler_example())?;
    std::fs::write(
        &scheduler_config,
        format!(
            "{example}\nclientConnection:\n  kubeconfig: {kc:?}\nleaderElection:\n  leaderElect: false\n"
        ),
    )?;
    env.spawn(
        "kube-scheduler",
        &bin.join("kube-scheduler"),
        &[
            format!("--config={}", scheduler_config.display()),
            s("--secure-port=0"),
            s("--v=2"),
        ],
    )?;
    env.spawn(
        "kube-controller-manager",
        &bin.join("kube-controller-manager"),
        &[
            format!("--kubeconfig={kc}"),
            s("--leader-elect=false"),
            s("--secure-port=0"),
            format!("--controllers={}", CONTROLLERS.join(",")),
            format!("--service-account-private-key-file={}", d("sa.key")),
            format!("--root-ca-file={}", d("ca.crt")),
            // The HPA that KEDA creates acts within seconds instead of every 15 s, and scales
            // down without the 5 min default window (a ScaledObject sets its own).
            format!("--horizontal-pod-autoscaler-sync-period={HPA_SYNC}"),
            s("--horizontal-pod-autoscaler-downscale-stabilization=1s"),
            s("--v=1"),
        ],
    )?;
    let stages = dir.join("kwok-stages.yaml");
    write(&stages, include_str!("kwok-stages.yaml"))?;
    env.spawn(
        "kwok",
        &bin.join("kwok"),
        &[
            format!("--kubeconfig={kc}"),
            format!("--config={}", stages.display()),
            s("--manage-all-nodes=false"),
            s("--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake"),
            // Fake pod addresses, nothing is ever sent to them; nodes (and so host-network
            // pods) get this machine's address, where a scenario's test server can answer
            // them (the reclaim notice's checkpoint call).
            s("--cidr=10.244.0.0/16"),
            format!("--node-ip={}", crate::harness::process::host_ip()?),
        ],
    )?;

    create_nodes(&client).await?;
    wait_nodes_ready(env, &client).await?;
    wait_default_service_account(env, &client, "default").await?;
    Ok((client, api_url))
}

/// Controllers the scenarios rely on: workloads (Deployment, ReplicaSet, Job), garbage
/// collection and namespaces (clean-up between scenarios), service accounts and their tokens,
/// node lifecycle (removes the not-ready taint from new nodes), disruption (PDBs), the HPA (which
/// acts only on the HPAs that KEDA creates in the loop scenario).
const CONTROLLERS: &[&str] = &[
    "deployment-controller",
    "replicaset-controller",
    "job-controller",
    "garbage-collector-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "namespace-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "root-ca-certificate-publisher-controller",
    "pod-garbage-collector-controller",
    "disruption-controller",
    "horizontal-pod-autoscaler-controller",
];

/// The HPA controller's sync period: 2 s instead of 15 s, so that the loop scenario's steps
/// take seconds; still slower than KEDA's 1 s polling there, as in production.
pub const HPA_SYNC: &str = "2s";

/// Common name of the aggregation layer's client certificate.
const FRONT_PROXY_NAME: &str = "front-proxy-client";

async fn wait_apiserver_ready(env: &Env, client: &kube::Client) -> Result<()> {
    wait::until("kube-apiserver /readyz", START_TIMEOUT, || async {
        env.check_processes()?;
        let req = http::Request::get("/readyz").body(Vec::new())?;
        match client.request_text(req).await {
            Ok(body) if body.trim() == "ok" => Ok(Check::Done(())),
            Ok(body) => Ok(Check::Pending(body)),
            Err(e) => Ok(Check::Pending(e.to_string())),
        }
    })
    .await
}

async fn create_nodes(client: &kube::Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let gpus = GPUS_PER_NODE.to_string();
    let mut specs = Vec::new();
    for i in 0..GPU_NODES {
        specs.push(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": format!("gpu-{i}"),
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {
                    "type": "kwok",
                    "kubernetes.io/hostname": format!("gpu-{i}"),
                    "kubernetes.io/os": "linux",
                    POOL_LABEL: POOL,
                },
            },
            "spec": {"taints": [{"key": POOL_LABEL, "value": POOL, "effect": "NoSchedule"}]},
            "status": {
                "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", GPU_RESOURCE: gpus},
                "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", GPU_RESOURCE: gpus},
            },
        }));
    }
    specs.push(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "cpu-0",
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": "cpu-0", "kubernetes.io/os": "linux"},
        },
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        },
    }));
    for spec in specs {
        let node: Node = serde_json::from_value(spec)?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .context("creating a kwok node")?;
    }
    Ok(())
}

async fn wait_nodes_ready(env: &Env, client: &kube::Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    wait::until(
        "all kwok nodes Ready and without the not-ready taint",
        START_TIMEOUT,
        || async {
            env.check_processes()?;
            let list = nodes.list(&Default::default()).await?;
            let not_ready: Vec<String> = list
                .items
                .iter()
                .filter(|n| !node_schedulable(n))
                .map(|n| n.metadata.name.clone().unwrap_or_default())
                .collect();
            if list.items.len() as u32 == GPU_NODES + 1 && not_ready.is_empty() {
                Ok(Check::Done(()))
            } else {
                Ok(Check::Pending(format!(
                    "{} nodes, not ready: {not_ready:?}",
                    list.items.len()
                )))
            }
        },
    )
    .await
}

async fn wait_default_service_account(env: &Env, client: &kube::Client, ns: &str) -> Result<()> {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    wait::until(
        &format!("service account default in {ns}"),
        START_TIMEOUT,
        || async {
            env.check_processes()?;
            Ok(match sas.get_opt("default").await? {
                Some(_) => Check::Done(()),
                None => Check::Pending("absent".into()),
            })
        },
    )
    .await
}

/// Ready condition true and no not-ready/unreachable taint.
/// The packing profile example (`manifests/examples/scheduler`), which the test scheduler runs.
fn scheduler_example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("manifests/examples/scheduler/kube-scheduler-config.yaml")
}

pub fn node_schedulable(n: &Node) -> bool {
    let ready = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let tainted = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key.starts_with("node.kubernetes.io/")));
    ready && !tainted
}

fn kubeconfig_yaml(server: &str, ca_file: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {server}\n    \
         certificate-authority: {}\nusers:\n- name: admin\n  user:\n    token: {token}\n\
         contexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: admin\n\
         current-context: e2e\n",
        ca_file.display()
    )
}

/// A kube client for a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let kc = Kubeconfig::read_from(path)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}
