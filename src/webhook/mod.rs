//! The mutating admission webhook that marks research pods so that the native kube-scheduler
//! preempts them whenever inference needs the GPUs back.
//!
//! - [`mutate`]: the pure decision (is this a research pod?) and patch building.
//! - [`cluster`]: namespace labels and PriorityClasses from watched caches, behind a trait.
//! - [`review`]: AdmissionReview parsing, answers and metrics.
//! - [`server`] and [`tls`]: HTTPS with hot-reloaded certificates.
//! - [`certs`]: `nightshift certs generate`.
//!
//! Why the triple `priorityClassName`/`priority`/`preemptionPolicy`: the built-in `Priority`
//! admission plugin runs before mutating webhooks and fills `priority` and `preemptionPolicy`
//! from the pod's class (or the globalDefault one). When a webhook changes the pod, the API
//! server re-runs it, and it rejects a pod whose `priority`/`preemptionPolicy` disagree with the
//! (new) class. So the webhook always writes all three, read from a watched PriorityClass cache.

pub mod certs;
pub mod cluster;
pub mod mutate;
pub mod pod_fields;
pub mod review;
pub mod server;
pub mod tls;

use std::{collections::BTreeSet, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use clap::{ArgAction, Args};

use crate::{duration::parse_duration, runtime::Context};
use mutate::{Policy, PoolSelector, PoolTaint, SparePreference};

/// Errors of the webhook. Request errors become HTTP 400 or invalid-request responses in one
/// place ([`review`]); the others stop start-up with a message saying what to fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the body is not an AdmissionReview in JSON: {0}")]
    NotAReview(String),
    #[error(
        "expected apiVersion admission.k8s.io/v1, kind AdmissionReview; got apiVersion {api_version:?}, kind {kind:?} (set admissionReviewVersions: [v1])"
    )]
    WrongType { api_version: String, kind: String },
    #[error("the AdmissionReview has no request")]
    MissingRequest,
    #[error("the AdmissionReview request has no uid")]
    MissingUid,
    #[error(
        "nightshift only handles pods, got {kind}: check the rules of the webhook configuration"
    )]
    NotAPod { uid: String, kind: String },
    #[error("the request carries no pod object")]
    MissingObject { uid: String },
    #[error("the request names no namespace")]
    MissingNamespace { uid: String },
    #[error("the pod cannot be read: {reason}")]
    UnreadablePod { uid: String, reason: String },
    #[error("encoding the answer failed: {0}")]
    Encode(String),
    #[error("cannot look up namespace {namespace:?}: {source}")]
    NamespaceLookup {
        namespace: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("cannot read {}: {source}", path.display())]
    ReadTlsFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {reason}", path.display())]
    BadTlsFile { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    TlsConfig(String),
    #[error(transparent)]
    Tls(#[from] crate::tls::Error),
    #[error("cannot write {}: {source}", path.display())]
    WriteCerts {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate generation failed: {0}")]
    Certs(String),
    #[error("cannot bind the webhook to {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid webhook option: {0}")]
    Option(String),
}

/// Webhook options. Every one is also an environment variable.
#[derive(Clone, Debug, Args)]
pub struct WebhookArgs {
    /// Run the admission webhook (in `nightshift run`).
    #[arg(long, env = "NIGHTSHIFT_WEBHOOK_ENABLED", default_value_t = true, action = ArgAction::Set)]
    pub webhook_enabled: bool,

    /// Address of the webhook's HTTPS server.
    #[arg(long, env = "NIGHTSHIFT_WEBHOOK_ADDR", default_value = "0.0.0.0:8443")]
    pub webhook_addr: SocketAddr,

    /// Serving certificate (PEM chain); re-read when it changes.
    #[arg(long, env = "NIGHTSHIFT_WEBHOOK_CERT", default_value = "certs/tls.crt")]
    pub webhook_cert: PathBuf,

    /// Private key of the serving certificate (PEM); re-read when it changes.
    #[arg(long, env = "NIGHTSHIFT_WEBHOOK_KEY", default_value = "certs/tls.key")]
    pub webhook_key: PathBuf,

    /// How often the certificate files are checked for rotation.
    #[arg(long, env = "NIGHTSHIFT_WEBHOOK_CERT_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub webhook_cert_reload_interval: Duration,

    /// Largest accepted request body in bytes (larger: HTTP 413).
    #[arg(long, env = "NIGHTSHIFT_WEBHOOK_MAX_BODY_BYTES", default_value_t = 3 * 1024 * 1024)]
    pub webhook_max_body_bytes: usize,

    /// Label that selects research pods when it is "true" on the namespace or the pod.
    #[arg(
        long,
        env = "NIGHTSHIFT_WEBHOOK_SELECTION_LABEL",
        default_value = "nightshift.io/research"
    )]
    pub webhook_selection_label: String,

    /// Namespaces whose pods are never touched (comma-separated).
    #[arg(
        long,
        env = "NIGHTSHIFT_WEBHOOK_EXCLUDED_NAMESPACES",
        value_delimiter = ',',
        default_value = "kube-system,kube-node-lease,nightshift-system"
    )]
    pub webhook_excluded_namespaces: Vec<String>,

    /// PriorityClass given to research pods; empty leaves priority alone.
    #[arg(
        long,
        env = "NIGHTSHIFT_WEBHOOK_PRIORITY_CLASS",
        default_value = "nightshift-research"
    )]
    pub webhook_priority_class: String,

    /// Extended resource that makes a pod a GPU pod.
    #[arg(
        long,
        env = "NIGHTSHIFT_WEBHOOK_GPU_RESOURCE",
        default_value = "nvidia.com/gpu"
    )]
    pub webhook_gpu_resource: String,

    /// Node label of the GPU pool; GPU research pods require it. Empty: no required affinity.
    #[arg(
        long,
        env = "NIGHTSHIFT_WEBHOOK_POOL_LABEL",
        default_value = "nightshift.io/pool"
    )]
    pub webhook_pool_label: String,

    /// Pool names (values of the pool label) allowed; empty: any pool (`Exists`).
    #[arg(
        long,
        env = "NIGHTSHIFT_WEBHOOK_POOLS",
        value_delimiter = ',',
        default_value = ""
    )]
    pub webhook_pools: Vec<String>,

    /// Node label marking spare nodes, preferred for GPU research pods. Empty: no preference.
    #[arg(
        long,
        env = "NIGHTSHIFT_WEBHOOK_SPARE_LABEL",
        default_value = "nightshift.io/spare"
    )]
    pub webhook_spare_label: String,

    /// Weight (1-100) of the spare-node preference.
    #[arg(long, env = "NIGHTSHIFT_WEBHOOK_SPARE_WEIGHT", default_value_t = 100, value_parser = clap::value_parser!(i32).range(1..=100))]
    pub webhook_spare_weight: i32,

    /// Taints of the GPU pool that GPU research pods tolerate, as `key[=value]:Effect`
    /// (comma-separated; empty for none).
    #[arg(
        long,
        env = "NIGHTSHIFT_WEBHOOK_POOL_TAINTS",
        value_delimiter = ',',
        default_value = "nvidia.com/gpu:NoSchedule"
    )]
    pub webhook_pool_taints: Vec<String>,

    /// Label set to "true" on research pods. Empty: no label.
    #[arg(
        long,
        env = "NIGHTSHIFT_WEBHOOK_LENT_LABEL",
        default_value = "nightshift.io/lent"
    )]
    pub webhook_lent_label: String,

    /// Upper bound for research pods' terminationGracePeriodSeconds (never raised). 0 leaves
    /// it alone.
    #[arg(
        long,
        env = "NIGHTSHIFT_WEBHOOK_MAX_GRACE_PERIOD",
        default_value = "30s",
        value_parser = parse_duration
    )]
    pub webhook_max_grace_period: Duration,
}

fn non_empty(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

impl WebhookArgs {
    /// The mutation policy these options describe.
    pub fn policy(&self) -> Result<Policy, Error> {
        let pool_taints = self
            .webhook_pool_taints
            .iter()
            .filter(|t| !t.trim().is_empty())
            .map(|t| t.parse::<PoolTaint>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(Error::Option)?;
        let selection_label = non_empty(&self.webhook_selection_label)
            .ok_or_else(|| Error::Option("--webhook-selection-label must not be empty".into()))?;
        let grace = self.webhook_max_grace_period.as_secs();
        Ok(Policy {
            selection_label,
            excluded_namespaces: self
                .webhook_excluded_namespaces
                .iter()
                .filter_map(|n| non_empty(n))
                .collect::<BTreeSet<_>>(),
            priority_class: non_empty(&self.webhook_priority_class),
            gpu_resource: self.webhook_gpu_resource.trim().to_string(),
            pool: non_empty(&self.webhook_pool_label).map(|key| PoolSelector {
                key,
                values: self
                    .webhook_pools
                    .iter()
                    .filter_map(|p| non_empty(p))
                    .collect(),
            }),
            spare: non_empty(&self.webhook_spare_label).map(|key| SparePreference {
                key,
                value: mutate::TRUE.into(),
                weight: self.webhook_spare_weight,
            }),
            pool_taints,
            lent_label: non_empty(&self.webhook_lent_label),
            max_grace_period_seconds: (grace > 0).then(|| i64::try_from(grace).unwrap_or(i64::MAX)),
        })
    }
}

/// Starts the webhook: caches (watches), HTTPS server, certificate reload. Without a cluster it
/// logs that the webhook is off and returns: it cannot tell research namespaces or read
/// PriorityClasses without one.
pub async fn start(args: WebhookArgs, ctx: &mut Context) -> Result<(), Error> {
    if !args.webhook_enabled {
        tracing::info!("admission webhook disabled (--webhook-enabled=false)");
        return Ok(());
    }
    let policy = args.policy()?;
    let Some(client) = ctx.kube.clone() else {
        tracing::warn!(
            "admission webhook OFF: no Kubernetes cluster configured, so namespaces and \
             PriorityClasses cannot be watched; research pods are rejected by the API server \
             (failurePolicy Fail) until a webhook runs"
        );
        return Ok(());
    };
    let cluster = cluster::KubeCluster::start(client, ctx);
    start_with(args, policy, cluster, ctx).await
}

/// Starts the HTTPS server and the certificate watcher with a given cluster view (tests use a
/// `cluster::FixedCluster`).
pub async fn start_with(
    args: WebhookArgs,
    policy: Policy,
    cluster: Arc<dyn cluster::ClusterView>,
    ctx: &mut Context,
) -> Result<(), Error> {
    let cert = tls::ReloadingCert::load(&args.webhook_cert, &args.webhook_key)?;
    let tls_config = tls::server_config(cert.clone())?;
    let metrics = review::Metrics::default();
    metrics.register(&mut ctx.registry);
    ctx.registry.register(
        "webhook_certificate_reloads",
        "Times a rotated serving certificate was loaded from disk",
        cert.reloads(),
    );
    let reviewer = review::Reviewer {
        policy: Arc::new(policy),
        cluster,
        metrics,
    };
    let router = server::router(reviewer, args.webhook_max_body_bytes, ctx.readiness.clone());
    let listener = tokio::net::TcpListener::bind(args.webhook_addr)
        .await
        .map_err(|source| Error::Bind {
            addr: args.webhook_addr,
            source,
        })?;
    let token = ctx.supervisor.shutdown_token();
    let t = token.clone();
    let interval = args.webhook_cert_reload_interval;
    ctx.supervisor.spawn("webhook-cert-reload", async move {
        cert.watch(interval, t).await;
        Ok(())
    });
    ctx.supervisor.spawn("webhook", async move {
        server::serve(listener, tls_config, router, token).await?;
        Ok(())
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cmd {
        #[command(flatten)]
        webhook: WebhookArgs,
    }

    fn policy_from(args: &[&str]) -> Result<Policy, Error> {
        let cmd = Cmd::try_parse_from(std::iter::once("nightshift").chain(args.iter().copied()))
            .map_err(|e| Error::Option(e.to_string()))?;
        cmd.webhook.policy()
    }

    #[test]
    fn default_options_give_the_default_policy() {
        assert_eq!(policy_from(&[]).expect("valid"), Policy::default());
    }

    #[test]
    fn empty_options_switch_each_part_off() {
        let policy = policy_from(&[
            "--webhook-priority-class=",
            "--webhook-pool-label=",
            "--webhook-spare-label=",
            "--webhook-pool-taints=",
            "--webhook-lent-label=",
            "--webhook-max-grace-period=0s",
        ])
        .expect("valid");
        assert_eq!(policy.priority_class, None);
        assert_eq!(policy.pool, None);
        assert_eq!(policy.spare, None);
        assert!(policy.pool_taints.is_empty());
        assert_eq!(policy.lent_label, None);
        assert_eq!(policy.max_grace_period_seconds, None);
    }

    #[test]
    fn pools_and_taints_are_parsed() {
        let policy = policy_from(&[
            "--webhook-pools=h100,a100",
            "--webhook-pool-taints=nvidia.com/gpu=present:NoSchedule,dedicated:NoExecute",
        ])
        .expect("valid");
        assert_eq!(
            policy.pool.map(|p| p.values),
            Some(vec!["h100".to_string(), "a100".to_string()])
        );
        assert_eq!(policy.pool_taints.len(), 2);
        let err = policy_from(&["--webhook-pool-taints=nonsense"]).expect_err("invalid");
        assert!(err.to_string().contains("key[=value]:Effect"), "{err}");
        assert!(policy_from(&["--webhook-spare-weight=0"]).is_err());
    }
}
