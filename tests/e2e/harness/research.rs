//! Research pods as a user submits them (unmarked, asking for a GPU), and the checks of what the
//! API server stored: every mark the webhook gives research, or none of them.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::harness::cluster::{GPU_RESOURCE, POOL, POOL_LABEL};
use crate::harness::objects::{RESEARCH_CLASS, RESEARCH_VALUE, is_running};
use crate::harness::wait::{self, Check};

const LENT_LABEL: &str = "nightshift.io/lent";
const SPARE_LABEL: &str = "nightshift.io/spare";

/// A pod asking for one GPU, without any mark of its own.
pub fn research_pod(name: &str, labels: &[(&str, &str)]) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 600,
            "containers": [gpu_container()],
        },
    })
}

/// The one container of [`research_pod`]: one GPU, a placeholder image kwok never pulls.
pub fn gpu_container() -> Value {
    json!({
        "name": "work",
        "image": "registry.invalid/nightshift-e2e:placeholder",
        "resources": {
            "requests": {"cpu": "100m", GPU_RESOURCE: "1"},
            "limits": {GPU_RESOURCE: "1"},
        },
    })
}

pub async fn create_pod(client: &kube::Client, ns: &str, pod: Value) -> Result<Pod> {
    let name = pod["metadata"]["name"].as_str().unwrap_or("?").to_string();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(pod)?;
    pods.create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating pod {ns}/{name}"))?;
    // Assertions are on the stored object, read back.
    get_pod(client, ns, &name).await
}

/// Creates `pod` and waits until it runs and the clock has left the second it started in, so
/// that the next pod created starts strictly later: `status.startTime` has a one-second
/// resolution, and the scheduler ranks pods of one priority by it. Returns the start time.
pub async fn create_started(
    client: &kube::Client,
    ns: &str,
    pod: Value,
    timeout: Duration,
) -> Result<jiff::Timestamp> {
    let created = create_pod(client, ns, pod).await?;
    let name = created.metadata.name.clone().unwrap_or_default();
    let started = wait::until(&format!("{ns}/{name} running"), timeout, || async {
        let p = get_pod(client, ns, &name).await?;
        Ok(match p.status.as_ref().and_then(|s| s.start_time.clone()) {
            Some(t) if is_running(&p) => Check::Done(t.0),
            _ => Check::Pending("not running".into()),
        })
    })
    .await?;
    wait::until("the next second", timeout, || async {
        Ok(
            if jiff::Timestamp::now().as_second() > started.as_second() {
                Check::Done(())
            } else {
                Check::Pending("same second".into())
            },
        )
    })
    .await?;
    Ok(started)
}

pub async fn get_pod(client: &kube::Client, ns: &str, name: &str) -> Result<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .with_context(|| format!("reading pod {ns}/{name}"))
}

/// The pod's PriorityClass name, if any.
pub fn priority_class(p: &Pod) -> Option<&str> {
    p.spec.as_ref()?.priority_class_name.as_deref()
}

/// The stored pod carries every research mark; `gpu`: also the GPU-pool placement.
pub fn assert_marked(p: &Pod, gpu: bool) -> Result<()> {
    let spec = p.spec.as_ref().context("pod without spec")?;
    let name = p.metadata.name.as_deref().unwrap_or("?");
    ensure!(
        spec.priority_class_name.as_deref() == Some(RESEARCH_CLASS),
        "{name}: priorityClassName {:?}, expected {RESEARCH_CLASS}",
        spec.priority_class_name
    );
    ensure!(
        spec.priority == Some(RESEARCH_VALUE),
        "{name}: priority {:?}, expected the class value {RESEARCH_VALUE}",
        spec.priority
    );
    ensure!(
        spec.preemption_policy.as_deref() == Some("Never"),
        "{name}: preemptionPolicy {:?}, expected Never",
        spec.preemption_policy
    );
    ensure!(
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LENT_LABEL))
            .map(String::as_str)
            == Some("true"),
        "{name}: label {LENT_LABEL}=true missing: {:?}",
        p.metadata.labels
    );
    ensure!(
        spec.termination_grace_period_seconds
            .is_some_and(|g| g <= 30),
        "{name}: terminationGracePeriodSeconds {:?} not capped at 30",
        spec.termination_grace_period_seconds
    );
    let affinity = serde_json::to_value(&spec.affinity)?;
    let tolerations = serde_json::to_value(&spec.tolerations)?;
    let terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let in_every_term = |key: &str, op: &str| {
        !terms.is_empty()
            && terms.iter().all(|t| {
                t["matchExpressions"]
                    .as_array()
                    .is_some_and(|es| es.iter().any(|e| e["key"] == key && e["operator"] == op))
            })
    };
    let pool_in_every_term = in_every_term(POOL_LABEL, "Exists");
    let spare_in_every_term = in_every_term(SPARE_LABEL, "In");
    let tolerates_pool = tolerations.as_array().is_some_and(|ts| {
        ts.iter().any(|t| {
            t["key"] == POOL_LABEL
                && t["value"] == POOL
                && t["effect"] == "NoSchedule"
                && t["operator"] == "Equal"
        })
    });
    if gpu {
        ensure!(
            pool_in_every_term,
            "{name}: required node affinity lacks {POOL_LABEL} Exists in every term: {affinity}"
        );
        ensure!(
            spare_in_every_term,
            "{name}: required node affinity lacks {SPARE_LABEL} in every term: {affinity}"
        );
        ensure!(
            tolerates_pool,
            "{name}: no toleration of the pool taint: {tolerations}"
        );
    } else {
        ensure!(
            !pool_in_every_term && !tolerates_pool,
            "{name}: a CPU-only research pod must not be sent to the GPU pool: {affinity} {tolerations}"
        );
    }
    Ok(())
}

/// The stored pod carries none of nightshift's marks (the API server's own defaults, such as
/// the not-ready/unreachable tolerations, are expected).
pub fn assert_untouched(p: &Pod) -> Result<()> {
    let spec = p.spec.as_ref().context("pod without spec")?;
    let name = p.metadata.name.as_deref().unwrap_or("?");
    ensure!(
        spec.priority_class_name.is_none() && spec.priority == Some(0),
        "{name}: priority changed: class {:?}, priority {:?}",
        spec.priority_class_name,
        spec.priority
    );
    ensure!(
        p.metadata
            .labels
            .as_ref()
            .is_none_or(|l| !l.contains_key(LENT_LABEL)),
        "{name}: carries {LENT_LABEL}"
    );
    ensure!(
        spec.affinity.is_none(),
        "{name}: affinity added: {:?}",
        spec.affinity
    );
    let tolerations = serde_json::to_value(&spec.tolerations)?;
    ensure!(
        !tolerations.to_string().contains(POOL_LABEL),
        "{name}: pool toleration added: {tolerations}"
    );
    ensure!(
        spec.termination_grace_period_seconds == Some(600),
        "{name}: grace period changed to {:?}",
        spec.termination_grace_period_seconds
    );
    Ok(())
}
