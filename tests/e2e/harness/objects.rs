//! Builders for the Kubernetes objects the scenarios create, and small queries over pods.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::harness::cluster::{GPU_RESOURCE, POOL, POOL_LABEL};

/// PriorityClass of research pods: below every default workload (0), never preempts.
pub const RESEARCH_CLASS: &str = "nightshift-research";
pub const RESEARCH_VALUE: i32 = -1000;
/// PriorityClass of inference pods: high, preempts research.
pub const INFERENCE_CLASS: &str = "nightshift-inference";
pub const INFERENCE_VALUE: i32 = 1_000_000;
/// A second research class below [`RESEARCH_CLASS`] (never preempts either): work that should
/// give its GPUs back before ordinary research, as a platform may define it beside the base's.
pub const SCAVENGER_CLASS: &str = "research-scavenger";
pub const SCAVENGER_VALUE: i32 = -2000;

/// A placeholder image: kwok never pulls it.
const IMAGE: &str = "registry.invalid/nightshift-e2e:placeholder";

/// Field manager for server-side apply by the tests.
const MANAGER: &str = "nightshift-e2e";

/// Creates (or keeps) the two PriorityClasses, the way the base manifests define them.
pub async fn ensure_priority_classes(client: &kube::Client) -> Result<()> {
    ensure_priority_class(client, RESEARCH_CLASS, RESEARCH_VALUE, "Never").await?;
    ensure_priority_class(
        client,
        INFERENCE_CLASS,
        INFERENCE_VALUE,
        "PreemptLowerPriority",
    )
    .await
}

/// Creates (or keeps) [`SCAVENGER_CLASS`].
pub async fn ensure_scavenger_class(client: &kube::Client) -> Result<()> {
    ensure_priority_class(client, SCAVENGER_CLASS, SCAVENGER_VALUE, "Never").await
}

/// Creates (or updates) one PriorityClass.
pub async fn ensure_priority_class(
    client: &kube::Client,
    name: &str,
    value: i32,
    preemption_policy: &str,
) -> Result<()> {
    let api: Api<PriorityClass> = Api::all(client.clone());
    let pc = json!({
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "preemptionPolicy": preemption_policy,
        "globalDefault": false,
    });
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&pc),
    )
    .await
    .with_context(|| format!("applying PriorityClass {name}"))?;
    Ok(())
}

/// Toleration of the GPU pool's taint.
pub fn pool_toleration() -> Value {
    json!({"key": POOL_LABEL, "operator": "Equal", "value": POOL, "effect": "NoSchedule"})
}

/// Container requesting `gpus` GPUs (requests = limits, as extended resources require).
fn gpu_container(name: &str, gpus: u32) -> Value {
    json!({
        "name": name,
        "image": IMAGE,
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi", GPU_RESOURCE: gpus.to_string()},
            "limits": {GPU_RESOURCE: gpus.to_string()},
        },
    })
}

/// An inference Deployment on the GPU pool: `gpus` GPUs per replica, high priority.
pub fn inference_deployment(name: &str, replicas: i32, gpus: u32) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "role": "inference"}},
                "spec": {
                    "priorityClassName": INFERENCE_CLASS,
                    "nodeSelector": {POOL_LABEL: POOL},
                    "tolerations": [pool_toleration()],
                    "containers": [gpu_container("vllm", gpus)],
                },
            },
        },
    }))?)
}

/// An inference pod of `gpus` GPUs that only `node` may take (node affinity on its name, so
/// that the scheduler preempts there rather than binding elsewhere).
pub fn pinned_inference_pod(name: &str, node: &str, gpus: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"role": "inference"}},
        "spec": {
            "priorityClassName": INFERENCE_CLASS,
            "tolerations": [pool_toleration()],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}
                ]}]
            }}},
            "containers": [gpu_container("vllm", gpus)],
        },
    })
}

/// A pod of `gpus` GPUs in PriorityClass `class`, labelled `role`, that only the given nodes
/// may take (node affinity on their names): it binds there, or preempts there, never elsewhere.
pub fn pinned_pod(name: &str, nodes: &[&str], gpus: u32, class: &str, role: &str) -> Value {
    // A node field selector takes one name: one term per node (terms are alternatives).
    let terms: Vec<Value> = nodes
        .iter()
        .map(
            |n| json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]}),
        )
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"role": role}},
        "spec": {
            "priorityClassName": class,
            // Victims go at once; kwok ends deleted pods without waiting anyway.
            "terminationGracePeriodSeconds": 0,
            "tolerations": [pool_toleration()],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": terms
            }}},
            "containers": [gpu_container("work", gpus)],
        },
    })
}

/// A research Job of `parallelism` one-GPU pods that run until deleted. With `marked`, the pods
/// carry the research class, pool selector and toleration themselves (what the webhook would
/// add); without, only the research label, for the webhook to mutate. Preemptions are ignored
/// by the pod failure policy, so preempted pods are simply replaced.
pub fn research_job(name: &str, parallelism: i32, marked: bool) -> Result<Job> {
    let mut pod_spec = json!({
        "restartPolicy": "Never",
        // Research pods give the GPU back quickly when preempted.
        "terminationGracePeriodSeconds": 5,
        "containers": [gpu_container("train", 1)],
    });
    if marked {
        pod_spec["priorityClassName"] = json!(RESEARCH_CLASS);
        pod_spec["nodeSelector"] = json!({POOL_LABEL: POOL});
        pod_spec["tolerations"] = json!([pool_toleration()]);
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            // Preempted pods do not count against it (pod failure policy), but a generous limit
            // keeps the Job alive even if a preemption were counted as a failure.
            "backoffLimit": 1000,
            "podFailurePolicy": {"rules": [{
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget"}],
            }]},
            "template": {
                "metadata": {"labels": {"nightshift.io/research": "true", "role": "research"}},
                "spec": pod_spec,
            },
        },
    }))?)
}

/// [`research_job`] (marked), Indexed with a per-index backoff limit. The Job controller delays
/// new pods after failures (10 s doubling per failure, up to 10 min) and counts failures its pod
/// failure policy ignores too: a plain Job that lost 16 pods to preemption waits the full 10 min
/// before replacing them. With `backoffLimitPerIndex` the delay is per index, so each preempted
/// pod is replaced after 10 s.
pub fn indexed_research_job(name: &str, parallelism: i32) -> Result<Job> {
    let mut job = research_job(name, parallelism, true)?;
    let spec = job
        .spec
        .as_mut()
        .ok_or_else(|| anyhow::anyhow!("research Job without spec"))?;
    spec.completion_mode = Some("Indexed".into());
    spec.backoff_limit = None;
    // Preemptions do not count against it (pod failure policy); anything else may retry a lot.
    spec.backoff_limit_per_index = Some(1000);
    Ok(job)
}

/// Pods in `ns` matching `selector`, keyed by name.
pub async fn pods(
    client: &kube::Client,
    ns: &str,
    selector: &str,
) -> Result<BTreeMap<String, Pod>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = api.list(&ListParams::default().labels(selector)).await?;
    Ok(list
        .items
        .into_iter()
        .map(|p| (p.metadata.name.clone().unwrap_or_default(), p))
        .collect())
}

/// Running (phase) and not being deleted.
pub fn is_running(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Bound to a node and not being deleted.
pub fn is_bound(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
}

pub fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// The pod carries condition `DisruptionTarget` with reason `PreemptionByScheduler`.
pub fn preempted_by_scheduler(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "DisruptionTarget"
                    && c.reason.as_deref() == Some("PreemptionByScheduler")
            })
        })
}

/// GPUs requested by a pod's containers.
pub fn gpus_of(p: &Pod) -> u32 {
    p.spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .filter_map(|c| c.resources.as_ref()?.requests.as_ref()?.get(GPU_RESOURCE))
                .filter_map(|q| q.0.parse::<u32>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// Sets the replica count through the scale subresource, as an autoscaler does.
pub async fn scale_deployment(
    client: &kube::Client,
    ns: &str,
    name: &str,
    replicas: i32,
) -> Result<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    api.patch_scale(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": replicas}})),
    )
    .await
    .with_context(|| format!("scaling deployment {ns}/{name} to {replicas}"))?;
    Ok(())
}
