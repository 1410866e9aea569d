//! The real KEDA on the test control plane: KEDA's CRDs, the operator and the metrics adapter
//! (`cmd/operator`, `cmd/adapter` of KEDA v2.20.2, built by `tests/e2e/scripts/build-keda.sh`) run as
//! processes outside the cluster, and the external metrics API (`v1beta1.external.metrics.k8s.io`)
//! registered with the API server's aggregation layer, so that the HPA controller reads KEDA's
//! metrics as it does in a cluster.
//!
//! One CA signs one certificate that serves and authenticates everything KEDA speaks: the
//! operator's gRPC metrics service, the adapter's client to it (mTLS), and the adapter's HTTPS
//! API. The APIService names a Service without selector whose one EndpointSlice lists the adapter
//! at this machine's own address (the API server routes to endpoints and refuses loopback ones),
//! and its `caBundle` is that CA; the aggregator checks the certificate for
//! `keda-metrics-apiserver.keda.svc`, which the certificate names.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use base64::Engine;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};

use crate::harness::cluster::Cluster;
use crate::harness::endpoints::ServiceEndpoints;
use crate::harness::process::{free_port, free_port_on, host_ip};
use crate::harness::wait::{self, Check};

/// Names the directory of `build-keda.sh`'s output (bin/ and crd/).
pub const KEDA_DIR_ENV: &str = "NIGHTSHIFT_E2E_KEDA_DIR";

/// KEDA's own namespace (`KEDA_CLUSTER_OBJECT_NAMESPACE`), where its Service lives.
pub const KEDA_NS: &str = "keda";
/// The external metrics API's group version and its APIService.
const EXTERNAL_METRICS: &str = "external.metrics.k8s.io/v1beta1";
const API_SERVICE: &str = "v1beta1.external.metrics.k8s.io";
/// The Service the APIService names, and its port's name and number.
const ADAPTER_SERVICE: &str = "keda-metrics-apiserver";
const ADAPTER_PORT_NAME: &str = "https";
const ADAPTER_SERVICE_PORT: u16 = 443;
/// The adapter's process name, for [`Cluster::kill_component`] and
/// [`Cluster::restart_component`].
pub const ADAPTER: &str = "keda-adapter";

/// The CRDs the operator watches; it fails to start without them.
const CRDS: &[&str] = &[
    "scaledobjects.keda.sh",
    "scaledjobs.keda.sh",
    "triggerauthentications.keda.sh",
    "clustertriggerauthentications.keda.sh",
    "cloudeventsources.eventing.keda.sh",
    "clustercloudeventsources.eventing.keda.sh",
];

/// How long the operator and the adapter get to become ready: each needs a few seconds on an
/// idle machine (CRD caches, the adapter's delegated authentication), far more on a loaded one.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// The running KEDA. Its processes belong to the control plane and stop with it.
pub struct Keda {
    /// The operator's gRPC metrics service (`host:port`).
    pub operator_grpc: String,
    /// The operator's health probe server (`/readyz`, `/healthz`).
    pub operator_probe: String,
    /// Seconds from the call to the external metrics API answering.
    pub started_in: Duration,
}

/// The directory with `bin/keda-operator`, `bin/keda-adapter` and `crd/`:
/// `NIGHTSHIFT_E2E_KEDA_DIR`, else where `build-keda.sh` puts them (asked from the script, so the
/// version is written once).
pub fn find_keda_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os(KEDA_DIR_ENV).filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => {
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/scripts/build-keda.sh");
            let out = std::process::Command::new("bash")
                .arg(&script)
                .arg("--print-dir")
                .output()
                .with_context(|| format!("running {}", script.display()))?;
            ensure!(
                out.status.success(),
                "{} --print-dir failed: {}",
                script.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    for f in [
        "bin/keda-operator",
        "bin/keda-adapter",
        "crd/keda.sh_scaledobjects.yaml",
    ] {
        ensure!(
            dir.join(f).is_file(),
            "KEDA's {f} is missing in {}: build it with `bash tests/e2e/scripts/build-keda.sh` (needs Go; \
             `bash .ci/test` does this) or point {KEDA_DIR_ENV} at a directory that has it",
            dir.display()
        );
    }
    Ok(dir)
}

/// One CA and one certificate (serverAuth and clientAuth) for every name KEDA is reached by.
fn make_certs(dir: &Path) -> Result<String> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "nightshift-e2e-keda-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(vec![
        "localhost".to_string(),
        "keda-operator.keda.svc.cluster.local".to_string(),
        format!("{ADAPTER_SERVICE}.{KEDA_NS}.svc"),
    ])?;
    leaf.subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    leaf.distinguished_name.push(DnType::CommonName, "keda");
    leaf.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = leaf.signed_by(&key, &issuer)?;
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("ca.crt"), ca_cert.pem())?;
    std::fs::write(dir.join("tls.crt"), cert.pem())?;
    std::fs::write(dir.join("tls.key"), key.serialize_pem())?;
    Ok(ca_cert.pem())
}

fn kubectl_ok(c: &Cluster, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let out = c.kubectl(args, stdin)?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Keda {
    /// Installs KEDA's CRDs, registers the external metrics API, starts the operator and the
    /// adapter and waits until the external metrics API answers through the API server.
    pub async fn start(c: &Cluster) -> Result<Self> {
        let t = Instant::now();
        let keda_dir = find_keda_dir()?;
        let work = c.work_dir().join("keda");
        let certs = work.join("certs");
        let ca_pem = make_certs(&certs)?;

        // CRDs: server-side, since their schemas exceed the last-applied annotation's limit.
        let crd = keda_dir.join("crd");
        kubectl_ok(
            c,
            &["apply", "--server-side", "-f", &crd.display().to_string()],
            None,
        )?;
        let crds: Api<CustomResourceDefinition> = Api::all(c.client.clone());
        wait::until("KEDA's CRDs to be established", START_TIMEOUT, || async {
            let mut pending = Vec::new();
            for name in CRDS {
                let established = crds.get_opt(name).await?.is_some_and(|crd| {
                    crd.status.and_then(|s| s.conditions).is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    })
                });
                if !established {
                    pending.push(*name);
                }
            }
            Ok(if pending.is_empty() {
                Check::Done(())
            } else {
                Check::Pending(format!("not established: {pending:?}"))
            })
        })
        .await?;

        let host = host_ip()?;
        let adapter_port = free_port_on(host)?;
        let adapter_metrics_port = free_port()?;
        let grpc_port = free_port()?;
        let probe_port = free_port()?;
        let operator_metrics_port = free_port()?;
        let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
        let registration = format!(
            r#"apiVersion: v1
kind: Namespace
metadata:
  name: {KEDA_NS}
---
apiVersion: v1
kind: Service
metadata:
  name: {ADAPTER_SERVICE}
  namespace: {KEDA_NS}
spec:
  ports:
    - name: {ADAPTER_PORT_NAME}
      port: {ADAPTER_SERVICE_PORT}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: {API_SERVICE}
spec:
  group: external.metrics.k8s.io
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  caBundle: {ca_bundle}
  service:
    name: {ADAPTER_SERVICE}
    namespace: {KEDA_NS}
    port: {ADAPTER_SERVICE_PORT}
"#
        );
        kubectl_ok(c, &["apply", "-f", "-"], Some(&registration))?;
        ServiceEndpoints::new(&c.client, KEDA_NS, ADAPTER_SERVICE, ADAPTER_PORT_NAME)
            .set("adapter", host, adapter_port, true)
            .await?;

        let kubeconfig = c.kubeconfig.display().to_string();
        let cert_dir = certs.display().to_string();
        let vars = [
            // All namespaces.
            ("WATCH_NAMESPACE", String::new()),
            ("KEDA_CLUSTER_OBJECT_NAMESPACE", KEDA_NS.to_string()),
            ("POD_NAMESPACE", KEDA_NS.to_string()),
            ("KUBECONFIG", kubeconfig.clone()),
        ];
        let grpc = format!("127.0.0.1:{grpc_port}");
        let probe = format!("127.0.0.1:{probe_port}");
        c.spawn_component(
            "keda-operator",
            &keda_dir.join("bin/keda-operator"),
            &[
                format!("--kubeconfig={kubeconfig}"),
                format!("--metrics-service-bind-address={grpc}"),
                format!("--health-probe-bind-address={probe}"),
                format!("--metrics-bind-address=127.0.0.1:{operator_metrics_port}"),
                format!("--cert-dir={cert_dir}"),
                // Its certificates are given; it must not rewrite the registration above, nor
                // look for webhook configurations (its webhooks are a separate binary, not run).
                "--enable-cert-rotation=false".into(),
                "--enable-apiservice-patching=false".into(),
                "--enable-webhook-patching=false".into(),
                "--leader-elect=false".into(),
                "--zap-log-level=info".into(),
                "--zap-encoder=console".into(),
            ],
            &vars,
        )?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        wait::http_ok(
            "the KEDA operator's /readyz",
            &http,
            &format!("http://{probe}/readyz"),
            START_TIMEOUT,
            || c.check_processes(),
        )
        .await?;

        c.spawn_component(
            ADAPTER,
            &keda_dir.join("bin/keda-adapter"),
            &[
                format!("--kubeconfig={kubeconfig}"),
                format!("--lister-kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                format!("--bind-address={host}"),
                format!("--secure-port={adapter_port}"),
                format!("--port={adapter_metrics_port}"),
                // The client certificate for the operator's gRPC service (mTLS) is read from here.
                format!("--cert-dir={cert_dir}"),
                format!("--tls-cert-file={}", certs.join("tls.crt").display()),
                format!("--tls-private-key-file={}", certs.join("tls.key").display()),
                format!("--metrics-service-address={grpc}"),
                "--v=2".into(),
            ],
            &vars,
        )?;
        // A failed adapter start exits 0: readiness is the external metrics API answering
        // through the aggregation layer, not the process's status.
        let path = format!("/apis/{EXTERNAL_METRICS}");
        wait::until(
            "the external metrics API through the aggregation layer",
            START_TIMEOUT,
            || async {
                c.check_processes()?;
                let req = http::Request::get(&path).body(Vec::new())?;
                Ok(match c.client.request_text(req).await {
                    Ok(body) if body.contains("\"APIResourceList\"") => Check::Done(()),
                    Ok(body) => Check::Pending(body),
                    Err(e) => Check::Pending(e.to_string()),
                })
            },
        )
        .await?;
        let started_in = t.elapsed();
        eprintln!(
            "e2e: KEDA operator and adapter ready in {:.1} s (operator gRPC {grpc}, adapter \
             https://{host}:{adapter_port})",
            started_in.as_secs_f64()
        );
        Ok(Self {
            operator_grpc: grpc,
            operator_probe: probe,
            started_in,
        })
    }
}
