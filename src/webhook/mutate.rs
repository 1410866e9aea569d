//! The decision: whether a pod is a research pod and, if so, what marks it (low priority,
//! GPU-pool placement, tolerations, lent label, short grace period) and gives its containers the
//! reclaim-notice file (a Downward API volume of the pod's annotations), or why it is refused.
//! Each change goes to the patch writer ([`super::patch`]) as it is decided.
//!
//! Pure: no I/O, no clock, no Kubernetes client. Everything it needs arrives as arguments (the
//! pod, its namespace's labels, the [`MutationPolicy`] and a [`PriorityClasses`] lookup), so it is
//! exhaustively unit- and property-tested. It must never touch a pod that is not selected, and
//! leaves the patch's text (operations, pointers, escaping) to the writer.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PreferredSchedulingTerm, Toleration,
};
use serde_json::json;

use super::patch::{Builder, JsonPatch};
use super::pod_fields::{AdmittedContainer, AdmittedPod, AdmittedSpec};
use crate::core::vocabulary::{
    NOTICE_FILE, NOTICE_FILE_ENV, NOTICE_MOUNT_PATH, NOTICE_VOLUME, Vocabulary,
};

pub use super::pod_fields::MIRROR_POD_ANNOTATION;

pub use crate::core::vocabulary::{PoolTaint, TRUE};

/// Weight of the spare-node preference in `preferred` placement: the strongest the scheduler
/// allows, so that a spare node wins over any other soft preference the pod carries.
pub const DEFAULT_SPARE_WEIGHT: i32 = 100;

/// `preemptionPolicy` the API server assumes when a PriorityClass does not set one.
const DEFAULT_PREEMPTION_POLICY: &str = "PreemptLowerPriority";

/// What a PriorityClass contributes to a pod: the two fields the `Priority` admission plugin
/// recomputes and checks after every webhook (see the module docs of [`crate::webhook`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriorityClassInfo {
    pub value: i32,
    pub preemption_policy: String,
}

impl PriorityClassInfo {
    /// Reads the fields the pod must mirror from a PriorityClass object.
    pub fn from_class(class: &k8s_openapi::api::scheduling::v1::PriorityClass) -> Self {
        Self {
            value: class.value.unwrap_or(0),
            preemption_policy: class
                .preemption_policy
                .clone()
                .unwrap_or_else(|| DEFAULT_PREEMPTION_POLICY.to_string()),
        }
    }
}

/// Looks PriorityClasses up by name. The running webhook answers from a watched cache; tests use
/// a plain map.
pub trait PriorityClasses {
    fn priority_class(&self, name: &str) -> Option<PriorityClassInfo>;
}

impl PriorityClasses for BTreeMap<String, PriorityClassInfo> {
    fn priority_class(&self, name: &str) -> Option<PriorityClassInfo> {
        self.get(name).cloned()
    }
}

/// Required placement on the GPU pool: nodes carrying `key` (with one of `values`, if any).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSelector {
    pub key: String,
    /// Pool names; empty means "any pool" (`operator: Exists`).
    pub values: Vec<String>,
}

/// The gate to nodes the pool controller marked spare (`nightshift.io/spare=true`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpareGate {
    pub key: String,
    pub value: String,
    pub placement: SparePlacement,
}

/// How strictly GPU research pods are held to spare nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SparePlacement {
    /// Required node affinity, ANDed into every term: a node without the mark takes no new
    /// research pod, so headroom and closed lending windows hold. Running pods stay when a mark
    /// goes (IgnoredDuringExecution); the scheduler's preemption takes GPUs back.
    Required,
    /// Preferred node affinity with this weight (1-100): research fills spare nodes first but
    /// spills onto headroom and onto the whole pool outside lending windows.
    Preferred { weight: i32 },
}

/// What the webhook selects and what it changes. Every part can be switched off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MutationPolicy {
    /// Label (on the namespace or the pod) whose value `"true"` selects research pods.
    pub selection_label: String,
    /// Namespaces whose pods are never touched.
    pub excluded_namespaces: BTreeSet<String>,
    /// PriorityClass given to research pods; `None` leaves priority alone.
    pub priority_class: Option<String>,
    /// Extended resource that makes a pod a GPU pod.
    pub gpu_resource: String,
    /// Required node affinity for GPU research pods; `None` adds none.
    pub pool: Option<PoolSelector>,
    /// Spare-node gate for GPU research pods; `None` adds none.
    pub spare: Option<SpareGate>,
    /// Taints of the GPU pool that GPU research pods get tolerations for.
    pub pool_taints: Vec<PoolTaint>,
    /// Label set to `"true"` on research pods; `None` adds none.
    pub lent_label: Option<String>,
    /// Upper bound for `terminationGracePeriodSeconds`; `None` leaves it alone.
    pub max_grace_period_seconds: Option<i64>,
    /// Scheduler profile for GPU research pods (one that packs them onto few nodes); `None`
    /// leaves `schedulerName` alone.
    pub scheduler_name: Option<String>,
    /// Whether research pods get the reclaim-notice file: a Downward API volume of the pod's
    /// annotations ([`NOTICE_VOLUME`]), mounted read-only at [`NOTICE_MOUNT_PATH`] in every
    /// container, with [`NOTICE_FILE_ENV`] naming the file.
    pub notice_file: bool,
}

impl Default for MutationPolicy {
    /// The policy of the default names ([`Vocabulary::default`]).
    fn default() -> Self {
        Self::new(&Vocabulary::default())
    }
}

impl MutationPolicy {
    /// The policy for `names`, every other part at its default.
    pub fn new(names: &Vocabulary) -> Self {
        Self {
            selection_label: names.research_label.clone(),
            excluded_namespaces: ["kube-system", "kube-node-lease", "nightshift-system"]
                .into_iter()
                .map(String::from)
                .collect(),
            priority_class: names.research_priority_class.clone(),
            gpu_resource: names.gpu_resource.clone(),
            pool: names.pool_label.clone().map(|key| PoolSelector {
                key,
                values: names.pools.clone(),
            }),
            spare: names.spare_label.clone().map(|key| SpareGate {
                key,
                value: TRUE.into(),
                placement: SparePlacement::Required,
            }),
            pool_taints: names.pool_taints.clone(),
            lent_label: names.lent_label.clone(),
            // Kubernetes' own default: long enough for a clean exit, short enough that
            // inference does not wait long for the GPUs it takes back.
            max_grace_period_seconds: Some(30),
            // Off by default: the profile must exist in the cluster's kube-scheduler, or the
            // pods would wait for a scheduler that never comes.
            scheduler_name: None,
            notice_file: true,
        }
    }
}

/// Why a pod was left alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    ExcludedNamespace,
    MirrorPod,
    AlreadyBound,
    NotResearch,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ExcludedNamespace => "excluded namespace",
            Self::MirrorPod => "mirror pod",
            Self::AlreadyBound => "pod already bound to a node",
            Self::NotResearch => "not a research pod",
        }
    }
}

/// How the pod was classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Classification {
    /// A research pod; `gpu` tells whether it requests GPUs (and so was sent to the pool).
    Research {
        gpu: bool,
    },
    Skipped(SkipReason),
}

/// The answer for an admitted pod: a patch (empty when nothing needs to change) and warnings
/// for the user explaining each change.
#[derive(Clone, Debug, PartialEq)]
pub struct Mutation {
    pub selection: Classification,
    pub patch: JsonPatch,
    pub warnings: Vec<String>,
}

impl Mutation {
    fn skipped(reason: SkipReason) -> Self {
        Self {
            selection: Classification::Skipped(reason),
            patch: JsonPatch::default(),
            warnings: Vec::new(),
        }
    }
}

/// Why a research pod is refused. Messages say what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Denial {
    #[error(
        "nightshift: research pods need PriorityClass {class:?}, which does not exist. The \
         platform team must create it (negative value, preemptionPolicy Never), e.g. `kubectl \
         create priorityclass {class} --value=-1000 --preemption-policy=Never \
         --description=\"research work on lent GPUs\"`, or apply nightshift's base manifests"
    )]
    MissingPriorityClass { class: String },
    /// A part of the patch could not be written: the pod is refused rather than admitted
    /// marked in part (no value the decision writes can fail, so this is a defect).
    #[error(
        "nightshift: cannot write the patch that marks this research pod ({detail}); it is \
         refused rather than admitted unmarked"
    )]
    Unwritable { detail: String },
}

/// Decides what to do with `pod`, created in `namespace` whose labels are `namespace_labels`.
/// The pod is read as admission reads it ([`AdmittedPod`]: from a review's JSON, or from a whole
/// `Pod` with `AdmittedPod::from`).
///
/// Returns the patch that marks a research pod (empty for every other pod, and for a research
/// pod that is already marked: applying the patch and mutating again yields an empty patch), or
/// a [`Denial`] when a research pod cannot be marked safely.
pub fn mutate(
    pod: &AdmittedPod,
    namespace: &str,
    namespace_labels: &BTreeMap<String, String>,
    policy: &MutationPolicy,
    classes: &dyn PriorityClasses,
) -> Result<Mutation, Denial> {
    if policy.excluded_namespaces.contains(namespace) {
        return Ok(Mutation::skipped(SkipReason::ExcludedNamespace));
    }
    let meta = &pod.metadata;
    if meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
    {
        return Ok(Mutation::skipped(SkipReason::MirrorPod));
    }
    let empty_spec = AdmittedSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty_spec);
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        return Ok(Mutation::skipped(SkipReason::AlreadyBound));
    }

    let label = policy.selection_label.as_str();
    let namespace_is_research = namespace_labels.get(label).is_some_and(|v| v == TRUE);
    let pod_label = meta.labels.as_ref().and_then(|l| l.get(label));
    if !namespace_is_research && pod_label.is_none_or(|v| v != TRUE) {
        return Ok(Mutation::skipped(SkipReason::NotResearch));
    }

    let mut b = Builder::default();
    if namespace_is_research && let Some(value) = pod_label.filter(|v| *v != TRUE) {
        b.warn(format!(
            "nightshift: label {label}={value:?} ignored: every pod in research namespace \
             {namespace:?} is a research pod"
        ));
    }
    let gpu = requests_resource(spec, &policy.gpu_resource);

    if let Some(class) = &policy.priority_class {
        priority(&mut b, spec, class, classes)?;
    }
    if gpu {
        node_affinity(&mut b, spec, policy);
        tolerations(&mut b, spec, &policy.pool_taints);
        if let Some(profile) = &policy.scheduler_name {
            scheduler_name(&mut b, spec, profile);
        }
    } else if policy.pool.is_some() || !policy.pool_taints.is_empty() {
        b.note_later(format!(
            "nightshift: requests no {}: low priority only, not sent to the GPU pool",
            policy.gpu_resource
        ));
    }
    if let Some(key) = &policy.lent_label {
        lent_label(&mut b, pod, key);
    }
    if let Some(max) = policy.max_grace_period_seconds {
        grace_period(&mut b, spec, max);
    }
    if policy.notice_file {
        notice_file(&mut b, spec);
    }
    finish(b, Classification::Research { gpu })
}

/// The mutation `b` wrote for a pod classified as `selection`, or a denial when an operation
/// could not be written.
fn finish(b: Builder, selection: Classification) -> Result<Mutation, Denial> {
    let (patch, warnings) = b.finish().map_err(|detail| Denial::Unwritable { detail })?;
    Ok(Mutation {
        selection,
        patch,
        warnings,
    })
}

/// Whether any container (init containers included) requests or limits `resource` above zero.
pub fn requests_resource(spec: &AdmittedSpec, resource: &str) -> bool {
    let asks = |c: &AdmittedContainer| {
        c.resources.as_ref().is_some_and(|r| {
            [r.requests.as_ref(), r.limits.as_ref()]
                .into_iter()
                .flatten()
                .any(|m| m.get(resource).is_some_and(|q| quantity_is_positive(&q.0)))
        })
    };
    spec.containers.iter().any(asks) || spec.init_containers.iter().flatten().any(asks)
}

/// Extended resources are whole numbers; anything that is not clearly zero counts as a request
/// (so a pod is never kept off the pool because of an unusual spelling).
fn quantity_is_positive(q: &str) -> bool {
    let q = q.trim();
    !(q.is_empty() || q.trim_start_matches(['+', '0', '.']).is_empty() || q.starts_with('-'))
}

fn priority(
    b: &mut Builder,
    spec: &AdmittedSpec,
    research_class: &str,
    classes: &dyn PriorityClasses,
) -> Result<(), Denial> {
    let research =
        classes
            .priority_class(research_class)
            .ok_or_else(|| Denial::MissingPriorityClass {
                class: research_class.to_string(),
            })?;
    // A pod may keep a class of its own only if it is at most as important as the research
    // class and never preempts: it then still yields to inference.
    let (name, info) = match spec.priority_class_name.as_deref() {
        Some(own) if own != research_class => match classes.priority_class(own) {
            Some(info) if info.value <= research.value && info.preemption_policy == "Never" => {
                (own.to_string(), info)
            }
            _ => {
                b.warn(format!(
                    "nightshift: priorityClassName {own:?} replaced by {research_class:?}: \
                     research pods must run below inference"
                ));
                (research_class.to_string(), research)
            }
        },
        _ => (research_class.to_string(), research),
    };
    // The Priority admission plugin re-checks the pod after webhooks and rejects a pod whose
    // priority or preemptionPolicy disagree with its class: always set the triple together.
    let before = b.ops();
    b.set(
        &["spec", "priorityClassName"],
        spec.priority_class_name.as_deref(),
        name.as_str(),
    );
    b.set(&["spec", "priority"], spec.priority.as_ref(), &info.value);
    b.set(
        &["spec", "preemptionPolicy"],
        spec.preemption_policy.as_deref(),
        info.preemption_policy.as_str(),
    );
    if b.ops() > before {
        b.warn(format!(
            "nightshift: research pod: PriorityClass {name:?} (priority {}, preemptionPolicy {}), \
             preemptible at any time",
            info.value, info.preemption_policy
        ));
    }
    Ok(())
}

fn pool_requirement(pool: &PoolSelector) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: pool.key.clone(),
        operator: if pool.values.is_empty() {
            "Exists"
        } else {
            "In"
        }
        .into(),
        values: (!pool.values.is_empty()).then(|| pool.values.clone()),
    }
}

/// The spare mark as a node-selector requirement.
fn spare_requirement(spare: &SpareGate) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: spare.key.clone(),
        operator: "In".into(),
        values: Some(vec![spare.value.clone()]),
    }
}

/// The spare mark as a soft preference, in [`SparePlacement::Preferred`] mode.
fn spare_term(spare: &SpareGate) -> Option<PreferredSchedulingTerm> {
    match spare.placement {
        SparePlacement::Required => None,
        SparePlacement::Preferred { weight } => Some(PreferredSchedulingTerm {
            weight,
            preference: NodeSelectorTerm {
                match_expressions: Some(vec![spare_requirement(spare)]),
                match_fields: None,
            },
        }),
    }
}

/// What every required node-selector term of a GPU research pod must contain: the pool, and the
/// spare mark in [`SparePlacement::Required`] mode.
fn required_requirements(policy: &MutationPolicy) -> Vec<NodeSelectorRequirement> {
    let spare = policy
        .spare
        .as_ref()
        .filter(|s| s.placement == SparePlacement::Required)
        .map(spare_requirement);
    policy
        .pool
        .iter()
        .map(pool_requirement)
        .chain(spare)
        .collect()
}

/// Same requirement, ignoring the order of values and `values: []` versus absent.
fn same_requirement(a: &NodeSelectorRequirement, b: &NodeSelectorRequirement) -> bool {
    let set = |r: &NodeSelectorRequirement| -> BTreeSet<String> {
        r.values.iter().flatten().cloned().collect()
    };
    a.key == b.key && a.operator == b.operator && set(a) == set(b)
}

fn term_has(term: &NodeSelectorTerm, req: &NodeSelectorRequirement) -> bool {
    term.match_expressions
        .iter()
        .flatten()
        .any(|e| same_requirement(e, req))
}

fn node_affinity(b: &mut Builder, spec: &AdmittedSpec, policy: &MutationPolicy) {
    let required = required_requirements(policy);
    let preferred = policy.spare.as_ref().and_then(spare_term);
    let node_affinity = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref());
    let required_terms = node_affinity.and_then(|n| {
        n.required_during_scheduling_ignored_during_execution
            .as_ref()
    });
    let preferred_terms = node_affinity.and_then(|n| {
        n.preferred_during_scheduling_ignored_during_execution
            .as_ref()
    });

    // Which parts are missing: per existing term, the requirements it lacks.
    let missing_per_term: Vec<(usize, Vec<&NodeSelectorRequirement>)> = required_terms
        .map(|sel| {
            sel.node_selector_terms
                .iter()
                .enumerate()
                .map(|(i, term)| (i, required.iter().filter(|r| !term_has(term, r)).collect()))
                .filter(|(_, missing): &(usize, Vec<_>)| !missing.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let need_required = !required.is_empty()
        && (required_terms.is_none_or(|s| s.node_selector_terms.is_empty())
            || !missing_per_term.is_empty());
    let need_preferred = preferred.as_ref().is_some_and(|p| {
        let want = p.preference.match_expressions.iter().flatten().next();
        !preferred_terms
            .into_iter()
            .flatten()
            .any(|t| want.is_some_and(|w| term_has(&t.preference, w)))
    });
    if !need_required && !need_preferred {
        return;
    }
    let new_term = || NodeSelectorTerm {
        match_expressions: Some(required.clone()),
        match_fields: None,
    };
    let new_required = || NodeSelector {
        node_selector_terms: vec![new_term()],
    };

    if node_affinity.is_none() {
        // Create the whole nodeAffinity (and affinity) in one operation.
        let na = NodeAffinity {
            required_during_scheduling_ignored_during_execution: need_required.then(new_required),
            preferred_during_scheduling_ignored_during_execution: preferred
                .clone()
                .filter(|_| need_preferred)
                .map(|p| vec![p]),
        };
        if spec.affinity.is_none() {
            let affinity = Affinity {
                node_affinity: Some(na),
                ..Affinity::default()
            };
            b.add(&["spec", "affinity"], &affinity);
        } else {
            b.add(&["spec", "affinity", "nodeAffinity"], &na);
        }
    } else {
        const NA: [&str; 3] = ["spec", "affinity", "nodeAffinity"];
        const REQ: &str = "requiredDuringSchedulingIgnoredDuringExecution";
        const PREF: &str = "preferredDuringSchedulingIgnoredDuringExecution";
        if need_required {
            match required_terms {
                None => b.add(&[NA[0], NA[1], NA[2], REQ], &new_required()),
                // No terms: the list may be absent (or null) in the object as sent, where an
                // append would not apply. Set the whole list.
                Some(sel) if sel.node_selector_terms.is_empty() => b.add(
                    &[NA[0], NA[1], NA[2], REQ, "nodeSelectorTerms"],
                    &[new_term()],
                ),
                Some(sel) => {
                    // Terms are ORed: AND the requirements into every one of them.
                    for (i, missing) in missing_per_term {
                        let idx = i.to_string();
                        let base = [NA[0], NA[1], NA[2], REQ, "nodeSelectorTerms", &idx];
                        if sel.node_selector_terms[i].match_expressions.is_none() {
                            b.add(&[&base[..], &["matchExpressions"]].concat(), &missing);
                        } else {
                            for req in missing {
                                b.add(&[&base[..], &["matchExpressions", "-"]].concat(), req);
                            }
                        }
                    }
                }
            }
        }
        if let (true, Some(pref)) = (need_preferred, &preferred) {
            match preferred_terms {
                None => b.add(&[NA[0], NA[1], NA[2], PREF], std::slice::from_ref(pref)),
                Some(_) => b.add(&[NA[0], NA[1], NA[2], PREF, "-"], pref),
            }
        }
    }
    b.note_later(placement_note(policy));
}

/// The warning that tells the pod's creator where it may run.
fn placement_note(policy: &MutationPolicy) -> String {
    let pool = policy.pool.as_ref().map(|p| p.key.as_str());
    match (pool, &policy.spare) {
        (Some(pool), Some(spare)) if spare.placement == SparePlacement::Required => format!(
            "nightshift: restricted to GPU-pool nodes ({pool}) that the pool controller marks \
             spare ({}={}); pending while no spare GPU is free",
            spare.key, spare.value
        ),
        (None, Some(spare)) if spare.placement == SparePlacement::Required => format!(
            "nightshift: restricted to nodes marked spare ({}={}); pending while no spare GPU \
             is free",
            spare.key, spare.value
        ),
        (Some(pool), Some(spare)) => format!(
            "nightshift: restricted to GPU-pool nodes ({pool}), spare nodes ({}={}) preferred",
            spare.key, spare.value
        ),
        (Some(pool), None) => format!("nightshift: restricted to GPU-pool nodes ({pool})"),
        (None, _) => "nightshift: spare GPU nodes preferred".to_string(),
    }
}

/// The name the API server gives pods that name no scheduler.
const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// Sends a GPU research pod to the packing profile, unless its creator chose another scheduler
/// than the default one (kept: it may be the only one that can place the pod).
fn scheduler_name(b: &mut Builder, spec: &AdmittedSpec, profile: &str) {
    match spec.scheduler_name.as_deref() {
        None | Some("") | Some(DEFAULT_SCHEDULER) => {
            b.set(
                &["spec", "schedulerName"],
                spec.scheduler_name.as_deref(),
                profile,
            );
            b.note_later(format!(
                "nightshift: scheduled by profile {profile:?}, which packs research onto few \
                 nodes so that whole nodes stay free for inference"
            ));
        }
        Some(own) if own == profile => {}
        Some(own) => b.note_later(format!(
            "nightshift: schedulerName {own:?} kept; research is not packed by {profile:?}"
        )),
    }
}

/// Whether `tol` tolerates the pool taint. A taint without a value stands for "any value", which
/// only an `Exists` toleration covers.
fn tolerates(tol: &Toleration, taint: &PoolTaint) -> bool {
    let effect_ok = tol
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let exists = tol.operator.as_deref() == Some("Exists");
    let key = tol.key.as_deref().unwrap_or("");
    let key_ok = if key.is_empty() {
        exists
    } else {
        key == taint.key
    };
    let value_ok = exists
        || taint
            .value
            .as_deref()
            .is_some_and(|v| tol.value.as_deref().unwrap_or("") == v);
    effect_ok && key_ok && value_ok
}

/// The toleration a pool taint asks for, as written into the patch.
#[derive(serde::Serialize)]
struct PoolToleration<'a> {
    key: &'a str,
    operator: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a str>,
    effect: &'a str,
}

fn toleration_for(taint: &PoolTaint) -> PoolToleration<'_> {
    PoolToleration {
        key: &taint.key,
        // A taint without a value stands for any value: only `Exists` tolerates that.
        operator: if taint.value.is_some() {
            "Equal"
        } else {
            "Exists"
        },
        value: taint.value.as_deref(),
        effect: &taint.effect,
    }
}

fn tolerations(b: &mut Builder, spec: &AdmittedSpec, taints: &[PoolTaint]) {
    let existing = spec.tolerations.as_deref().unwrap_or_default();
    let missing: Vec<&PoolTaint> = taints
        .iter()
        .filter(|t| !existing.iter().any(|tol| tolerates(tol, t)))
        .collect();
    if missing.is_empty() {
        return;
    }
    if spec.tolerations.is_none() {
        let all: Vec<PoolToleration<'_>> = missing.iter().map(|t| toleration_for(t)).collect();
        b.add(&["spec", "tolerations"], &all);
    } else {
        for t in &missing {
            b.add(&["spec", "tolerations", "-"], &toleration_for(t));
        }
    }
    let keys: Vec<&str> = missing.iter().map(|t| t.key.as_str()).collect();
    b.note_later(format!(
        "nightshift: tolerates the GPU-pool taint(s) {}",
        keys.join(", ")
    ));
}

fn lent_label(b: &mut Builder, pod: &AdmittedPod, key: &str) {
    match pod.metadata.labels.as_ref() {
        None => b.add(&["metadata", "labels"], &BTreeMap::from([(key, TRUE)])),
        Some(labels) if labels.get(key).is_some_and(|v| v == TRUE) => {}
        Some(_) => b.add(&["metadata", "labels", key], TRUE),
    }
}

fn grace_period(b: &mut Builder, spec: &AdmittedSpec, max: i64) {
    match spec.termination_grace_period_seconds {
        None => b.add(&["spec", "terminationGracePeriodSeconds"], &max),
        Some(current) if current > max => {
            b.replace(&["spec", "terminationGracePeriodSeconds"], &max);
            b.warn(format!(
                "nightshift: terminationGracePeriodSeconds lowered from {current} to {max} so \
                 that preemption is quick"
            ));
        }
        Some(_) => {}
    }
}

/// The Downward API field of the notice file: all of the pod's annotations, so that a container
/// sees the reclaim-notice annotation come and go.
const NOTICE_FIELD: &str = "metadata.annotations";

/// Gives a research pod the reclaim-notice file: the Downward API volume, a read-only mount of it
/// in every container (init containers finish before any notice matters) and the variable that
/// names the file. Each part is added only where it is missing: a pod that has a volume of that
/// name keeps it, a container that mounts the volume or sets the variable already keeps them,
/// and a container that mounts something else at the mount path gets neither.
fn notice_file(b: &mut Builder, spec: &AdmittedSpec) {
    let before = b.ops();
    let has_volume = spec
        .volumes
        .iter()
        .flatten()
        .any(|v| v.name.as_deref() == Some(NOTICE_VOLUME));
    let parts = &*NOTICE_PARTS;
    if !has_volume {
        match spec.volumes {
            None => b.add_json_list(&["spec", "volumes"], &parts.volume),
            Some(_) => b.add_json(&["spec", "volumes", "-"], &parts.volume),
        }
    }
    for (i, container) in spec.containers.iter().enumerate() {
        let idx = i.to_string();
        let at = |field: &'static [&'static str]| -> Vec<&str> {
            ["spec", "containers", idx.as_str()]
                .into_iter()
                .chain(field.iter().copied())
                .collect()
        };
        // `/etc/nightshift/` and `/etc/nightshift` are one mount point.
        let mount = container.volume_mounts.iter().flatten().find(|m| {
            m.mount_path
                .as_deref()
                .unwrap_or_default()
                .trim_end_matches('/')
                == NOTICE_MOUNT_PATH
        });
        match (mount, &container.volume_mounts) {
            // Something else of the container's own is mounted there: the variable would name a
            // file that is not the notice file, so the container is left alone.
            (Some(m), _) if m.name.as_deref() != Some(NOTICE_VOLUME) => continue,
            (Some(_), _) => {}
            (None, mounts) => match mounts {
                None => b.add_json_list(&at(&["volumeMounts"]), &parts.mount),
                Some(_) => b.add_json(&at(&["volumeMounts", "-"]), &parts.mount),
            },
        }
        let has_env = container
            .env
            .iter()
            .flatten()
            .any(|e| e.name.as_deref() == Some(NOTICE_FILE_ENV));
        if !has_env {
            match container.env {
                None => b.add_json_list(&at(&["env"]), &parts.var),
                Some(_) => b.add_json(&at(&["env", "-"]), &parts.var),
            }
        }
    }
    if b.ops() > before {
        b.note_later(format!(
            "nightshift: the pod's annotations, reclaim notice ({}) included, are readable in \
             {} (${NOTICE_FILE_ENV})",
            crate::core::vocabulary::RECLAIM_NOTICE_ANNOTATION,
            parts.file
        ));
    }
}

/// What [`notice_file`] adds, as JSON text: the same for every pod, so written once.
struct NoticeParts {
    /// The path of the notice file in a container.
    file: String,
    volume: String,
    mount: String,
    var: String,
}

static NOTICE_PARTS: std::sync::LazyLock<NoticeParts> = std::sync::LazyLock::new(|| {
    let file = format!("{NOTICE_MOUNT_PATH}/{NOTICE_FILE}");
    let volume = json!({
        "name": NOTICE_VOLUME,
        "downwardAPI": {"items": [
            {"path": NOTICE_FILE, "fieldRef": {"apiVersion": "v1", "fieldPath": NOTICE_FIELD}}
        ]}
    })
    .to_string();
    let mount = json!({"name": NOTICE_VOLUME, "mountPath": NOTICE_MOUNT_PATH, "readOnly": true})
        .to_string();
    let var = json!({"name": NOTICE_FILE_ENV, "value": file}).to_string();
    NoticeParts {
        file,
        volume,
        mount,
        var,
    }
});

#[cfg(test)]
mod tests;
