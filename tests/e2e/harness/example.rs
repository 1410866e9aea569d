//! The shipped vLLM example (`manifests/examples/vllm`: Deployment and ScaledObject) under the
//! real KEDA and HPA, adapted to this cluster (namespace, the kwok pool, nightshift's and
//! Prometheus's addresses, timings), with the vLLM source it scales on and waits on what KEDA and
//! the HPA make of it.

use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::api::{Api, ApiResource, DynamicObject};
use serde_json::{Value, json};

use crate::harness::binary;
use crate::harness::cluster::{Cluster, POOL, POOL_LABEL};
use crate::harness::objects;
use crate::harness::source::emulator::Emulator;
use crate::harness::source::{Prometheus, find_prometheus};
use crate::harness::wait::{self, Check};

/// The example's names.
pub const DEPLOYMENT: &str = "vllm-llama";
pub const SCALED_OBJECT: &str = "vllm-llama";
pub const MODEL: &str = "llama-3.1-70b";
/// The HPA KEDA creates for the ScaledObject.
pub const HPA: &str = "keda-hpa-vllm-llama";
/// Deadline of each wait; far above the seconds each takes, for a loaded 2-core machine.
const STEP: Duration = Duration::from_secs(120);

/// The vLLM source of the KEDA scenarios: an emulator (one engine, `waiting` requests queued)
/// scraped by a real Prometheus that labels it as pod `vllm-llama-0` of `namespace`; returned
/// once Prometheus holds a sample scraped after the start.
pub async fn start_source(
    dir: &Path,
    namespace: &str,
    waiting: f64,
) -> Result<(Emulator, Prometheus)> {
    let emu = Emulator::start(MODEL, 1, false).await;
    emu.set(0, |e| e.waiting = waiting);
    let t_prom = SystemTime::now();
    let prom = Prometheus::start(
        &find_prometheus()?,
        dir,
        &emu.endpoint(),
        namespace,
        &format!("{DEPLOYMENT}-0"),
    )?;
    prom.wait_ready().await?;
    prom.wait_fresh_scrape(t_prom).await?;
    Ok((emu, prom))
}

/// The model-hub token Secret the example Deployment reads: KEDA resolves the scale target's
/// environment, Secrets included, before it creates the HPA.
pub fn create_model_token(c: &Cluster, namespace: &str) -> Result<()> {
    binary::kubectl_ok(
        c,
        &[
            "create",
            "secret",
            "generic",
            "hf-token",
            "--namespace",
            namespace,
            "--from-literal=token=unused-by-kwok",
        ],
        None,
    )
    .map(drop)
}

/// Waits until the ScaledObject's condition `kind` has status `want`.
pub async fn wait_condition(
    c: &Cluster,
    scaled_objects: &Api<DynamicObject>,
    kind: &str,
    want: &str,
) -> Result<()> {
    wait::until(&format!("ScaledObject {kind}={want}"), STEP, || async {
        c.check_processes()?;
        let so = scaled_objects.get(SCALED_OBJECT).await?;
        Ok(match condition(&so, kind) {
            Some((status, _)) if status == want => Check::Done(()),
            other => Check::Pending(format!("{kind} {other:?}")),
        })
    })
    .await
}

/// The example's Deployment for this cluster: namespace `namespace`, and the kwok pool's name
/// and taint instead of the example's `h100` pool and `nvidia.com/gpu` taint.
pub fn adapt_deployment(mut d: Value, namespace: &str) -> Result<Value> {
    d["metadata"]["namespace"] = json!(namespace);
    let spec = &mut d["spec"]["template"]["spec"];
    ensure!(
        spec.is_object(),
        "the example's Deployment has no pod template: {d}"
    );
    spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] =
        json!([{"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": [POOL]}]}]);
    spec["tolerations"] = json!([objects::pool_toleration()]);
    Ok(d)
}

/// The example's ScaledObject for this cluster: namespace `namespace`, nightshift's and
/// Prometheus's addresses (the Prometheus source instead of scraping the Service's pods, which
/// kwok does not run), and the HPA's scale-down and policy periods compressed from minutes to
/// seconds.
pub fn adapt_scaled_object(
    mut so: Value,
    namespace: &str,
    scaler: &str,
    prometheus: &str,
) -> Result<Value> {
    so["metadata"]["namespace"] = json!(namespace);
    let meta = &mut so["spec"]["triggers"][0]["metadata"];
    meta["scalerAddress"] = json!(scaler);
    let m = meta
        .as_object_mut()
        .ok_or_else(|| anyhow!("the example's trigger has no metadata"))?;
    m.remove("service");
    m.remove("port");
    m.insert("serverAddress".into(), json!(prometheus));
    ensure!(
        m.get("waitingTarget") == Some(&json!("5")) && m.get("model") == Some(&json!(MODEL)),
        "the example's trigger changed: {m:?}"
    );
    let behavior = &mut so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"];
    behavior["scaleDown"]["stabilizationWindowSeconds"] = json!(1);
    for direction in ["scaleUp", "scaleDown"] {
        if let Some(policies) = behavior[direction]["policies"].as_array_mut() {
            for p in policies {
                p["periodSeconds"] = json!(1);
            }
        }
    }
    Ok(so)
}

pub fn read_example(file: &str) -> Result<Value> {
    let path = binary::manifests_dir().join("examples/vllm").join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

pub fn scaled_object_resource() -> ApiResource {
    ApiResource {
        group: "keda.sh".into(),
        version: "v1alpha1".into(),
        api_version: "keda.sh/v1alpha1".into(),
        kind: "ScaledObject".into(),
        plural: "scaledobjects".into(),
    }
}

/// Status and reason of a ScaledObject condition.
pub fn condition(so: &DynamicObject, kind: &str) -> Option<(String, String)> {
    so.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
}

pub async fn replicas(deployments: &Api<Deployment>) -> Result<i32> {
    deployments
        .get(DEPLOYMENT)
        .await?
        .spec
        .and_then(|s| s.replicas)
        .ok_or_else(|| anyhow!("deployment {DEPLOYMENT} has no spec.replicas"))
}

/// Waits until the stored Deployment asks for `want` replicas.
pub async fn wait_replicas(c: &Cluster, deployments: &Api<Deployment>, want: i32) -> Result<()> {
    wait::until(
        &format!("{DEPLOYMENT} spec.replicas = {want}"),
        STEP,
        || async {
            c.check_processes()?;
            let r = replicas(deployments).await?;
            Ok(if r == want {
                Check::Done(())
            } else {
                Check::Pending(format!("spec.replicas = {r}"))
            })
        },
    )
    .await
}

/// Waits until the HPA's last computed desired replicas is `want`.
pub async fn wait_hpa_desired(
    c: &Cluster,
    hpas: &Api<HorizontalPodAutoscaler>,
    want: i32,
) -> Result<()> {
    wait::until(&format!("HPA desiredReplicas = {want}"), STEP, || async {
        c.check_processes()?;
        let h = hpas.get(HPA).await?;
        let desired = h.status.as_ref().map(|s| s.desired_replicas);
        Ok(if desired == Some(want) {
            Check::Done(())
        } else {
            Check::Pending(format!(
                "desiredReplicas {desired:?}, conditions {:?}",
                h.status.and_then(|s| s.conditions)
            ))
        })
    })
    .await
}
