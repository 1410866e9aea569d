//! KEDA's `external-push` trigger with the shipped example (`manifests/examples/vllm-push`:
//! `minReplicaCount: 0`), the real KEDA operator and adapter: the service sleeps at zero
//! replicas; load arrives → nightshift's `StreamIsActive` stream sends `true` → KEDA wakes the
//! Deployment to one replica → the HPA (reading `GetMetrics` through the adapter) takes it to the
//! demand. KEDA polls this ScaledObject only every [`POLLING_INTERVAL`], and each poll is an
//! `IsActive` call to nightshift while the stream is `StreamIsActive`: the scenario requires that
//! no `IsActive` call came between the load and the first replica (so no poll woke it) and that
//! the first replica came within a few stream intervals
//! ([`bounds::PUSH_TO_FIRST_REPLICA`]).
//!
//! Load stops → the stream sends `false`, which KEDA v2.20.2 ignores by design (scale-to-zero is
//! left to its polling loop): the scenario shortens the polling interval and KEDA scales to zero
//! after the cooldown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::api::{Api, DynamicObject};
use serde_json::{Value, json};

use crate::harness::binary;
use crate::harness::bounds;
use crate::harness::cluster::Cluster;
use crate::harness::deploy::deploy_with;
use crate::harness::example::{
    adapt_deployment, adapt_scaled_object, create_model_token, scaled_object_resource,
    start_source, wait_condition, wait_hpa_desired, wait_replicas,
};
use crate::harness::wait::{self, Check};

const INFERENCE_NS: &str = "e2e-push";
const SCALED_OBJECT: &str = "vllm-llama";
/// Longer than the whole scenario: after its first check, KEDA does not poll again unless told
/// to (which the scenario checks by counting `IsActive` calls).
const POLLING_INTERVAL: i64 = 3600;
/// The polling interval once the load stopped, for KEDA to notice the idle service.
const IDLE_POLLING_INTERVAL: i64 = 2;
/// Seconds of inactivity before KEDA scales to zero (the example's 600, compressed).
const COOLDOWN: i64 = 1;
/// How often nightshift's stream re-evaluates demand (the production default is 5 s).
const STREAM_INTERVAL: &str = "1s";
/// Waiting requests while loaded: 10 / 5 per replica → 2 replicas.
const LOAD: f64 = 10.0;
const LOADED_REPLICAS: i32 = 2;

pub async fn run(cluster: Arc<Cluster>) -> Result<()> {
    let c = &*cluster;
    let dir = tempfile::Builder::new()
        .prefix("nightshift-e2e-push-")
        .tempdir()?;
    let result = scenario(c, dir.path()).await;
    let cleanup = binary::delete_namespaces_now(c, &[INFERENCE_NS]).await;
    match result {
        Ok(()) => cleanup,
        Err(e) => {
            let kept = dir.keep();
            Err(anyhow!("{e:#}\nPrometheus log kept in {}", kept.display()))
        }
    }
}

async fn scenario(c: &Cluster, dir: &std::path::Path) -> Result<()> {
    let client = c.client.clone();
    c.keda().await?;
    let (emu, prom) = start_source(dir, INFERENCE_NS, 0.0).await?;
    let options = [
        format!("--scaler-allowed-prometheus={}", prom.address()),
        "--scaler-allow-loopback".to_string(),
        format!("--scaler-stream-interval={STREAM_INTERVAL}"),
    ];
    let (_ws, nightshift, _registration) = deploy_with(c, "nightshift-push", &options).await?;
    let admin = nightshift.admin_api();
    c.create_namespace(INFERENCE_NS, json!({})).await?;
    create_model_token(c, INFERENCE_NS)?;

    // The example as rendered by kustomize, adapted to this cluster like the loop's.
    let (deployment, scaled_object) =
        render_example(&nightshift.scaler.to_string(), &prom.address())?;
    for object in [&deployment, &scaled_object] {
        binary::kubectl_ok(c, &["apply", "-f", "-"], Some(&object.to_string()))?;
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), INFERENCE_NS);
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), INFERENCE_NS);
    let scaled_objects: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), INFERENCE_NS, &scaled_object_resource());

    // No demand: KEDA's first check finds the trigger inactive and scales to zero.
    wait_replicas(c, &deployments, 0).await?;
    // KEDA opens the stream and runs its first poll at about the same time; the stream's first
    // evaluation may land after the scale to zero.
    wait::until(
        "KEDA holding a StreamIsActive stream to nightshift",
        Duration::from_secs(60),
        || async {
            let streams = scaler_requests(&admin, "StreamIsActive").await?;
            Ok(if streams > 0.0 {
                Check::Done(())
            } else {
                Check::Pending(format!("{streams} stream requests"))
            })
        },
    )
    .await?;

    // Load arrives: the stream wakes the service, then the HPA follows the demand. KEDA's polls
    // are `IsActive` calls (the HPA, which would call `GetMetrics`, is idle at zero replicas):
    // none may come between the load and the first replica.
    let polls_before = scaler_requests(&admin, "IsActive").await?;
    let t_load = Instant::now();
    emu.set(0, |e| e.waiting = LOAD);
    wait_replicas(c, &deployments, 1).await?;
    let woke = t_load.elapsed();
    let polls = scaler_requests(&admin, "IsActive").await? - polls_before;
    ensure!(
        polls == 0.0,
        "KEDA polled nightshift ({polls} IsActive calls) between the load and the first replica \
         ({woke:?}): the wake-up cannot be credited to the stream"
    );
    wait_hpa_desired(c, &hpas, LOADED_REPLICAS).await?;
    wait_replicas(c, &deployments, LOADED_REPLICAS).await?;
    let scaled = t_load.elapsed();

    // Load stops. KEDA v2.20.2 ignores the stream's `false` ("inactivation happens through the
    // standard metric scaling logic"): scaling to zero waits for its next poll, here brought
    // forward by shortening the polling interval as an operator would.
    emu.set(0, |e| e.waiting = 0.0);
    let t_idle = Instant::now();
    binary::kubectl_ok(
        c,
        &[
            "patch",
            "scaledobject",
            SCALED_OBJECT,
            "--namespace",
            INFERENCE_NS,
            "--type=merge",
            "--patch",
            &json!({"spec": {"pollingInterval": IDLE_POLLING_INTERVAL}}).to_string(),
        ],
        None,
    )?;
    wait_replicas(c, &deployments, 0).await?;
    let slept = t_idle.elapsed();
    wait_condition(c, &scaled_objects, "Active", "False").await?;
    eprintln!(
        "push: external-push with minReplicaCount 0 (KEDA polling every {POLLING_INTERVAL} s): \
         load arrived → 1 replica after {:.2} s (StreamIsActive, no IsActive poll in \
         between), {LOADED_REPLICAS} after {:.2} s (HPA); load stopped → 0 replicas after {:.2} \
         s (KEDA's poll every {IDLE_POLLING_INTERVAL} s, cooldown {COOLDOWN} s)",
        woke.as_secs_f64(),
        scaled.as_secs_f64(),
        slept.as_secs_f64()
    );
    bounds::PUSH_TO_FIRST_REPLICA.check(woke)?;
    Ok(())
}

/// `manifests/examples/vllm-push` rendered by kustomize: its Deployment and ScaledObject, with
/// this cluster's addresses, KEDA's polling interval set to [`POLLING_INTERVAL`] and the
/// cooldown to [`COOLDOWN`].
fn render_example(scaler: &str, prometheus: &str) -> Result<(Value, Value)> {
    let rendered = binary::kustomize_build(&binary::manifests_dir().join("examples/vllm-push"))?;
    let mut deployment = None;
    let mut scaled_object = None;
    for doc in serde_yaml_ng::Deserializer::from_str(&rendered) {
        let v: Value =
            serde::Deserialize::deserialize(doc).context("parsing the rendered example")?;
        match v["kind"].as_str() {
            Some("Deployment") => deployment = Some(adapt_deployment(v, INFERENCE_NS)?),
            Some("ScaledObject") => {
                scaled_object = Some(adapt_scaled_object(v, INFERENCE_NS, scaler, prometheus)?);
            }
            _ => {}
        }
    }
    let deployment = deployment.context("the push example renders no Deployment")?;
    let mut so = scaled_object.context("the push example renders no ScaledObject")?;
    ensure!(
        so["spec"]["triggers"][0]["type"] == "external-push" && so["spec"]["minReplicaCount"] == 0,
        "the push example should use external-push with minReplicaCount 0: {}",
        so["spec"]
    );
    so["spec"]["pollingInterval"] = json!(POLLING_INTERVAL);
    so["spec"]["cooldownPeriod"] = json!(COOLDOWN);
    Ok((deployment, so))
}

/// Calls of the scaler's `rpc` nightshift has answered, whatever their outcome
/// (`StreamIsActive`: the evaluations of the streams KEDA's operator holds; `IsActive`: its
/// polls).
async fn scaler_requests(admin: &binary::AdminApi, rpc: &str) -> Result<f64> {
    let text = admin.get("/metrics").await?;
    let label = format!("rpc=\"{rpc}\"");
    Ok(text
        .lines()
        .filter(|l| l.starts_with("nightshift_scaler_requests_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}
