//! GPU accounting for the pool, as the kube-scheduler counts it.
//!
//! Owns the compact facts kept per node and per pod ([`NodeFacts`], [`PodFacts`]), their
//! extraction from Kubernetes objects, and the [`Ledger`] that sums GPU requests per node into
//! protected (every non-research pod), lent (research pods) and free. Pure: no I/O, no clock;
//! callers pass the time when it matters, and the names of labels, classes and the GPU resource
//! as a [`Vocabulary`].
//!
//! Only compact facts are kept, never whole `Pod` objects, so that a cluster of 20,000 pods costs
//! a few MiB and a pod event updates one node's sums in O(1).

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use serde::{Deserialize, Serialize};

use super::owner::{Owner, owner_of};
use crate::core::vocabulary::{
    CHECKPOINT_PATH_ANNOTATION, CHECKPOINT_PORT_ANNOTATION, CHECKPOINTED_AT_ANNOTATION,
    DEFAULT_CHECKPOINT_PATH, RECLAIM_NOTICE_ANNOTATION, RECLAIM_NOTICE_SERVICE_ANNOTATION, TRUE,
    Vocabulary,
};

/// What is known about one pool node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    /// Allocatable GPUs; `None` when the node reports a value that is not a whole number.
    pub allocatable: Option<u64>,
    /// `false` when cordoned (`spec.unschedulable`).
    pub schedulable: bool,
    /// `true` only when the `Ready` condition is `True`.
    pub ready: bool,
    /// Current value of the spare label (`nightshift.io/spare`).
    pub spare_label: Option<String>,
    /// Current value of the spare-GPUs label (`nightshift.io/spare-gpus`).
    pub spare_gpus_label: Option<String>,
}

/// How a research pod was disrupted, from its `DisruptionTarget` condition (or the kubelet's
/// `Evicted` status reason).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disruption {
    /// `PreemptionByScheduler`, `EvictionByEvictionAPI`, `DeletionByTaintManager`,
    /// `TerminationByKubelet`, `DeletionByPodGC` or `Evicted`.
    pub reason: String,
    /// When the condition was set, if known.
    pub at: Option<Timestamp>,
}

/// What is known about one pod: just enough for accounting, status and preemption tracking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    /// The pod's UID (or `namespace/name` when the UID is missing).
    pub key: String,
    pub namespace: String,
    pub name: String,
    /// `spec.nodeName`: the node the pod is bound to.
    pub node: Option<String>,
    /// Effective GPU request; `None` when a quantity is not a whole number.
    pub gpus: Option<u64>,
    pub research: bool,
    /// `Succeeded` or `Failed`: the scheduler no longer counts it.
    pub terminal: bool,
    pub phase: String,
    pub created: Option<Timestamp>,
    pub started: Option<Timestamp>,
    /// `spec.priority` (0 when unset, as the scheduler reads it): the scheduler preempts the
    /// lowest first.
    pub priority: i32,
    /// `nightshift.io/checkpointed-at`, when the pod reports a readable one.
    pub checkpointed: Option<Timestamp>,
    /// `nightshift.io/reclaim-notice`: when the pod was warned of a reclaim (research pods).
    pub noticed: Option<Timestamp>,
    /// `nightshift.io/reclaim-notice-service`: the inference service (`namespace/name`) the
    /// notice was given for, read with [`Self::noticed`] only.
    pub noticed_for: Option<String>,
    /// Where the pod takes a checkpoint request (research pods that declare a port and have an
    /// address).
    pub hook: Option<Hook>,
    pub disruption: Option<Disruption>,
    /// The Job or Workflow controlling a research pod, told its pod's Events too (kept for
    /// research pods only: nothing is told about the others).
    pub owner: Option<Owner>,
    /// The node's slot in the [`Ledger`], assigned when the ledger takes the pod, so that a
    /// recount adds up without hashing node names.
    slot: Option<u32>,
}

/// A research pod's checkpoint endpoint: its own address, the port and path it declared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hook {
    pub ip: std::net::IpAddr,
    pub port: u16,
    pub path: String,
}

impl Hook {
    /// The endpoint of `pod`, if it declares a port (`nightshift.io/checkpoint-port`, 1–65535)
    /// and has an address. A path that does not start with `/` is refused (it would change the
    /// authority of the URL); without one, [`DEFAULT_CHECKPOINT_PATH`].
    pub fn of(pod: &Pod) -> Option<Self> {
        let annotations = pod.metadata.annotations.as_ref()?;
        let port: u16 = annotations
            .get(CHECKPOINT_PORT_ANNOTATION)?
            .trim()
            .parse()
            .ok()
            .filter(|p| *p > 0)?;
        let path = match annotations.get(CHECKPOINT_PATH_ANNOTATION) {
            Some(p) if p.starts_with('/') && !p.contains(char::is_whitespace) => p.clone(),
            Some(_) => return None,
            None => DEFAULT_CHECKPOINT_PATH.to_string(),
        };
        let ip = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
        Some(Self { ip, port, path })
    }

    /// The URL the controller POSTs to.
    pub fn url(&self) -> String {
        let addr = std::net::SocketAddr::new(self.ip, self.port);
        format!("http://{addr}{}", self.path)
    }
}

impl PodFacts {
    /// The node slot and GPUs this pod holds for the scheduler (`None` when unbound or terminal).
    fn holds(&self) -> Option<(u32, Option<u64>)> {
        match (self.slot, self.terminal) {
            (Some(slot), false) => Some((slot, self.gpus)),
            _ => None,
        }
    }
}

/// Parses a Kubernetes quantity that must be a whole, non-negative number of units (extended
/// resources such as GPUs cannot be fractional). Returns `None` otherwise.
pub fn parse_whole_quantity(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let number = number.strip_prefix('+').unwrap_or(number);
    if number.is_empty() {
        return None;
    }
    // Work in thousandths so that `1500m` and `1.5` are recognised as fractional and `2000m` as 2.
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if frac_part.len() > 3 || !int_part.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let int: u128 = if int_part.is_empty() {
        0
    } else {
        int_part.parse().ok()?
    };
    let frac: u128 = if frac_part.is_empty() {
        0
    } else {
        format!("{frac_part:0<3}").parse().ok()?
    };
    let milli = int.checked_mul(1000)?.checked_add(frac)?;
    let scaled_milli: u128 = match suffix {
        "" => milli,
        // Thousandths of a milli-unit are not a quantity anyone writes for a device.
        "m" if milli.is_multiple_of(1000) => milli / 1000,
        "m" => return None,
        "k" => milli.checked_mul(1_000)?,
        "M" => milli.checked_mul(1_000_000)?,
        "G" => milli.checked_mul(1_000_000_000)?,
        "T" => milli.checked_mul(1_000_000_000_000)?,
        "Ki" => milli.checked_mul(1 << 10)?,
        "Mi" => milli.checked_mul(1 << 20)?,
        "Gi" => milli.checked_mul(1 << 30)?,
        "Ti" => milli.checked_mul(1 << 40)?,
        _ => return None,
    };
    if !scaled_milli.is_multiple_of(1000) {
        return None;
    }
    u64::try_from(scaled_milli / 1000).ok()
}

fn container_request(c: &Container, resource: &str) -> Option<u64> {
    let Some(res) = c.resources.as_ref() else {
        return Some(0);
    };
    // The API server defaults requests to limits for extended resources; read limits too for
    // objects that did not go through defaulting.
    let q = res
        .requests
        .as_ref()
        .and_then(|r| r.get(resource))
        .or_else(|| res.limits.as_ref().and_then(|l| l.get(resource)));
    match q {
        Some(q) => parse_whole_quantity(&q.0),
        None => Some(0),
    }
}

/// The pod's effective request of `resource`, as the scheduler computes it
/// (`k8s.io/component-helpers/resource.PodRequests`): the larger of (app containers + restartable
/// sidecar init containers) and the largest init container (plus the sidecars started before
/// it), plus pod overhead. `None` when a quantity is not a whole number.
pub fn pod_gpu_request(pod: &Pod, resource: &str) -> Option<u64> {
    let Some(spec) = pod.spec.as_ref() else {
        return Some(0);
    };
    let mut reqs: u64 = 0;
    for c in &spec.containers {
        reqs = reqs.checked_add(container_request(c, resource)?)?;
    }
    let mut sidecars: u64 = 0;
    let mut init_max: u64 = 0;
    for c in spec.init_containers.iter().flatten() {
        let r = container_request(c, resource)?;
        let during = if c.restart_policy.as_deref() == Some("Always") {
            reqs = reqs.checked_add(r)?;
            sidecars = sidecars.checked_add(r)?;
            sidecars
        } else {
            r.checked_add(sidecars)?
        };
        init_max = init_max.max(during);
    }
    let mut total = reqs.max(init_max);
    if let Some(q) = spec.overhead.as_ref().and_then(|o| o.get(resource)) {
        total = total.checked_add(parse_whole_quantity(&q.0)?)?;
    }
    Some(total)
}

/// Whether a pod is research work lent the pool's GPUs: it carries the lent label (set by the
/// webhook) or the research label with the value `"true"`, or runs in the research
/// PriorityClass. Namespaces are resolved by the webhook, which then sets the lent label.
pub fn is_research(pod: &Pod, names: &Vocabulary) -> bool {
    let labelled = pod.metadata.labels.as_ref().is_some_and(|l| {
        let says_true = |key: &str| l.get(key).is_some_and(|v| v == TRUE);
        names.lent_label.as_deref().is_some_and(says_true) || says_true(&names.research_label)
    });
    labelled
        || names
            .research_priority_class
            .as_deref()
            .is_some_and(|class| {
                pod.spec
                    .as_ref()
                    .and_then(|s| s.priority_class_name.as_deref())
                    == Some(class)
            })
}

fn disruption(pod: &Pod) -> Option<Disruption> {
    let status = pod.status.as_ref()?;
    let from_condition = status.conditions.iter().flatten().find_map(|c| {
        (c.type_ == "DisruptionTarget" && c.status == "True").then(|| Disruption {
            reason: c
                .reason
                .clone()
                .unwrap_or_else(|| "DisruptionTarget".to_string()),
            at: c.last_transition_time.as_ref().map(|t| t.0),
        })
    });
    from_condition.or_else(|| {
        (status.reason.as_deref() == Some("Evicted")).then(|| Disruption {
            reason: "Evicted".to_string(),
            at: None,
        })
    })
}

/// Extracts the compact facts of a pod.
pub fn pod_facts(pod: &Pod, names: &Vocabulary) -> PodFacts {
    let meta = &pod.metadata;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let key = meta
        .uid
        .clone()
        .unwrap_or_else(|| format!("{namespace}/{name}"));
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_else(|| "Pending".to_string());
    let research = is_research(pod, names);
    let noticed = research
        .then(|| meta.annotations.as_ref()?.get(RECLAIM_NOTICE_ANNOTATION))
        .flatten()
        .and_then(|v| v.trim().parse::<Timestamp>().ok());
    PodFacts {
        key,
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        gpus: pod_gpu_request(pod, &names.gpu_resource),
        research,
        terminal: phase == "Succeeded" || phase == "Failed",
        created: meta.creation_timestamp.as_ref().map(|t| t.0),
        started: pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0),
        priority: pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
        checkpointed: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(CHECKPOINTED_AT_ANNOTATION))
            .and_then(|v| v.trim().parse::<Timestamp>().ok()),
        noticed,
        noticed_for: noticed
            .and(meta.annotations.as_ref())
            .and_then(|a| a.get(RECLAIM_NOTICE_SERVICE_ANNOTATION))
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty()),
        hook: if research { Hook::of(pod) } else { None },
        disruption: disruption(pod),
        owner: if research { owner_of(meta) } else { None },
        slot: None,
        namespace,
        name,
        phase,
    }
}

/// Extracts the compact facts of a node.
pub fn node_facts(node: &Node, names: &Vocabulary) -> NodeFacts {
    let labels = node.metadata.labels.as_ref();
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(&names.gpu_resource))
        .map_or(Some(0), |q| parse_whole_quantity(&q.0));
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    NodeFacts {
        name: node.metadata.name.clone().unwrap_or_default(),
        allocatable,
        schedulable: !node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
        ready,
        spare_label: labels
            .zip(names.spare_label.as_deref())
            .and_then(|(l, key)| l.get(key).cloned()),
        spare_gpus_label: labels.and_then(|l| l.get(&names.spare_gpus_label).cloned()),
    }
}

/// GPU requests summed on one node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Requested by non-research, non-terminal pods.
    pub protected: u64,
    /// Requested by research, non-terminal pods.
    pub lent: u64,
    /// Pods whose request could not be read: the node's sums cannot be trusted.
    pub unknown: u32,
}

impl Usage {
    fn add(&mut self, research: bool, gpus: Option<u64>) {
        match gpus {
            Some(g) if research => self.lent = self.lent.saturating_add(g),
            Some(g) => self.protected = self.protected.saturating_add(g),
            None => self.unknown = self.unknown.saturating_add(1),
        }
    }

    fn sub(&mut self, research: bool, gpus: Option<u64>) {
        match gpus {
            Some(g) if research => self.lent = self.lent.saturating_sub(g),
            Some(g) => self.protected = self.protected.saturating_sub(g),
            None => self.unknown = self.unknown.saturating_sub(1),
        }
    }
}

/// The accounting of one pool node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeGpus {
    /// Allocatable GPUs (0 when unreadable).
    pub allocatable: u64,
    pub protected: u64,
    pub lent: u64,
    /// Allocatable minus requests, never negative.
    pub free: u64,
    /// `false` when a quantity on the node or one of its pods could not be read.
    pub trusted: bool,
}

/// Cluster-wide sums over the pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuTotals {
    pub allocatable: u64,
    pub protected: u64,
    pub lent: u64,
    pub free: u64,
}

/// A research pod newly seen disrupted, with how long it had run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisruptionRecord {
    pub namespace: String,
    pub name: String,
    pub node: Option<String>,
    pub reason: String,
    /// Seconds from the pod's start to its disruption (`None` if it never started).
    pub ran_seconds: Option<i64>,
    pub gpus: u64,
    pub at: Timestamp,
    /// GPU-seconds of work lost: GPUs × time since the last checkpoint the pod reported
    /// (`nightshift.io/checkpointed-at`), or since it started. `None` if it never started.
    #[serde(default)]
    pub lost_gpu_seconds: Option<u64>,
    /// The pod's UID, when the API server gave one (events name the pod by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// When the pod was warned of the reclaim (`nightshift.io/reclaim-notice`), if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noticed: Option<Timestamp>,
    /// The inference service (its ScaledObject, `namespace/name`) whose scale-up took the GPUs,
    /// when nightshift can tell: the service the pod's reclaim notice was given for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The pod's Job or Workflow, told of the disruption too; not part of `/status`.
    #[serde(skip)]
    pub owner: Option<Owner>,
}

/// Per-node GPU sums over every pod, updated incrementally.
///
/// Usage is kept per node name for every node that has pods, pool member or not, so that a node
/// joining the pool (or arriving after its pods) needs no recount. Node names are interned into
/// slots (never released: node names are few and long-lived), so that sums are array updates.
#[derive(Debug, Default)]
pub struct Ledger {
    nodes: HashMap<String, NodeFacts>,
    pods: HashMap<String, PodFacts>,
    slots: HashMap<String, u32>,
    usage: Vec<Usage>,
    /// `false` until the first full pod list: disruptions seen then happened before we started
    /// and are not counted again.
    synced_pods: bool,
    relist: Option<HashMap<String, PodFacts>>,
}

impl Ledger {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a pool node.
    pub fn apply_node(&mut self, node: NodeFacts) {
        self.nodes.insert(node.name.clone(), node);
    }

    /// Removes a node from the pool.
    pub fn delete_node(&mut self, name: &str) {
        self.nodes.remove(name);
    }

    /// Replaces every pool node at once (after a list).
    pub fn replace_nodes(&mut self, nodes: impl IntoIterator<Item = NodeFacts>) {
        self.nodes = nodes.into_iter().map(|n| (n.name.clone(), n)).collect();
    }

    /// Adds or updates a pod. Returns a record when a research pod is newly seen disrupted.
    pub fn apply_pod(&mut self, mut pod: PodFacts, now: Timestamp) -> Option<DisruptionRecord> {
        if let Some(relist) = self.relist.as_mut() {
            relist.insert(pod.key.clone(), pod);
            return None;
        }
        self.assign_slot(&mut pod);
        let old = self.pods.remove(&pod.key);
        if let Some((slot, gpus)) = old.as_ref().and_then(PodFacts::holds) {
            self.sub_usage(slot, old.as_ref().is_some_and(|o| o.research), gpus);
        }
        if let Some((slot, gpus)) = pod.holds() {
            self.add_usage(slot, pod.research, gpus);
        }
        let record = newly_disrupted(old.as_ref(), &pod, self.synced_pods, now);
        self.pods.insert(pod.key.clone(), pod);
        record
    }

    /// The pod with this key (its UID, or `namespace/name`).
    pub fn pod(&self, key: &str) -> Option<&PodFacts> {
        self.pods.get(key)
    }

    /// Removes a pod. Returns a record when a research pod is newly seen disrupted.
    pub fn delete_pod(&mut self, pod: &PodFacts, now: Timestamp) -> Option<DisruptionRecord> {
        if let Some(relist) = self.relist.as_mut() {
            relist.remove(&pod.key);
            return None;
        }
        let old = self.pods.remove(&pod.key)?;
        if let Some((slot, gpus)) = old.holds() {
            self.sub_usage(slot, old.research, gpus);
        }
        newly_disrupted(Some(&old), pod, self.synced_pods, now)
    }

    fn slot(&mut self, node: &str) -> u32 {
        if let Some(&slot) = self.slots.get(node) {
            return slot;
        }
        let slot = u32::try_from(self.usage.len()).unwrap_or(u32::MAX);
        self.usage.push(Usage::default());
        self.slots.insert(node.to_string(), slot);
        slot
    }

    fn assign_slot(&mut self, pod: &mut PodFacts) {
        pod.slot = pod.node.as_deref().map(|node| self.slot(node));
    }

    fn add_usage(&mut self, slot: u32, research: bool, gpus: Option<u64>) {
        if let Some(u) = self.usage.get_mut(slot as usize) {
            u.add(research, gpus);
        }
    }

    fn sub_usage(&mut self, slot: u32, research: bool, gpus: Option<u64>) {
        if let Some(u) = self.usage.get_mut(slot as usize) {
            u.sub(research, gpus);
        }
    }

    /// Starts a re-list of pods: pods are buffered until [`Ledger::finish_pod_relist`].
    pub fn begin_pod_relist(&mut self) {
        self.relist = Some(HashMap::with_capacity(self.pods.len()));
    }

    /// Replaces every pod with the re-listed ones and recounts. Returns disruptions of research
    /// pods that happened while the watch was interrupted (none on the first list).
    pub fn finish_pod_relist(&mut self, now: Timestamp) -> Vec<DisruptionRecord> {
        let Some(mut new) = self.relist.take() else {
            return Vec::new();
        };
        for pod in new.values_mut() {
            self.assign_slot(pod);
        }
        let records = if self.synced_pods {
            new.values()
                .filter_map(|p| newly_disrupted(self.pods.get(&p.key), p, true, now))
                .collect()
        } else {
            Vec::new()
        };
        self.pods = new;
        self.synced_pods = true;
        self.recount();
        records
    }

    /// Replaces every pod at once (tests and benchmarks).
    #[cfg(any(test, feature = "test-support"))]
    pub fn replace_pods(&mut self, pods: impl IntoIterator<Item = PodFacts>) {
        let mut new: HashMap<String, PodFacts> =
            pods.into_iter().map(|p| (p.key.clone(), p)).collect();
        for pod in new.values_mut() {
            self.assign_slot(pod);
        }
        self.pods = new;
        self.synced_pods = true;
        self.recount();
    }

    /// Recomputes every node's sums from the pods.
    pub fn recount(&mut self) {
        self.usage.fill(Usage::default());
        for pod in self.pods.values() {
            if let Some((slot, gpus)) = pod.holds()
                && let Some(u) = self.usage.get_mut(slot as usize)
            {
                u.add(pod.research, gpus);
            }
        }
    }

    /// The pool nodes, in no particular order.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeFacts> {
        self.nodes.values()
    }

    pub fn node(&self, name: &str) -> Option<&NodeFacts> {
        self.nodes.get(name)
    }

    /// Every pod known, in no particular order.
    pub fn pods(&self) -> impl Iterator<Item = &PodFacts> {
        self.pods.values()
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// The accounting of one pool node (`None` when it is not in the pool).
    pub fn gpus(&self, name: &str) -> Option<NodeGpus> {
        let node = self.nodes.get(name)?;
        let usage = self
            .slots
            .get(name)
            .and_then(|&slot| self.usage.get(slot as usize))
            .copied()
            .unwrap_or_default();
        let allocatable = node.allocatable.unwrap_or(0);
        Some(NodeGpus {
            allocatable,
            protected: usage.protected,
            lent: usage.lent,
            free: allocatable.saturating_sub(usage.protected.saturating_add(usage.lent)),
            trusted: node.allocatable.is_some() && usage.unknown == 0,
        })
    }

    /// Sums over the pool.
    pub fn totals(&self) -> GpuTotals {
        let mut t = GpuTotals::default();
        for name in self.nodes.keys() {
            if let Some(g) = self.gpus(name) {
                t.allocatable += g.allocatable;
                t.protected += g.protected;
                t.lent += g.lent;
                t.free += g.free;
            }
        }
        t
    }

    /// GPUs that research pods hold on pool nodes now, per namespace.
    pub fn lent_by_namespace(&self) -> BTreeMap<String, u64> {
        let mut lent = BTreeMap::new();
        for p in self.pods.values().filter(|p| p.research && !p.terminal) {
            let on_pool = p.node.as_ref().is_some_and(|n| self.nodes.contains_key(n));
            if let (true, Some(g)) = (on_pool, p.gpus) {
                *lent.entry(p.namespace.clone()).or_insert(0) += g;
            }
        }
        lent
    }

    /// A rough figure of the heap this ledger holds, for capacity planning.
    pub fn approx_heap_bytes(&self) -> usize {
        let pod_strings: usize = self
            .pods
            .values()
            .map(|p| {
                p.key.capacity()
                    + p.namespace.capacity()
                    + p.name.capacity()
                    + p.node.as_ref().map_or(0, String::capacity)
                    + p.phase.capacity()
                    + p.disruption.as_ref().map_or(0, |d| d.reason.capacity())
            })
            .sum();
        let pod_table = self.pods.capacity()
            * (std::mem::size_of::<String>() + std::mem::size_of::<PodFacts>() + 1);
        let pod_keys: usize = self.pods.keys().map(String::capacity).sum();
        let node_table = self.nodes.capacity()
            * (std::mem::size_of::<String>() + std::mem::size_of::<NodeFacts>() + 1)
            + self.usage.capacity() * std::mem::size_of::<Usage>()
            + self.slots.capacity() * (std::mem::size_of::<String>() + 4 + 1);
        let node_strings: usize = self.nodes.keys().map(|k| k.capacity() * 2).sum::<usize>()
            + self.slots.keys().map(String::capacity).sum::<usize>();
        pod_strings + pod_table + pod_keys + node_table + node_strings
    }
}

fn newly_disrupted(
    old: Option<&PodFacts>,
    new: &PodFacts,
    synced: bool,
    now: Timestamp,
) -> Option<DisruptionRecord> {
    if !new.research || !synced {
        return None;
    }
    let disruption = new.disruption.as_ref()?;
    if old.is_some_and(|o| o.disruption.is_some()) {
        return None;
    }
    Some(DisruptionRecord::new(
        new,
        &disruption.reason,
        disruption.at.unwrap_or(now),
    ))
}

impl DisruptionRecord {
    /// The record of `pod` disrupted for `reason` at `at`.
    pub fn new(pod: &PodFacts, reason: &str, at: Timestamp) -> Self {
        let gpus = pod.gpus.unwrap_or(0);
        let noticed = pod.noticed.filter(|n| *n <= at);
        Self {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            node: pod.node.clone(),
            reason: reason.to_string(),
            ran_seconds: pod.started.map(|s| at.duration_since(s).as_secs().max(0)),
            gpus,
            at,
            lost_gpu_seconds: lost_work(pod.started, pod.checkpointed, at)
                .map(|secs| secs.saturating_mul(gpus)),
            // The key is the UID, or `namespace/name` without one (a UID never holds a `/`).
            uid: (!pod.key.contains('/')).then(|| pod.key.clone()),
            noticed,
            service: noticed.and(pod.noticed_for.clone()),
            owner: pod.owner.clone(),
        }
    }
}

/// Seconds of work lost at `at`: since the last checkpoint before `at` or, without one, since
/// the start. A checkpoint before the start (a restarted pod's old annotation) or after `at`
/// (clock skew) does not count.
pub fn lost_work(
    started: Option<Timestamp>,
    checkpointed: Option<Timestamp>,
    at: Timestamp,
) -> Option<u64> {
    let started = started?;
    let since = checkpointed
        .filter(|c| *c >= started && *c <= at)
        .unwrap_or(started);
    Some(u64::try_from(at.duration_since(since).as_secs()).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::vocabulary::GPU_RESOURCE;
    use crate::test_support::fixtures::{node, pod};
    use std::sync::LazyLock;

    /// The default names.
    static R: LazyLock<Vocabulary> = LazyLock::new(Vocabulary::default);

    fn req(p: crate::test_support::fixtures::PodBuilder) -> Option<u64> {
        pod_gpu_request(&p.build(), GPU_RESOURCE)
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_000_000).expect("ts")
    }

    #[test]
    fn lost_work_runs_from_the_last_checkpoint_else_from_the_start() {
        let t = |s: i64| Timestamp::from_second(1_900_000_000 + s).expect("ts");
        assert_eq!(lost_work(Some(t(0)), None, t(3600)), Some(3600));
        assert_eq!(lost_work(Some(t(0)), Some(t(3000)), t(3600)), Some(600));
        assert_eq!(
            lost_work(Some(t(100)), Some(t(50)), t(3600)),
            Some(3500),
            "a checkpoint older than this start is a previous pod's"
        );
        assert_eq!(
            lost_work(Some(t(0)), Some(t(4000)), t(3600)),
            Some(3600),
            "a checkpoint after the disruption (clock skew) does not count"
        );
        assert_eq!(lost_work(None, Some(t(10)), t(3600)), None, "never started");
    }

    #[test]
    fn a_checkpoint_endpoint_needs_a_port_an_address_and_a_plain_path() {
        let names = Vocabulary::default();
        let with = |port: &str, path: Option<&str>| {
            let mut p = pod("res", "train")
                .on("n1")
                .gpus(1)
                .research()
                .annotation(CHECKPOINT_PORT_ANNOTATION, port);
            if let Some(path) = path {
                p = p.annotation(CHECKPOINT_PATH_ANNOTATION, path);
            }
            let mut pod = p.build();
            pod.status.get_or_insert_default().pod_ip = Some("10.244.0.7".into());
            pod_facts(&pod, &names).hook
        };
        let hook = with("8080", None).expect("hook");
        assert_eq!(hook.url(), "http://10.244.0.7:8080/checkpoint");
        assert_eq!(
            with("9000", Some("/save")).expect("hook").url(),
            "http://10.244.0.7:9000/save"
        );
        for (port, path) in [
            ("0", None),
            ("http", None),
            ("70000", None),
            ("8080", Some("@evil/x")),
            ("8080", Some("/a b")),
        ] {
            assert_eq!(with(port, path), None, "{port} {path:?}");
        }
    }

    #[test]
    fn a_readable_checkpoint_annotation_is_taken_and_a_garbled_one_ignored() {
        let names = Vocabulary::default();
        let at = Timestamp::from_second(1_900_000_000).expect("ts");
        let p = pod("r", "x")
            .annotation(CHECKPOINTED_AT_ANNOTATION, &at.to_string())
            .build();
        assert_eq!(pod_facts(&p, &names).checkpointed, Some(at));
        let p = pod("r", "x")
            .annotation(CHECKPOINTED_AT_ANNOTATION, "yesterday")
            .build();
        assert_eq!(pod_facts(&p, &names).checkpointed, None);
    }

    #[test]
    fn a_preemption_names_the_service_its_notice_was_given_for() {
        let names = Vocabulary::default();
        let warned = Timestamp::from_second(1_900_000_000).expect("ts");
        let preempted = warned + jiff::SignedDuration::from_secs(90);
        let noticed = |service: Option<&str>| {
            let p = pod("r", "x").on("a").gpus(4).research();
            let p = p.annotation(RECLAIM_NOTICE_ANNOTATION, &warned.to_string());
            match service {
                Some(s) => p.annotation(RECLAIM_NOTICE_SERVICE_ANNOTATION, s),
                None => p,
            }
            .build()
        };
        let facts = pod_facts(&noticed(Some("inference/llama")), &names);
        let record = DisruptionRecord::new(&facts, "PreemptionByScheduler", preempted);
        assert_eq!(record.service.as_deref(), Some("inference/llama"));
        // A notice given after the disruption did not foretell it.
        let record = DisruptionRecord::new(
            &facts,
            "PreemptionByScheduler",
            warned - jiff::SignedDuration::from_secs(1),
        );
        assert_eq!((record.noticed, record.service), (None, None));
        // Without the service annotation, or without the notice itself, nothing is named.
        let facts = pod_facts(&noticed(None), &names);
        assert_eq!(facts.noticed_for, None);
        let p = pod("r", "y")
            .research()
            .annotation(RECLAIM_NOTICE_SERVICE_ANNOTATION, "inference/llama")
            .build();
        assert_eq!(pod_facts(&p, &names).noticed_for, None);
    }

    #[test]
    fn lent_gpus_are_summed_per_namespace_on_pool_nodes_only() {
        let names = Vocabulary::default();
        let mut l = Ledger::new();
        l.apply_node(node_facts(&node("a", 8).build(), &names));
        let now = Timestamp::from_second(1_900_000_000).expect("ts");
        for p in [
            pod("t1", "a").on("a").gpus(2).research().build(),
            pod("t1", "b").on("a").gpus(1).research().build(),
            pod("t2", "c").on("a").gpus(4).research().build(),
            pod("t2", "off-pool")
                .on("elsewhere")
                .gpus(4)
                .research()
                .build(),
            pod("t3", "done")
                .on("a")
                .gpus(4)
                .research()
                .phase("Succeeded")
                .build(),
            pod("serving", "v").on("a").gpus(1).build(),
        ] {
            l.apply_pod(pod_facts(&p, &names), now);
        }
        let by_ns: Vec<(String, u64)> = l.lent_by_namespace().into_iter().collect();
        assert_eq!(by_ns, [("t1".to_string(), 3), ("t2".to_string(), 4)]);
    }

    #[test]
    fn quantities_must_be_whole_units() {
        assert_eq!(parse_whole_quantity("8"), Some(8));
        assert_eq!(parse_whole_quantity("0"), Some(0));
        assert_eq!(parse_whole_quantity("2000m"), Some(2));
        assert_eq!(parse_whole_quantity("1k"), Some(1000));
        assert_eq!(parse_whole_quantity("2.0"), Some(2));
        assert_eq!(parse_whole_quantity("1.5"), None);
        assert_eq!(parse_whole_quantity("500m"), None);
        assert_eq!(parse_whole_quantity("-1"), None);
        assert_eq!(parse_whole_quantity("eight"), None);
        assert_eq!(parse_whole_quantity(""), None);
        assert_eq!(
            parse_whole_quantity("99999999999999999999999999999999999999999"),
            None
        );
    }

    #[test]
    fn app_containers_add_up() {
        assert_eq!(req(pod("a", "p").gpus(2).container(3)), Some(5));
    }

    #[test]
    fn pods_without_gpu_requests_count_zero() {
        assert_eq!(req(pod("a", "p")), Some(0));
    }

    #[test]
    fn an_init_container_bigger_than_the_app_containers_sets_the_request() {
        assert_eq!(req(pod("a", "p").gpus(1).init(4)), Some(4));
        assert_eq!(req(pod("a", "p").gpus(4).init(1)), Some(4));
    }

    #[test]
    fn init_containers_run_one_at_a_time_so_only_the_largest_counts() {
        assert_eq!(req(pod("a", "p").gpus(1).init(3).init(2)), Some(3));
    }

    #[test]
    fn sidecars_add_to_the_app_containers_and_to_later_init_containers() {
        // Sidecar 1 runs beside everything: app 2 + 1 = 3; init after it: 3 + 1 = 4.
        assert_eq!(req(pod("a", "p").gpus(2).sidecar(1).init(3)), Some(4));
        // An init container before the sidecar does not run beside it.
        assert_eq!(req(pod("a", "p").gpus(2).init(3).sidecar(1)), Some(3));
    }

    #[test]
    fn overhead_is_added_on_top() {
        assert_eq!(req(pod("a", "p").gpus(2).init(4).overhead(1)), Some(5));
    }

    #[test]
    fn limits_stand_in_for_missing_requests() {
        assert_eq!(req(pod("a", "p").gpu_limit_only(2)), Some(2));
    }

    #[test]
    fn a_fractional_request_is_unreadable() {
        assert_eq!(req(pod("a", "p").gpu_quantity("0.5")), None);
    }

    #[test]
    fn research_is_recognised_by_label_or_priority_class() {
        assert!(is_research(&pod("a", "p").research().build(), &R));
        assert!(is_research(&pod("a", "p").research_priority().build(), &R));
        assert!(is_research(
            &pod("a", "p")
                .label(crate::core::vocabulary::RESEARCH_LABEL, "true")
                .build(),
            &R
        ));
        assert!(!is_research(&pod("a", "p").build(), &R));
    }

    /// Names other than the defaults, as set once on the command line.
    fn renamed() -> Vocabulary {
        Vocabulary {
            research_label: "example.com/research".into(),
            lent_label: Some("example.com/borrowed".into()),
            research_priority_class: Some("scavenger".into()),
            ..Vocabulary::default()
        }
    }

    #[test]
    fn research_is_recognised_by_the_names_in_use_only() {
        let names = renamed();
        let by_class = pod("a", "p").priority_class("scavenger").build();
        let by_lent = pod("a", "p").label("example.com/borrowed", "true").build();
        let by_label = pod("a", "p").label("example.com/research", "true").build();
        for p in [&by_class, &by_lent, &by_label] {
            assert!(is_research(p, &names), "{:?}", p.metadata.labels);
            assert!(!is_research(p, &R), "{:?}", p.metadata.labels);
        }
        // The default names no longer mark research work.
        assert!(!is_research(&pod("a", "p").research().build(), &names));
        assert!(!is_research(
            &pod("a", "p").research_priority().build(),
            &names
        ));
        // A name switched off matches nothing.
        let off = Vocabulary {
            lent_label: None,
            research_priority_class: None,
            ..Vocabulary::default()
        };
        assert!(!is_research(&pod("a", "p").research().build(), &off));
        assert!(!is_research(
            &pod("a", "p").research_priority().build(),
            &off
        ));
    }

    #[test]
    fn pods_in_a_renamed_research_class_are_counted_as_lent_not_protected() {
        let names = renamed();
        let mut l = Ledger::new();
        l.replace_nodes([node_facts(&node("n1", 8).build(), &names)]);
        l.replace_pods(
            [
                pod("inf", "vllm").on("n1").gpus(2),
                pod("res", "sft")
                    .on("n1")
                    .gpus(3)
                    .priority_class("scavenger"),
                pod("res", "rl")
                    .on("n1")
                    .gpus(1)
                    .label("example.com/borrowed", "true"),
            ]
            .into_iter()
            .map(|p| pod_facts(&p.build(), &names)),
        );
        let g = l.gpus("n1").expect("pool node");
        assert_eq!((g.protected, g.lent, g.free), (2, 4, 2));
    }

    fn ledger(
        nodes: &[(&str, u64)],
        pods: Vec<crate::test_support::fixtures::PodBuilder>,
    ) -> Ledger {
        let mut l = Ledger::new();
        l.replace_nodes(
            nodes
                .iter()
                .map(|(n, g)| node_facts(&node(n, *g).build(), &R)),
        );
        l.replace_pods(pods.into_iter().map(|p| pod_facts(&p.build(), &R)));
        l
    }

    #[test]
    fn node_gpus_split_into_protected_lent_and_free() {
        let l = ledger(
            &[("n1", 8)],
            vec![
                pod("inf", "vllm").on("n1").gpus(4),
                pod("res", "sft").on("n1").gpus(2).research(),
                pod("res", "cpu-only").on("n1").research(),
            ],
        );
        let g = l.gpus("n1").expect("pool node");
        assert_eq!((g.allocatable, g.protected, g.lent, g.free), (8, 4, 2, 2));
        assert!(g.trusted);
    }

    #[test]
    fn terminal_pods_hold_no_gpus() {
        let l = ledger(
            &[("n1", 8)],
            vec![
                pod("res", "done")
                    .on("n1")
                    .gpus(4)
                    .research()
                    .phase("Succeeded"),
                pod("inf", "crashed").on("n1").gpus(2).phase("Failed"),
                pod("inf", "up").on("n1").gpus(1),
            ],
        );
        let g = l.gpus("n1").expect("pool node");
        assert_eq!((g.protected, g.lent, g.free), (1, 0, 7));
    }

    #[test]
    fn unbound_pods_hold_no_node_gpus() {
        let l = ledger(
            &[("n1", 8)],
            vec![pod("res", "pending").unbound().gpus(8).research()],
        );
        assert_eq!(l.gpus("n1").expect("pool node").free, 8);
    }

    #[test]
    fn a_node_without_the_gpu_resource_has_zero_gpus() {
        let mut l = Ledger::new();
        l.apply_node(node_facts(
            &node("cpu", 8).without_gpu_resource().build(),
            &R,
        ));
        let g = l.gpus("cpu").expect("pool node");
        assert_eq!((g.allocatable, g.free), (0, 0));
        assert!(g.trusted);
    }

    #[test]
    fn an_unreadable_quantity_makes_the_node_untrusted() {
        let mut l = ledger(
            &[("n1", 8)],
            vec![pod("x", "odd").on("n1").gpu_quantity("1.5")],
        );
        assert!(!l.gpus("n1").expect("pool node").trusted);
        l.apply_node(node_facts(&node("n2", 8).gpu_quantity("7.5").build(), &R));
        assert!(!l.gpus("n2").expect("pool node").trusted);
    }

    #[test]
    fn overcommitted_nodes_report_zero_free_not_a_wrap_around() {
        let l = ledger(&[("n1", 2)], vec![pod("a", "p").on("n1").gpus(4)]);
        assert_eq!(l.gpus("n1").expect("pool node").free, 0);
    }

    #[test]
    fn cordoned_and_not_ready_nodes_are_recognised() {
        let c = node_facts(&node("c", 8).cordoned().build(), &R);
        assert!(!c.schedulable && c.ready);
        let nr = node_facts(&node("nr", 8).not_ready().build(), &R);
        assert!(nr.schedulable && !nr.ready);
    }

    #[test]
    fn incremental_updates_match_a_full_recount() {
        let mut l = ledger(&[("n1", 8), ("n2", 8)], vec![]);
        let t = now();
        l.apply_pod(pod_facts(&pod("a", "p1").on("n1").gpus(2).build(), &R), t);
        l.apply_pod(
            pod_facts(&pod("a", "p2").on("n1").gpus(1).research().build(), &R),
            t,
        );
        l.apply_pod(pod_facts(&pod("a", "p3").on("n2").gpus(3).build(), &R), t);
        // p1 finishes, p2 grows into a different shape (same UID), p3 is deleted.
        l.apply_pod(
            pod_facts(
                &pod("a", "p1").on("n1").gpus(2).phase("Succeeded").build(),
                &R,
            ),
            t,
        );
        l.apply_pod(
            pod_facts(
                &pod("a", "p2").on("n1").gpus(1).init(5).research().build(),
                &R,
            ),
            t,
        );
        l.delete_pod(&pod_facts(&pod("a", "p3").on("n2").gpus(3).build(), &R), t);
        let incremental = (l.gpus("n1"), l.gpus("n2"), l.totals());
        l.recount();
        assert_eq!(incremental, (l.gpus("n1"), l.gpus("n2"), l.totals()));
        assert_eq!(l.gpus("n1").expect("n1").lent, 5);
        assert_eq!(l.gpus("n2").expect("n2").protected, 0);
    }

    #[test]
    fn pods_arriving_before_their_node_are_counted_when_it_joins() {
        let mut l = Ledger::new();
        l.apply_pod(
            pod_facts(&pod("a", "p").on("late").gpus(3).build(), &R),
            now(),
        );
        assert!(l.gpus("late").is_none());
        l.apply_node(node_facts(&node("late", 8).build(), &R));
        assert_eq!(l.gpus("late").expect("pool node").protected, 3);
    }

    #[test]
    fn a_relist_replaces_pods_that_vanished_during_a_watch_gap() {
        let mut l = ledger(&[("n1", 8)], vec![pod("a", "gone").on("n1").gpus(4)]);
        l.begin_pod_relist();
        l.apply_pod(
            pod_facts(&pod("a", "new").on("n1").gpus(1).build(), &R),
            now(),
        );
        // Until the list is complete the old figures stand.
        assert_eq!(l.gpus("n1").expect("n1").protected, 4);
        l.finish_pod_relist(now());
        assert_eq!(l.gpus("n1").expect("n1").protected, 1);
    }

    #[test]
    fn a_research_pod_preempted_is_recorded_once_with_its_run_time() {
        let mut l = ledger(&[("n1", 8)], vec![]);
        let start = Timestamp::from_second(1000).expect("ts");
        let hit = Timestamp::from_second(4600).expect("ts");
        let running = pod("res", "rl").on("n1").gpus(4).research().started(start);
        assert!(
            l.apply_pod(pod_facts(&running.clone().build(), &R), now())
                .is_none()
        );
        let preempted = running.disrupted("PreemptionByScheduler", hit);
        let rec = l
            .apply_pod(pod_facts(&preempted.clone().build(), &R), now())
            .expect("recorded");
        assert_eq!(rec.reason, "PreemptionByScheduler");
        assert_eq!(rec.ran_seconds, Some(3600));
        assert_eq!(rec.gpus, 4);
        assert_eq!(rec.node.as_deref(), Some("n1"));
        // Further updates and the deletion do not count it again.
        let failed = preempted.phase("Failed");
        assert!(
            l.apply_pod(pod_facts(&failed.clone().build(), &R), now())
                .is_none()
        );
        assert!(
            l.delete_pod(&pod_facts(&failed.build(), &R), now())
                .is_none()
        );
    }

    #[test]
    fn disruptions_of_non_research_pods_are_not_recorded() {
        let mut l = ledger(&[("n1", 8)], vec![]);
        let p = pod("inf", "v")
            .on("n1")
            .gpus(1)
            .disrupted("PreemptionByScheduler", now());
        assert!(l.apply_pod(pod_facts(&p.build(), &R), now()).is_none());
    }

    #[test]
    fn disruptions_already_present_at_start_up_are_not_counted_again() {
        let mut l = Ledger::new();
        l.begin_pod_relist();
        let old = pod("res", "old")
            .on("n1")
            .gpus(1)
            .research()
            .disrupted("EvictionByEvictionAPI", now());
        l.apply_pod(pod_facts(&old.build(), &R), now());
        assert!(l.finish_pod_relist(now()).is_empty());
    }

    #[test]
    fn disruptions_missed_during_a_watch_gap_are_counted_at_the_relist() {
        let mut l = ledger(
            &[("n1", 8)],
            vec![pod("res", "rl").on("n1").gpus(1).research()],
        );
        l.begin_pod_relist();
        let hit = pod("res", "rl")
            .on("n1")
            .gpus(1)
            .research()
            .disrupted("PreemptionByScheduler", now());
        l.apply_pod(pod_facts(&hit.build(), &R), now());
        let recs = l.finish_pod_relist(now());
        assert_eq!(recs.len(), 1);
    }

    #[test]
    fn ledger_memory_stays_small_for_a_large_cluster() {
        let mut l = Ledger::new();
        l.replace_nodes((0..100).map(|i| node_facts(&node(&format!("gpu-{i:04}"), 8).build(), &R)));
        l.replace_pods((0..2000).map(|i| {
            pod_facts(
                &pod("team", &format!("job-{i}"))
                    .on(&format!("gpu-{:04}", i % 100))
                    .gpus(1)
                    .build(),
                &R,
            )
        }));
        // Compact facts only: under 1 KiB per pod (the benchmark reports the figure at 20,000).
        assert!(
            l.approx_heap_bytes() < 2000 * 1024,
            "{}",
            l.approx_heap_bytes()
        );
    }
}
