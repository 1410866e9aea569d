//! The mutating admission webhook that marks research pods so that the native kube-scheduler
//! preempts them whenever inference needs the GPUs back.
//!
//! - [`mutate`]: the pure decision (is this a research pod? which class, what placement, or why
//!   it is refused).
//! - [`patch`]: the pure patch writer: the decision's changes as JSON Patch text.
//! - [`cluster`]: namespace labels and PriorityClasses from watched caches, behind a trait.
//! - [`review`]: AdmissionReview parsing, answers and metrics.
//! - [`server`] and [`tls`]: HTTPS with hot-reloaded certificates ([`crate::runtime::tls`]).
//! - [`certs`]: `nightshift certs generate`.
//!
//! The names it selects by and writes (research and lent labels, the research PriorityClass, the
//! pool label and taints, the spare label, the GPU resource, the reclaim-notice volume, mount
//! path and variable) come from [`crate::core::vocabulary`], shared with the pool controller, so
//! that the pool counts as research what the webhook marks.
//!
//! Why the triple `priorityClassName`/`priority`/`preemptionPolicy`: the built-in `Priority`
//! admission plugin runs before mutating webhooks and fills `priority` and `preemptionPolicy`
//! from the pod's class (or the globalDefault one). When a webhook changes the pod, the API
//! server re-runs it, and it rejects a pod whose `priority`/`preemptionPolicy` disagree with the
//! (new) class. So the webhook always writes all three, read from a watched PriorityClass cache.

pub mod certs;
pub mod cluster;
pub mod mutate;
pub mod patch;
pub mod pod_fields;
pub mod review;
pub mod server;
pub mod tls;

use std::{collections::BTreeSet, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use clap::{ArgAction, Args};

use crate::{core::duration::parse_duration, core::vocabulary::Vocabulary, runtime::Context};
use mutate::{MutationPolicy, SparePlacement};

/// Why the webhook cannot start: what to fix is in the message. Errors answering a review are
/// [`review::ReviewError`], answered in one place; namespace lookups fail with
/// [`cluster::ClusterError`], `nightshift certs` with [`certs::CertsError`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid webhook option: {0}")]
    Option(String),
    #[error(transparent)]
    Tls(#[from] crate::runtime::tls::Error),
    #[error("cannot bind the webhook to {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
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
    // 3 MiB: the API server refuses request bodies above 3 MiB itself, and a review of an UPDATE
    // carries the object twice (object and oldObject, each within etcd's 1.5 MiB); anything
    // larger does not come from the API server.
    #[arg(long, env = "NIGHTSHIFT_WEBHOOK_MAX_BODY_BYTES", default_value_t = 3 * 1024 * 1024)]
    pub webhook_max_body_bytes: usize,

    /// Namespaces whose pods are never touched (comma-separated).
    #[arg(
        long,
        env = "NIGHTSHIFT_WEBHOOK_EXCLUDED_NAMESPACES",
        value_delimiter = ',',
        default_value = "kube-system,kube-node-lease,nightshift-system"
    )]
    pub webhook_excluded_namespaces: Vec<String>,

    /// How GPU research pods are held to nodes marked spare: `required` (a node without the
    /// mark takes no new research pod: headroom and lending windows hold) or `preferred` (spare
    /// nodes first, then any pool node, headroom included).
    #[arg(
        long,
        env = "NIGHTSHIFT_WEBHOOK_SPARE_PLACEMENT",
        value_enum,
        default_value_t = SparePlacementArg::Required
    )]
    pub webhook_spare_placement: SparePlacementArg,

    /// Weight (1-100) of the spare-node preference with `--webhook-spare-placement preferred`.
    #[arg(long, env = "NIGHTSHIFT_WEBHOOK_SPARE_WEIGHT", default_value_t = mutate::DEFAULT_SPARE_WEIGHT, value_parser = clap::value_parser!(i32).range(1..=100))]
    pub webhook_spare_weight: i32,

    /// Scheduler profile given to GPU research pods that use the default scheduler, e.g. a
    /// `nightshift-packing` profile of the cluster's kube-scheduler that scores nodes by
    /// `MostAllocated` GPUs (see manifests/examples/scheduler). Empty: `schedulerName` untouched.
    #[arg(long, env = "NIGHTSHIFT_WEBHOOK_SCHEDULER_NAME", default_value = "")]
    pub webhook_scheduler_name: String,

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

/// `--webhook-spare-placement`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SparePlacementArg {
    Required,
    Preferred,
}

impl WebhookArgs {
    /// The mutation policy these options describe, with the shared `names`.
    pub fn policy(&self, names: &Vocabulary) -> MutationPolicy {
        let grace = self.webhook_max_grace_period.as_secs();
        let mut policy = MutationPolicy::new(names);
        policy.excluded_namespaces = self
            .webhook_excluded_namespaces
            .iter()
            .map(|n| n.trim())
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect::<BTreeSet<_>>();
        if let Some(spare) = policy.spare.as_mut() {
            spare.placement = match self.webhook_spare_placement {
                SparePlacementArg::Required => SparePlacement::Required,
                SparePlacementArg::Preferred => SparePlacement::Preferred {
                    weight: self.webhook_spare_weight,
                },
            };
        }
        policy.max_grace_period_seconds =
            (grace > 0).then(|| i64::try_from(grace).unwrap_or(i64::MAX));
        let scheduler = self.webhook_scheduler_name.trim();
        policy.scheduler_name = (!scheduler.is_empty()).then(|| scheduler.to_string());
        policy
    }
}

/// Starts the webhook: caches (watches), HTTPS server, certificate reload. Without a cluster it
/// logs that the webhook is off and returns: it cannot tell research namespaces or read
/// PriorityClasses without one.
pub async fn start(args: WebhookArgs, names: &Vocabulary, ctx: &mut Context) -> Result<(), Error> {
    if !args.webhook_enabled {
        tracing::info!("admission webhook disabled (--webhook-enabled=false)");
        return Ok(());
    }
    let policy = args.policy(names);
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
/// `test_support::cluster::FixedCluster`).
pub async fn start_with(
    args: WebhookArgs,
    policy: MutationPolicy,
    cluster: Arc<dyn cluster::ClusterView>,
    ctx: &mut Context,
) -> Result<(), Error> {
    let tls = tls::load(&args.webhook_cert, &args.webhook_key, &ctx.tls_metrics)?;
    let metrics = review::Metrics::default();
    metrics.register(&mut ctx.registry);
    ctx.registry.register(
        "webhook_certificate_reloads",
        "Times a rotated serving certificate was loaded from disk",
        tls.reloads(),
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
    let watched = tls.clone();
    ctx.supervisor.spawn("webhook-cert-reload", async move {
        watched.watch(interval, t).await;
        Ok(())
    });
    ctx.supervisor.spawn("webhook", async move {
        server::serve(listener, tls, router, server::Limits::default(), token).await?;
        Ok(())
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::vocabulary::VocabularyArgs;
    use clap::Parser;
    use k8s_openapi::api::core::v1::Pod;
    use mutate::{Classification, PriorityClassInfo};
    use std::collections::BTreeMap;

    #[derive(Debug, Parser)]
    struct Cmd {
        #[command(flatten)]
        vocabulary: VocabularyArgs,
        #[command(flatten)]
        webhook: WebhookArgs,
    }

    fn policy_from(args: &[&str]) -> Result<MutationPolicy, String> {
        let cmd = Cmd::try_parse_from(std::iter::once("nightshift").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        let names = cmd.vocabulary.checked().map_err(|e| e.to_string())?;
        Ok(cmd.webhook.policy(&names))
    }

    #[test]
    fn default_options_give_the_default_policy() {
        assert_eq!(policy_from(&[]).expect("valid"), MutationPolicy::default());
    }

    #[test]
    fn empty_options_switch_each_part_off() {
        let policy = policy_from(&[
            "--research-priority-class=",
            "--pool-label=",
            "--spare-label=",
            "--pool-taints=",
            "--lent-label=",
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
            "--pools=h100,a100",
            "--pool-taints=nvidia.com/gpu=present:NoSchedule,dedicated:NoExecute",
        ])
        .expect("valid");
        assert_eq!(
            policy.pool.map(|p| p.values),
            Some(vec!["h100".to_string(), "a100".to_string()])
        );
        assert_eq!(policy.pool_taints.len(), 2);
        let err = policy_from(&["--pool-taints=nonsense"]).expect_err("invalid");
        assert!(err.contains("key[=value]:Effect"), "{err}");
        assert!(policy_from(&["--webhook-spare-weight=0"]).is_err());
    }

    #[test]
    fn the_mutation_uses_the_names_set_once() {
        let policy = policy_from(&[
            "--research-label=example.com/research",
            "--research-priority-class=scavenger",
            "--lent-label=example.com/borrowed",
        ])
        .expect("valid");
        let classes: BTreeMap<String, PriorityClassInfo> = [(
            "scavenger".to_string(),
            PriorityClassInfo {
                value: -5000,
                preemption_policy: "Never".into(),
            },
        )]
        .into();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "train", "labels": {"example.com/research": "true"}},
            "spec": {"containers": [{"name": "main", "image": "trainer:1",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        }))
        .expect("pod");
        let pod = pod_fields::AdmittedPod::from(&pod);
        let m = mutate::mutate(&pod, "team-a", &BTreeMap::new(), &policy, &classes)
            .expect("not denied");
        assert_eq!(m.selection, Classification::Research { gpu: true });
        let patch = m.patch.as_str();
        assert!(
            patch.contains(r#""path":"/spec/priorityClassName","value":"scavenger""#),
            "{patch}"
        );
        assert!(
            patch.contains(r#""path":"/metadata/labels/example.com~1borrowed","value":"true""#),
            "{patch}"
        );
        assert!(!patch.contains("nightshift-research"), "{patch}");
    }
}
