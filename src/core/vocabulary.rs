//! The names the admission webhook and the GPU-pool controller agree on: which label selects
//! research pods, which label and PriorityClass mark them, which node label and taint make the
//! GPU pool, which labels carry the spare marks, and which extended resource is a GPU; and the
//! fixed names of the reclaim notice that research pods read (annotation, condition, Event
//! reason, checkpoint annotations, the Downward API volume the webhook adds).
//!
//! Owns the default names ([`RESEARCH_LABEL`], [`POOL_LABEL`], ...), the one option group that
//! changes them ([`VocabularyArgs`], flattened once per command) and the checked result
//! ([`Vocabulary`]), plain data that both components read. A name is set once, so the webhook
//! cannot mark pods with a class that the pool does not count as research.
//!
//! The ground floor of the crate: it imports nothing of nightshift, so every component may use it.

use clap::Args;

/// Label whose value [`TRUE`] on a namespace or a pod selects research pods.
pub const RESEARCH_LABEL: &str = "nightshift.io/research";
/// Label the webhook sets to [`TRUE`] on the research pods it marked.
pub const LENT_LABEL: &str = "nightshift.io/lent";
/// PriorityClass of research pods: below every default workload, never preempting.
pub const RESEARCH_PRIORITY_CLASS: &str = "nightshift-research";
/// PriorityClass of inference pods: high enough to preempt research. No component reads it at
/// run time (inference workloads name it themselves), so it has no option; it is named here so
/// that the manifests and examples are checked against one spelling.
pub const INFERENCE_PRIORITY_CLASS: &str = "nightshift-inference";
/// Node label of the GPU pool (any value: the pool's name).
pub const POOL_LABEL: &str = "nightshift.io/pool";
/// Taint of the GPU pool, as `key[=value]:Effect`: the NVIDIA GPU operator and the managed
/// Kubernetes offerings taint GPU nodes this way so that only pods asking for GPUs land there.
pub const POOL_TAINT: &str = "nvidia.com/gpu:NoSchedule";
/// Node label: [`TRUE`] when research pods may be sent to the node.
pub const SPARE_LABEL: &str = "nightshift.io/spare";
/// Node label: how many GPUs research pods may take on the node.
pub const SPARE_GPUS_LABEL: &str = "nightshift.io/spare-gpus";
/// Extended resource of GPUs (the NVIDIA device plugin's name).
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Annotation a research pod may set to the RFC 3339 time of its last checkpoint: work before it
/// is not lost when the pod is preempted. Without it, everything since the pod started counts as
/// lost.
pub const CHECKPOINTED_AT_ANNOTATION: &str = "nightshift.io/checkpointed-at";
/// Annotation the pool controller sets on a research pod to the RFC 3339 time it gave the pod a
/// reclaim notice (inference is about to take the pod's GPUs back); removed when the notice is
/// withdrawn.
pub const RECLAIM_NOTICE_ANNOTATION: &str = "nightshift.io/reclaim-notice";
/// Annotation set with [`RECLAIM_NOTICE_ANNOTATION`] to the inference service (its ScaledObject,
/// `namespace/name`) whose scale-up the notice foretells, and removed with it: when the pod is
/// then preempted, its Event and the pool's status name the service that took the GPUs.
pub const RECLAIM_NOTICE_SERVICE_ANNOTATION: &str = "nightshift.io/reclaim-notice-service";
/// Pod condition type of the reclaim notice: `True` while a notice stands, `False` once it is
/// withdrawn.
pub const RECLAIM_NOTICE_CONDITION: &str = "nightshift.io/ReclaimNotice";
/// Reason of the Event recorded on a research pod (and its Job or Workflow) for a reclaim notice.
pub const RECLAIM_NOTICE_EVENT_REASON: &str = "ReclaimNotice";
/// Annotation a research pod sets to a port of its own (e.g. `"8080"`) to be sent one HTTP POST
/// per reclaim notice.
pub const CHECKPOINT_PORT_ANNOTATION: &str = "nightshift.io/checkpoint-port";
/// Annotation a research pod may set to the HTTP path of that POST ([`DEFAULT_CHECKPOINT_PATH`]
/// without it).
pub const CHECKPOINT_PATH_ANNOTATION: &str = "nightshift.io/checkpoint-path";
/// HTTP path of the reclaim-notice POST when the pod names none.
pub const DEFAULT_CHECKPOINT_PATH: &str = "/checkpoint";
/// Downward API volume the webhook adds to research pods: the pod's annotations as a file, so a
/// container sees its reclaim notice without API access.
pub const NOTICE_VOLUME: &str = "nightshift-notice";
/// Where the webhook mounts [`NOTICE_VOLUME`] (read-only) in every container.
pub const NOTICE_MOUNT_PATH: &str = "/etc/nightshift";
/// Name of the annotations file in [`NOTICE_VOLUME`]. The kubelet writes one `key="value"` line
/// per annotation (Go-quoted values) and replaces the file atomically when they change.
pub const NOTICE_FILE: &str = "annotations";
/// Environment variable the webhook sets in every container of a research pod to the full path
/// of the annotations file ([`NOTICE_MOUNT_PATH`]`/`[`NOTICE_FILE`]).
pub const NOTICE_FILE_ENV: &str = "NIGHTSHIFT_NOTICE_FILE";
/// Value of the research, lent and spare labels when they are set.
pub const TRUE: &str = "true";

/// Environment variables of the options that each component used to have on its own, with the
/// variable that replaced each. They are no longer read; a process that finds one set refuses
/// to start rather than silently fall back to a default name.
pub const RETIRED_VARIABLES: [(&str, &str); 10] = [
    (
        "NIGHTSHIFT_WEBHOOK_SELECTION_LABEL",
        "NIGHTSHIFT_RESEARCH_LABEL",
    ),
    ("NIGHTSHIFT_WEBHOOK_LENT_LABEL", "NIGHTSHIFT_LENT_LABEL"),
    (
        "NIGHTSHIFT_WEBHOOK_PRIORITY_CLASS",
        "NIGHTSHIFT_RESEARCH_PRIORITY_CLASS",
    ),
    ("NIGHTSHIFT_WEBHOOK_GPU_RESOURCE", "NIGHTSHIFT_GPU_RESOURCE"),
    ("NIGHTSHIFT_POOL_GPU_RESOURCE", "NIGHTSHIFT_GPU_RESOURCE"),
    ("NIGHTSHIFT_WEBHOOK_POOL_LABEL", "NIGHTSHIFT_POOL_LABEL"),
    ("NIGHTSHIFT_POOL_NODE_SELECTOR", "NIGHTSHIFT_POOL_LABEL"),
    ("NIGHTSHIFT_WEBHOOK_POOLS", "NIGHTSHIFT_POOLS"),
    ("NIGHTSHIFT_WEBHOOK_POOL_TAINTS", "NIGHTSHIFT_POOL_TAINTS"),
    ("NIGHTSHIFT_WEBHOOK_SPARE_LABEL", "NIGHTSHIFT_SPARE_LABEL"),
];

/// Why the names cannot be used. Each message names the option to fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("--research-label must not be empty: it is how research pods are selected")]
    EmptyResearchLabel,
    #[error("--spare-gpus-label must not be empty")]
    EmptySpareGpusLabel,
    #[error(
        "--pool-label takes one label key, got {0:?}; to lend only some pools, give their names: \
         --pool-label=KEY --pools=NAME,..."
    )]
    PoolLabelNotAKey(String),
    #[error("--pools: {0:?} is not a label value (letters, digits, '-', '_', '.')")]
    PoolName(String),
    #[error("--pool-taints: {0}")]
    PoolTaint(String),
    #[error(
        "--gpu-resource: {0:?} is not an extended resource name: it takes a vendor's domain and \
         a name, as the device plugin advertises it on the nodes (e.g. nvidia.com/gpu, amd.com/gpu)"
    )]
    GpuResource(String),
    #[error("{old} is no longer read: set {new} instead")]
    RetiredVariable {
        old: &'static str,
        new: &'static str,
    },
}

/// The names of the contract between the webhook and the pool controller. Every option is also
/// an environment variable.
///
/// Each option replaces one or two options that the webhook and the pool used to have each; the
/// old flag names still work as hidden aliases, but their environment variables
/// ([`RETIRED_VARIABLES`]) are gone and stop start-up when set.
#[derive(Clone, Debug, Args)]
pub struct VocabularyArgs {
    /// Label that selects research pods when it is "true" on the namespace or the pod.
    #[arg(
        long,
        env = "NIGHTSHIFT_RESEARCH_LABEL",
        default_value = RESEARCH_LABEL,
        alias = "webhook-selection-label"
    )]
    pub research_label: String,

    /// Label the webhook sets to "true" on research pods; the pool counts pods carrying it as
    /// research. Empty: no label.
    #[arg(
        long,
        env = "NIGHTSHIFT_LENT_LABEL",
        default_value = LENT_LABEL,
        alias = "webhook-lent-label"
    )]
    pub lent_label: String,

    /// PriorityClass the webhook gives research pods; the pool counts pods in it as research.
    /// Empty: the webhook leaves priority alone.
    #[arg(
        long,
        env = "NIGHTSHIFT_RESEARCH_PRIORITY_CLASS",
        default_value = RESEARCH_PRIORITY_CLASS,
        alias = "webhook-priority-class"
    )]
    pub research_priority_class: String,

    /// Extended resource of GPUs (`domain/name`, as the device plugin advertises it): makes a
    /// pod a GPU pod, and is what the pool counts.
    #[arg(
        long,
        env = "NIGHTSHIFT_GPU_RESOURCE",
        default_value = GPU_RESOURCE,
        aliases = ["webhook-gpu-resource", "pool-gpu-resource"]
    )]
    pub gpu_resource: String,

    /// Node label of the GPU pool: the pool controller watches the nodes carrying it, and GPU
    /// research pods require it. Empty: no required affinity (the pool controller needs it).
    #[arg(
        long,
        env = "NIGHTSHIFT_POOL_LABEL",
        default_value = POOL_LABEL,
        aliases = ["webhook-pool-label", "pool-node-selector"]
    )]
    pub pool_label: String,

    /// Pool names (values of the pool label) lent to research, comma-separated. Empty: every
    /// pool.
    #[arg(
        long,
        env = "NIGHTSHIFT_POOLS",
        value_delimiter = ',',
        default_value = "",
        alias = "webhook-pools"
    )]
    pub pools: Vec<String>,

    /// Taints of the GPU pool that GPU research pods tolerate, as `key[=value]:Effect`
    /// (comma-separated; empty for none).
    #[arg(
        long,
        env = "NIGHTSHIFT_POOL_TAINTS",
        value_delimiter = ',',
        default_value = POOL_TAINT,
        alias = "webhook-pool-taints"
    )]
    pub pool_taints: Vec<String>,

    /// Node label the pool controller sets to "true" on spare nodes; GPU research pods prefer
    /// them. Empty: no preference (the pool controller needs it).
    #[arg(
        long,
        env = "NIGHTSHIFT_SPARE_LABEL",
        default_value = SPARE_LABEL,
        alias = "webhook-spare-label"
    )]
    pub spare_label: String,

    /// Node label the pool controller sets to the number of spare GPUs on spare nodes.
    #[arg(long, env = "NIGHTSHIFT_SPARE_GPUS_LABEL", default_value = SPARE_GPUS_LABEL)]
    pub spare_gpus_label: String,
}

/// A taint of the GPU pool that research pods must tolerate. `value: None` means "any value":
/// the toleration added uses `operator: Exists`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolTaint {
    pub key: String,
    pub value: Option<String>,
    pub effect: String,
}

impl std::str::FromStr for PoolTaint {
    type Err = String;

    /// Parses `key[=value]:Effect`, e.g. `nvidia.com/gpu:NoSchedule`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (kv, effect) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("{s:?} is not a taint: expected key[=value]:Effect"))?;
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            return Err(format!(
                "{s:?}: effect must be NoSchedule, PreferNoSchedule or NoExecute"
            ));
        }
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (kv, None),
        };
        if key.is_empty() {
            return Err(format!("{s:?}: the taint key is empty"));
        }
        Ok(Self {
            key: key.to_string(),
            value,
            effect: effect.to_string(),
        })
    }
}

/// The names in use, checked. `None` switches the part that uses a name off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vocabulary {
    pub research_label: String,
    pub lent_label: Option<String>,
    pub research_priority_class: Option<String>,
    pub gpu_resource: String,
    pub pool_label: Option<String>,
    /// Pool names; empty means every pool.
    pub pools: Vec<String>,
    pub pool_taints: Vec<PoolTaint>,
    pub spare_label: Option<String>,
    pub spare_gpus_label: String,
}

impl Default for Vocabulary {
    /// The default names, as the manifests spell them.
    fn default() -> Self {
        Self {
            research_label: RESEARCH_LABEL.into(),
            lent_label: Some(LENT_LABEL.into()),
            research_priority_class: Some(RESEARCH_PRIORITY_CLASS.into()),
            gpu_resource: GPU_RESOURCE.into(),
            pool_label: Some(POOL_LABEL.into()),
            pools: Vec::new(),
            pool_taints: vec![PoolTaint {
                key: GPU_RESOURCE.into(),
                value: None,
                effect: "NoSchedule".into(),
            }],
            spare_label: Some(SPARE_LABEL.into()),
            spare_gpus_label: SPARE_GPUS_LABEL.into(),
        }
    }
}

impl Vocabulary {
    /// The label selector of the pool's nodes (`key`, or `key in (a,b)` when pools are named);
    /// `None` without a pool label.
    pub fn pool_selector(&self) -> Option<String> {
        let key = self.pool_label.as_deref()?;
        Some(if self.pools.is_empty() {
            key.to_string()
        } else {
            format!("{key} in ({})", self.pools.join(","))
        })
    }
}

fn non_empty(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// Whether `s` is one label key rather than a selector (`key=value`, `key in (...)`, `!key`).
fn is_label_key(s: &str) -> bool {
    !s.contains(|c: char| c.is_whitespace() || "=!,()".contains(c))
}

/// Whether `s` may be a label value (Kubernetes: alphanumerics, `-`, `_`, `.`).
fn is_label_value(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Whether `s` is a name Kubernetes accepts for an extended resource, which a device plugin
/// advertises and a container requests: `domain/name`, outside the `kubernetes.io` domains (those
/// are the native resources: `cpu`, `memory`, `hugepages-…`), not starting with `requests.`
/// (the resource-quota prefix), with `name` a label name segment. A bare `gpu` is a name no
/// container can ask for, so a pool counting it would count nothing.
fn is_extended_resource(s: &str) -> bool {
    // Kubernetes' limits: a DNS subdomain is at most 253 characters, a name segment at most 63.
    const MAX_DOMAIN: usize = 253;
    const MAX_NAME: usize = 63;
    let Some((domain, name)) = s.split_once('/') else {
        return false;
    };
    let alphanumeric_ends = |part: &str| {
        part.starts_with(|c: char| c.is_ascii_alphanumeric())
            && part.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    let domain_ok = domain.len() <= MAX_DOMAIN
        && domain.split('.').all(|label| {
            alphanumeric_ends(label)
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        });
    let name_ok = name.len() <= MAX_NAME
        && alphanumeric_ends(name)
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let native = domain == "kubernetes.io" || domain.ends_with(".kubernetes.io");
    domain_ok && name_ok && !native && !s.starts_with("requests.")
}

/// Refuses to go on when a retired environment variable is set (`is_set` tells; the process
/// passes a look-up of its environment, tests a fixed one).
pub fn check_retired_variables(is_set: impl Fn(&str) -> bool) -> Result<(), Error> {
    match RETIRED_VARIABLES.iter().find(|(old, _)| is_set(old)) {
        Some(&(old, new)) => Err(Error::RetiredVariable { old, new }),
        None => Ok(()),
    }
}

impl VocabularyArgs {
    /// The names these options give, checked; also refuses retired environment variables.
    pub fn vocabulary(&self) -> Result<Vocabulary, Error> {
        check_retired_variables(|name| std::env::var_os(name).is_some())?;
        self.checked()
    }

    /// The names these options give, checked (no look at the environment).
    pub fn checked(&self) -> Result<Vocabulary, Error> {
        let research_label = non_empty(&self.research_label).ok_or(Error::EmptyResearchLabel)?;
        let spare_gpus_label =
            non_empty(&self.spare_gpus_label).ok_or(Error::EmptySpareGpusLabel)?;
        let pool_label = non_empty(&self.pool_label);
        if let Some(label) = pool_label.as_deref().filter(|l| !is_label_key(l)) {
            return Err(Error::PoolLabelNotAKey(label.to_string()));
        }
        let pools: Vec<String> = self.pools.iter().filter_map(|p| non_empty(p)).collect();
        if let Some(bad) = pools.iter().find(|p| !is_label_value(p)) {
            return Err(Error::PoolName(bad.clone()));
        }
        let gpu_resource = self.gpu_resource.trim();
        if !is_extended_resource(gpu_resource) {
            return Err(Error::GpuResource(gpu_resource.to_string()));
        }
        let pool_taints = self
            .pool_taints
            .iter()
            .filter(|t| !t.trim().is_empty())
            .map(|t| t.parse::<PoolTaint>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(Error::PoolTaint)?;
        Ok(Vocabulary {
            research_label,
            lent_label: non_empty(&self.lent_label),
            research_priority_class: non_empty(&self.research_priority_class),
            gpu_resource: gpu_resource.to_string(),
            pool_label,
            pools,
            pool_taints,
            spare_label: non_empty(&self.spare_label),
            spare_gpus_label,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cmd {
        #[command(flatten)]
        vocabulary: VocabularyArgs,
    }

    fn parse(args: &[&str]) -> Result<Vocabulary, String> {
        let cmd = Cmd::try_parse_from(std::iter::once("nightshift").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cmd.vocabulary.checked().map_err(|e| e.to_string())
    }

    #[test]
    fn default_options_give_the_default_names() {
        assert_eq!(parse(&[]), Ok(Vocabulary::default()));
        assert_eq!(
            Vocabulary::default().pool_selector().as_deref(),
            Some(POOL_LABEL)
        );
    }

    #[test]
    fn the_old_flag_names_still_set_the_names() {
        let v = parse(&[
            "--webhook-selection-label=example.com/research",
            "--webhook-lent-label=example.com/borrowed",
            "--webhook-priority-class=scavenger",
            "--pool-gpu-resource=amd.com/gpu",
            "--pool-node-selector=example.com/pool",
            "--webhook-pools=h100",
            "--webhook-pool-taints=",
            "--webhook-spare-label=example.com/spare",
        ])
        .expect("valid");
        assert_eq!(v.research_label, "example.com/research");
        assert_eq!(v.lent_label.as_deref(), Some("example.com/borrowed"));
        assert_eq!(v.research_priority_class.as_deref(), Some("scavenger"));
        assert_eq!(v.gpu_resource, "amd.com/gpu");
        assert_eq!(
            v.pool_selector().as_deref(),
            Some("example.com/pool in (h100)")
        );
        assert!(v.pool_taints.is_empty());
        assert_eq!(v.spare_label.as_deref(), Some("example.com/spare"));
        let v = parse(&["--webhook-gpu-resource=amd.com/gpu"]).expect("valid");
        assert_eq!(v.gpu_resource, "amd.com/gpu");
    }

    #[test]
    fn empty_options_switch_their_part_off() {
        let v = parse(&[
            "--lent-label=",
            "--research-priority-class=",
            "--pool-label=",
            "--spare-label=",
        ])
        .expect("valid");
        assert_eq!(v.pool_selector(), None);
        assert_eq!(
            (v.lent_label, v.research_priority_class, v.spare_label),
            (None, None, None)
        );
        assert_eq!(
            parse(&["--research-label= "]),
            Err(Error::EmptyResearchLabel.to_string())
        );
        assert_eq!(
            parse(&["--spare-gpus-label="]),
            Err(Error::EmptySpareGpusLabel.to_string())
        );
    }

    #[test]
    fn a_selector_is_not_a_pool_label() {
        let err = parse(&["--pool-node-selector=nightshift.io/pool=a100"]).expect_err("selector");
        assert!(err.contains("--pools=NAME"), "{err}");
        assert!(parse(&["--pools=h100,a 100"]).is_err());
        assert_eq!(
            parse(&["--pools=h100,a100"])
                .expect("valid")
                .pool_selector()
                .as_deref(),
            Some("nightshift.io/pool in (h100,a100)")
        );
    }

    #[test]
    fn the_gpu_resource_is_an_extended_resource_name() {
        for good in [
            "nvidia.com/gpu",
            "amd.com/gpu",
            "gpu.intel.com/i915",
            "nvidia.com/mig-1g.5gb",
            "habana.ai/gaudi",
            " nvidia.com/gpu ",
        ] {
            assert_eq!(
                parse(&[&format!("--gpu-resource={good}")])
                    .map(|v| v.gpu_resource)
                    .as_deref(),
                Ok(good.trim()),
                "{good}"
            );
        }
        for bad in [
            "",
            "gpu",
            "nvidia.com/",
            "/gpu",
            "nvidia.com/gpu/0",
            "Nvidia.com/gpu",
            "nvidia..com/gpu",
            "nvidia.com/-gpu",
            "nvidia.com/g pu",
            "kubernetes.io/gpu",
            "devices.kubernetes.io/gpu",
            "requests.nvidia.com/gpu",
        ] {
            let err = parse(&[&format!("--gpu-resource={bad}")]).expect_err(bad);
            assert_eq!(err, Error::GpuResource(bad.trim().to_string()).to_string());
        }
        let long_name = format!("nvidia.com/{}", "g".repeat(64));
        assert!(parse(&[&format!("--gpu-resource={long_name}")]).is_err());
    }

    #[test]
    fn pool_taints_are_parsed() {
        let v = parse(&["--pool-taints=nvidia.com/gpu=present:NoSchedule,dedicated:NoExecute"])
            .expect("valid");
        assert_eq!(v.pool_taints.len(), 2);
        let err = parse(&["--pool-taints=nonsense"]).expect_err("invalid");
        assert!(err.contains("key[=value]:Effect"), "{err}");
    }

    #[test]
    fn retired_variables_stop_start_up_and_name_their_replacement() {
        assert_eq!(check_retired_variables(|_| false), Ok(()));
        let err = check_retired_variables(|n| n == "NIGHTSHIFT_WEBHOOK_PRIORITY_CLASS")
            .expect_err("retired");
        assert_eq!(
            err.to_string(),
            "NIGHTSHIFT_WEBHOOK_PRIORITY_CLASS is no longer read: set \
             NIGHTSHIFT_RESEARCH_PRIORITY_CLASS instead"
        );
    }
}
