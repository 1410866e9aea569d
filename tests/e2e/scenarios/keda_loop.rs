//! The whole loop on one control plane, as a user runs it: nightshift as deployed (`nightshift
//! run`: webhook, pool controller and scaler, local overlay applied), the real KEDA operator and
//! metrics adapter, the HPA controller of kube-controller-manager, and the shipped example
//! (`manifests/examples/vllm`: Deployment and ScaledObject, patched only for addresses and
//! timings). The scaler reads a real Prometheus that scrapes a vLLM-metrics emulator. A research
//! Indexed Job is submitted unmarked in a research namespace; the webhook marks it and the pool
//! controller lends it the spare GPUs.
//!
//! Then: load rises → nightshift's demand → KEDA → HPA → Deployment scale-up → the scheduler
//! preempts research (counted by the pool controller; no inference victim; GPUs never
//! over-committed). Load falls → HPA scales down → spare marks return → research binds again.
//! Prometheus killed → nightshift answers errors (never zero) → KEDA's fallback → the Deployment
//! goes to `fallback.replicas` → Prometheus back → normal scaling. KEDA's metrics adapter killed →
//! the HPA holds its replicas, nightshift keeps answering KEDA's operator → adapter back → the HPA
//! reads the metric again. nightshift killed → KEDA cannot read the metric spec, no fallback;
//! the load rises meanwhile and the HPA holds its replicas all the same → nightshift back → the
//! HPA scales to the risen demand.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Result, anyhow, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};

use crate::harness::binary::{self, Nightshift, SPARE};
use crate::harness::bounds;
use crate::harness::cluster::{Cluster, GPU_NODES, GPUS_PER_NODE, POOL_LABEL};
use crate::harness::deploy::{deploy_with, wait_webhook_active};
use crate::harness::example::{
    HPA, SCALED_OBJECT, adapt_deployment, adapt_scaled_object, condition, create_model_token,
    read_example, replicas, scaled_object_resource, start_source, wait_condition, wait_hpa_desired,
    wait_replicas,
};
use crate::harness::keda_stack::ADAPTER;
use crate::harness::objects::{self, is_bound, is_running};
use crate::harness::research::assert_marked;
use crate::harness::victims::{self, VictimWatch};
use crate::harness::wait::{self, Check};

const INFERENCE_NS: &str = "e2e-loop";
const RESEARCH_NS: &str = "e2e-loop-research";
const INFERENCE_SELECTOR: &str = "app.kubernetes.io/name=vllm-llama";
const RESEARCH_SELECTOR: &str = "role=research";
/// The metric name KEDA gives nightshift's metric (`s<trigger index>-<metric name>`).
const METRIC: &str = "s0-vllm-demand";
/// The example's per-replica target of waiting requests (`waitingTarget: "5"`).
const WAITING_TARGET: f64 = 5.0;
/// Emulated queue lengths: 10 / 5 → 2 replicas; 30 / 5 → 6 replicas.
const LOW_LOAD: f64 = 10.0;
const HIGH_LOAD: f64 = 30.0;
const LOW_REPLICAS: i32 = 2;
const HIGH_REPLICAS: i32 = 6;
/// The example's `fallback.replicas` (behaviour `currentReplicasIfHigher`: from 2 replicas the
/// fallback raises them to 4).
const FALLBACK_REPLICAS: i32 = 4;
/// GPUs per inference replica (the example's `nvidia.com/gpu: "4"`).
const INFERENCE_GPUS: u32 = 4;
/// More research pods than spare GPUs, so that some always wait and take freed GPUs at once.
const RESEARCH_PODS: i32 = 40;
/// KEDA's polling interval, compressed from the example's 10 s so that the scenario takes
/// seconds (the HPA syncs every [`crate::harness::cluster::HPA_SYNC`]).
const POLLING_INTERVAL: i64 = 1;
/// Failed HPA syncs observed while nightshift is down: the HPA must have tried (and failed)
/// several times without changing anything.
const HELD_SYNCS: usize = 3;
/// Deadline of each step; far above the seconds each takes, for a loaded 2-core machine.
const STEP: Duration = Duration::from_secs(120);
/// How often the replicas are read while the HPA must hold them.
const HOLD_POLL: Duration = Duration::from_millis(250);

pub async fn run(cluster: Arc<Cluster>) -> Result<()> {
    let c = &*cluster;
    let dir = tempfile::Builder::new()
        .prefix("nightshift-e2e-loop-")
        .tempdir()?;
    let result = scenario(c, dir.path()).await;
    let cleanup = binary::delete_namespaces_now(c, &[RESEARCH_NS, INFERENCE_NS]).await;
    let unmark = binary::remove_spare_marks(c);
    match result {
        Ok(()) => cleanup.and(unmark),
        Err(e) => {
            let kept = dir.keep();
            Err(anyhow!(
                "{e:#}\nPrometheus log kept in {}\n----- prometheus -----\n{}",
                kept.display(),
                crate::harness::process::tail(&kept.join("prometheus.log"), 20)
            ))
        }
    }
}

async fn scenario(c: &Cluster, dir: &Path) -> Result<()> {
    let client = c.client.clone();
    let keda = c.keda().await?;
    eprintln!(
        "loop: KEDA operator (gRPC {}, probe http://{}) and adapter ready in {:.1} s",
        keda.operator_grpc,
        keda.operator_probe,
        keda.started_in.as_secs_f64()
    );
    let (emu, prom) = start_source(dir, INFERENCE_NS, LOW_LOAD).await?;

    // nightshift as deployed: webhook, pool controller (no headroom, lending always open) and
    // scaler in one process.
    // The test's Prometheus listens on loopback: allow exactly it, as a dev setup would.
    // Reclaim notices are the notice scenario's: with them, the low load (exactly 2 replicas'
    // worth, within the margin of a 3rd) would keep the 3rd replica's GPUs from research, and
    // this scenario counts every GPU inference does not hold as research's.
    let source_policy = [
        format!("--scaler-allowed-prometheus={}", prom.address()),
        "--scaler-allow-loopback".to_string(),
        "--pool-notices=false".to_string(),
    ];
    let (ws, mut nightshift, _registration) =
        deploy_with(c, "nightshift-loop", &source_policy).await?;
    c.create_namespace(RESEARCH_NS, json!({"nightshift.io/research": "true"}))
        .await?;
    c.create_namespace(INFERENCE_NS, json!({})).await?;
    wait_webhook_active(c, RESEARCH_NS).await?;

    // The example, applied as a user would, with the model-hub token Secret it reads.
    create_model_token(c, INFERENCE_NS)?;
    let deployment = example_deployment()?;
    let scaled_object = example_scaled_object(&nightshift.scaler.to_string(), &prom.address())?;
    for object in [&deployment, &scaled_object] {
        binary::kubectl_ok(c, &["apply", "-f", "-"], Some(&object.to_string()))?;
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), INFERENCE_NS);
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), INFERENCE_NS);
    let scaled_objects: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), INFERENCE_NS, &scaled_object_resource());

    // KEDA reconciles the ScaledObject into an HPA on nightshift's one metric, AverageValue 100.
    let hpa = wait::until("KEDA's HPA", STEP, || async {
        c.check_processes()?;
        Ok(match hpas.get_opt(HPA).await? {
            Some(h) => Check::Done(h),
            None => Check::Pending("absent".into()),
        })
    })
    .await?;
    let spec = serde_json::to_value(&hpa.spec)?;
    ensure!(
        spec["metrics"][0]["external"]["metric"]["name"] == METRIC
            && spec["metrics"][0]["external"]["target"]["type"] == "AverageValue"
            && spec["metrics"][0]["external"]["target"]["averageValue"] == "100",
        "KEDA's HPA should read {METRIC} with an AverageValue target of 100: {spec}"
    );
    ensure!(
        spec["minReplicas"] == 1 && spec["maxReplicas"] == 8,
        "the HPA should keep the example's bounds [1, 8]: {spec}"
    );
    wait_replicas(c, &deployments, LOW_REPLICAS).await?;
    victims::wait_pods(
        c,
        INFERENCE_NS,
        INFERENCE_SELECTOR,
        LOW_REPLICAS as usize,
        is_running,
        STEP,
    )
    .await?;
    let value = external_metric(c).await?;
    ensure!(
        value == LOW_LOAD / WAITING_TARGET * 100.0,
        "the external metrics API should serve demand x 100 = {}: {value}",
        LOW_LOAD / WAITING_TARGET * 100.0
    );

    // Research, submitted unmarked: the webhook marks it, the pool controller's spare marks let
    // it onto every GPU inference does not use; the rest wait.
    let total = GPU_NODES * GPUS_PER_NODE;
    let research_full = (total - LOW_REPLICAS as u32 * INFERENCE_GPUS) as usize;
    let jobs: Api<Job> = Api::namespaced(client.clone(), RESEARCH_NS);
    let mut job = objects::research_job("research", RESEARCH_PODS, false)?;
    if let Some(spec) = job.spec.as_mut() {
        spec.completion_mode = Some("Indexed".into());
    }
    jobs.create(&PostParams::default(), &job).await?;
    victims::wait_pods(
        c,
        RESEARCH_NS,
        RESEARCH_SELECTOR,
        research_full,
        is_running,
        STEP,
    )
    .await?;
    let research = objects::pods(&client, RESEARCH_NS, RESEARCH_SELECTOR).await?;
    let sample = research
        .values()
        .find(|p| is_running(p))
        .ok_or_else(|| anyhow!("no running research pod"))?;
    assert_marked(sample, true)?;
    ensure!(
        requires_spare(sample),
        "research pods should require the spare mark (the webhook's required spare gate): {:?}",
        sample.spec.as_ref().and_then(|s| s.affinity.clone())
    );
    ensure!(
        gpus_in_use(&client).await? == total,
        "expected all {total} GPUs in use before the load rises"
    );
    wait_spare_nodes(c, "no node spare with every GPU in use", |n| n == 0).await?;
    let admin = nightshift.admin_api();
    let preemptions_before = admin.metric("nightshift_pool_preemptions_total").await?;

    // Load rises: nightshift → KEDA → HPA → Deployment → the scheduler preempts research.
    let research_watch = VictimWatch::start(&client, RESEARCH_NS, STEP).await?;
    let inference_watch = VictimWatch::start(&client, INFERENCE_NS, STEP).await?;
    let t_rise = Instant::now();
    emu.set(0, |e| e.waiting = HIGH_LOAD);
    wait_hpa_desired(c, &hpas, HIGH_REPLICAS).await?;
    let to_desired = t_rise.elapsed();
    wait_replicas(c, &deployments, HIGH_REPLICAS).await?;
    let to_scaled = t_rise.elapsed();
    victims::wait_pods(
        c,
        INFERENCE_NS,
        INFERENCE_SELECTOR,
        HIGH_REPLICAS as usize,
        is_bound,
        STEP,
    )
    .await?;
    let to_bound = t_rise.elapsed();
    let needed = ((HIGH_REPLICAS - LOW_REPLICAS) as u32 * INFERENCE_GPUS) as usize;
    let n_victims = research_watch.wait_research(needed, STEP).await?;
    victims::wait_pods(
        c,
        RESEARCH_NS,
        RESEARCH_SELECTOR,
        research_full - needed,
        is_running,
        STEP,
    )
    .await?;
    ensure!(
        inference_watch.research() + inference_watch.inference() == 0
            && research_watch.inference() == 0,
        "an inference pod was preempted"
    );
    ensure!(
        gpus_in_use(&client).await? <= total,
        "GPUs over-committed after preemption"
    );
    wait_spare_nodes(c, "no node spare with the freed GPUs in use", |n| n == 0).await?;
    let counted = wait::until(
        "the pool controller to count the preemptions",
        STEP,
        || async {
            let n = admin.metric("nightshift_pool_preemptions_total").await? - preemptions_before;
            let status: Value = serde_json::from_str(&admin.get("/status").await?)?;
            let recent = status["recent_disruptions"]
                .as_array()
                .map(|a| a.len())
                .unwrap_or(0);
            Ok(if n >= needed as f64 && recent > 0 {
                Check::Done((n, recent))
            } else {
                Check::Pending(format!(
                    "{n} preemptions counted, {recent} recent disruptions"
                ))
            })
        },
    )
    .await?;
    eprintln!(
        "loop: load {LOW_LOAD}->{HIGH_LOAD} waiting: HPA desired {HIGH_REPLICAS} after {:.2} s, \
         Deployment {HIGH_REPLICAS} after {:.2} s, all inference pods bound after {:.2} s; \
         {n_victims} research pods preempted, {} counted by the pool controller ({} in /status)",
        to_desired.as_secs_f64(),
        to_scaled.as_secs_f64(),
        to_bound.as_secs_f64(),
        counted.0,
        counted.1
    );
    bounds::RISE_TO_DESIRED.check(to_desired)?;
    bounds::RISE_TO_BOUND.check(to_bound)?;

    // Load falls: the HPA scales down, spare marks return, the waiting research binds again.
    let t_drop = Instant::now();
    emu.set(0, |e| e.waiting = LOW_LOAD);
    wait_hpa_desired(c, &hpas, LOW_REPLICAS).await?;
    wait_replicas(c, &deployments, LOW_REPLICAS).await?;
    let to_down = t_drop.elapsed();
    victims::wait_pods(
        c,
        RESEARCH_NS,
        RESEARCH_SELECTOR,
        research_full,
        is_running,
        STEP,
    )
    .await?;
    let to_research = t_drop.elapsed();
    ensure!(
        gpus_in_use(&client).await? == total,
        "expected all {total} GPUs in use again"
    );
    eprintln!(
        "loop: load {HIGH_LOAD}->{LOW_LOAD} waiting: Deployment {LOW_REPLICAS} after {:.2} s, \
         {research_full} research pods running again after {:.2} s",
        to_down.as_secs_f64(),
        to_research.as_secs_f64()
    );
    bounds::FALL_TO_REPLICAS.check(to_down)?;
    bounds::FALL_TO_RESEARCH.check(to_research)?;

    // The vLLM source fails: nightshift answers errors, never zero; KEDA falls back.
    let t_kill = Instant::now();
    prom.kill()?;
    let fallback = wait::until("KEDA's Fallback condition", STEP, || async {
        c.check_processes()?;
        let so = scaled_objects.get(SCALED_OBJECT).await?;
        Ok(match condition(&so, "Fallback") {
            Some((status, _)) if status == "True" => Check::Done(so),
            other => Check::Pending(format!("Fallback {other:?}")),
        })
    })
    .await?;
    let to_fallback = t_kill.elapsed();
    let failures = fallback.data["status"]["health"][METRIC]["numberOfFailures"].as_i64();
    ensure!(
        failures.is_some_and(|n| n >= 3),
        "KEDA should have counted at least failureThreshold (3) failures: {}",
        fallback.data["status"]["health"]
    );
    wait_replicas(c, &deployments, FALLBACK_REPLICAS).await?;
    let to_fallback_replicas = t_kill.elapsed();
    let value = external_metric(c).await?;
    ensure!(
        value > 0.0,
        "the external metric during the outage should be KEDA's fallback, never zero: {value}"
    );
    ensure!(
        gpus_in_use(&client).await? <= total,
        "GPUs over-committed at the fallback size"
    );
    // What KEDA got from nightshift: gRPC errors (UNAVAILABLE), as its events on the
    // ScaledObject say.
    let unavailable = scaler_failures(&client, "code = Unavailable").await?;
    ensure!(
        unavailable > 0,
        "KEDA should report nightshift's UNAVAILABLE answers: {:?}",
        scaler_failure_messages(&client).await?
    );
    eprintln!(
        "loop: Prometheus killed: KEDA's Fallback after {:.2} s, Deployment at \
         fallback.replicas {FALLBACK_REPLICAS} after {:.2} s (external metric {value}); \
         {unavailable} UNAVAILABLE answers reported by KEDA",
        to_fallback.as_secs_f64(),
        to_fallback_replicas.as_secs_f64()
    );
    bounds::SOURCE_DOWN_TO_FALLBACK.check(to_fallback)?;
    bounds::SOURCE_DOWN_TO_FALLBACK_REPLICAS.check(to_fallback_replicas)?;

    // The source returns: fallback ends, normal scaling resumes at the low load.
    let t_back = Instant::now();
    prom.restart()?;
    prom.wait_ready().await?;
    wait_condition(c, &scaled_objects, "Fallback", "False").await?;
    wait_replicas(c, &deployments, LOW_REPLICAS).await?;
    eprintln!(
        "loop: Prometheus back: Deployment at {LOW_REPLICAS} again after {:.2} s",
        t_back.elapsed().as_secs_f64()
    );

    // KEDA's metrics adapter killed: the HPA cannot read the metric and holds its replicas;
    // nightshift is unaffected (it still answers KEDA's operator) and the HPA resumes once the
    // adapter is back.
    let served_before = admin.metric("nightshift_scaler_requests_total").await?;
    c.kill_component(ADAPTER)?;
    let adapter_down = held_while_metric_fails(c, &hpas, &deployments, async { Ok(()) }).await?;
    nightshift.check_running()?;
    admin.get("/readyz").await?;
    let served = admin.metric("nightshift_scaler_requests_total").await? - served_before;
    ensure!(
        served > 0.0,
        "nightshift should keep answering KEDA's operator while the adapter is down"
    );
    let t_adapter = Instant::now();
    c.restart_component(ADAPTER)?;
    let value = wait::until(
        "the external metric through the restarted adapter",
        STEP,
        || async {
            Ok(match external_metric(c).await {
                Ok(v) => Check::Done(v),
                Err(e) => Check::Pending(format!("{e:#}")),
            })
        },
    )
    .await?;
    let metric_back = t_adapter.elapsed();
    ensure!(
        value == LOW_LOAD / WAITING_TARGET * 100.0,
        "the restarted adapter should serve nightshift's demand x 100: {value}"
    );
    wait_scaling_active(c, &hpas).await?;
    eprintln!(
        "loop: KEDA adapter killed: HPA ScalingActive=False ({}) after {:.2} s; held \
         {LOW_REPLICAS} replicas over {} more failed syncs while nightshift answered {served} \
         operator requests; adapter restarted: metric back in {:.2} s, HPA active again in \
         {:.2} s",
        adapter_down.reason,
        adapter_down.failed_after.as_secs_f64(),
        adapter_down.held_syncs,
        metric_back.as_secs_f64(),
        t_adapter.elapsed().as_secs_f64()
    );
    bounds::METRIC_DOWN_TO_HELD.check(adapter_down.failed_after)?;

    // nightshift killed: KEDA cannot even read the metric spec, so it has nothing to fall back
    // on; the HPA cannot read the metric. The load then rises to what asks for
    // HIGH_REPLICAS, and Prometheus scrapes it: the demand is there, only nightshift is missing
    // to report it. The HPA must hold its replicas all the same.
    let webhook_port = nightshift.webhook.port();
    let scaler_addr = nightshift.scaler;
    nightshift.kill();
    let risen = async {
        let t_raise = SystemTime::now();
        emu.set(0, |e| e.waiting = HIGH_LOAD);
        prom.wait_fresh_scrape(t_raise).await
    };
    let nightshift_down = held_while_metric_fails(c, &hpas, &deployments, risen).await?;
    ensure!(
        scaler_failures(&client, "empty metric spec").await? > 0,
        "KEDA should report that it cannot read the metric spec: {:?}",
        scaler_failure_messages(&client).await?
    );
    let so = scaled_objects.get(SCALED_OBJECT).await?;
    ensure!(
        condition(&so, "Fallback").is_none_or(|(s, _)| s != "True"),
        "KEDA should not fall back when it cannot read the metric spec: {:?}",
        condition(&so, "Fallback")
    );
    ensure!(
        external_metric(c).await.is_err(),
        "the external metrics API should fail while nightshift is down"
    );
    eprintln!(
        "loop: nightshift killed: HPA ScalingActive=False ({}) after {:.2} s; load \
         {LOW_LOAD}->{HIGH_LOAD} waiting meanwhile (scraped by Prometheus): held {LOW_REPLICAS} \
         replicas over {} more failed syncs, no fallback",
        nightshift_down.reason,
        nightshift_down.failed_after.as_secs_f64(),
        nightshift_down.held_syncs
    );
    bounds::METRIC_DOWN_TO_HELD.check(nightshift_down.failed_after)?;

    // nightshift back where KEDA and the API server expect it (the same scaler and webhook
    // ports): the HPA reads the risen demand and scales up, over research.
    let t_back = Instant::now();
    let mut options = source_policy.to_vec();
    options.push(format!("--scaler-addr={scaler_addr}"));
    let mut restarted = Nightshift::start_with(
        c,
        "nightshift-loop-restarted",
        &c.kubeconfig,
        &ws.certs(),
        webhook_port,
        &options,
    )
    .await?;
    restarted.wait_ready().await?;
    wait_scaling_active(c, &hpas).await?;
    let active_in = t_back.elapsed();
    wait_hpa_desired(c, &hpas, HIGH_REPLICAS).await?;
    let desired_in = t_back.elapsed();
    wait_replicas(c, &deployments, HIGH_REPLICAS).await?;
    victims::wait_pods(
        c,
        INFERENCE_NS,
        INFERENCE_SELECTOR,
        HIGH_REPLICAS as usize,
        is_bound,
        STEP,
    )
    .await?;
    let bound_in = t_back.elapsed();
    restarted.check_running()?;
    eprintln!(
        "loop: nightshift restarted: HPA ScalingActive=True after {:.2} s, desired \
         {HIGH_REPLICAS} after {:.2} s, all {HIGH_REPLICAS} inference pods bound after {:.2} s",
        active_in.as_secs_f64(),
        desired_in.as_secs_f64(),
        bound_in.as_secs_f64()
    );
    Ok(())
}

/// `manifests/examples/vllm/deployment.yaml` for this cluster.
fn example_deployment() -> Result<Value> {
    adapt_deployment(read_example("deployment.yaml")?, INFERENCE_NS)
}

/// `manifests/examples/vllm/scaledobject.yaml` for this cluster, polled every
/// [`POLLING_INTERVAL`].
fn example_scaled_object(scaler: &str, prometheus: &str) -> Result<Value> {
    let mut so = adapt_scaled_object(
        read_example("scaledobject.yaml")?,
        INFERENCE_NS,
        scaler,
        prometheus,
    )?;
    so["spec"]["pollingInterval"] = json!(POLLING_INTERVAL);
    ensure!(
        so["spec"]["fallback"]["replicas"] == FALLBACK_REPLICAS
            && so["spec"]["fallback"]["behavior"] == "currentReplicasIfHigher",
        "the example's fallback changed: {}",
        so["spec"]["fallback"]
    );
    Ok(so)
}

/// Whether a pod's required node affinity asks for the spare mark in every term.
fn requires_spare(p: &k8s_openapi::api::core::v1::Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .is_some_and(|r| {
            !r.node_selector_terms.is_empty()
                && r.node_selector_terms.iter().all(|t| {
                    t.match_expressions
                        .as_ref()
                        .is_some_and(|es| es.iter().any(|e| e.key == SPARE))
                })
        })
}

/// The value the external metrics API serves for nightshift's metric of the ScaledObject, as
/// the HPA reads it.
async fn external_metric(c: &Cluster) -> Result<f64> {
    let path = format!(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/{INFERENCE_NS}/{METRIC}?labelSelector=scaledobject.keda.sh%2Fname%3D{SCALED_OBJECT}"
    );
    let req = http::Request::get(&path).body(Vec::new())?;
    let body: Value = serde_json::from_str(&c.client.request_text(req).await?)?;
    let q = body["items"][0]["value"]
        .as_str()
        .ok_or_else(|| anyhow!("no value in {body}"))?;
    parse_quantity(q).ok_or_else(|| anyhow!("unparsable quantity {q:?}"))
}

/// A Kubernetes quantity as the metrics API writes values (`200`, `1500m`, `2k`).
fn parse_quantity(q: &str) -> Option<f64> {
    let (num, scale) = match q.strip_suffix('m') {
        Some(n) => (n, 1e-3),
        None => match q.strip_suffix('k') {
            Some(n) => (n, 1e3),
            None => (q, 1.0),
        },
    };
    num.parse::<f64>().ok().map(|v| v * scale)
}

/// GPUs requested by the bound pods of both namespaces.
async fn gpus_in_use(client: &kube::Client) -> Result<u32> {
    Ok(victims::gpus_in_use(client, INFERENCE_NS).await?
        + victims::gpus_in_use(client, RESEARCH_NS).await?)
}

/// How many times the HPA reported that it could not read the external metric (its warning
/// events, counted as the event recorder aggregates them).
async fn failed_metric_events(client: &kube::Client) -> Result<i32> {
    let events: Api<Event> = Api::namespaced(client.clone(), INFERENCE_NS);
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={HPA}")))
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("FailedGetExternalMetric"))
        .map(occurrences)
        .sum())
}

/// How often an event happened: the legacy recorder counts repeats in `count`, the
/// `events.k8s.io` recorder (KEDA's) in `series.count`.
fn occurrences(e: &Event) -> i32 {
    let series = e.series.as_ref().and_then(|s| s.count).unwrap_or(0);
    e.count.unwrap_or(0).max(series).max(1)
}

/// KEDA's `KEDAScalerFailed` warning events on the ScaledObject: message and count.
async fn scaler_failure_messages(client: &kube::Client) -> Result<Vec<(String, i32)>> {
    let events: Api<Event> = Api::namespaced(client.clone(), INFERENCE_NS);
    let list = events
        .list(&ListParams::default().fields(&format!(
            "involvedObject.kind=ScaledObject,involvedObject.name={SCALED_OBJECT}"
        )))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("KEDAScalerFailed"))
        .map(|e| (e.message.clone().unwrap_or_default(), occurrences(&e)))
        .collect())
}

/// How many times KEDA reported a scaler failure whose message contains `text`.
async fn scaler_failures(client: &kube::Client, text: &str) -> Result<i32> {
    Ok(scaler_failure_messages(client)
        .await?
        .iter()
        .filter(|(m, _)| m.contains(text))
        .map(|(_, n)| n)
        .sum())
}

/// Waits until the number of GPU nodes carrying the spare mark satisfies `f`.
async fn wait_spare_nodes(c: &Cluster, what: &str, f: impl Fn(usize) -> bool) -> Result<usize> {
    let nodes: Api<Node> = Api::all(c.client.clone());
    let f = &f;
    wait::until(what, STEP, || async {
        let n = nodes
            .list(&ListParams::default().labels(&format!("{POOL_LABEL},{SPARE}")))
            .await?
            .items
            .len();
        Ok(if f(n) {
            Check::Done(n)
        } else {
            Check::Pending(format!("{n} spare nodes"))
        })
    })
    .await
}

/// How the HPA behaved while its metric could not be read.
struct Held {
    /// The reason of its `ScalingActive=False` condition.
    reason: String,
    failed_after: Duration,
    held_syncs: i32,
}

/// Right after a part of the metric path was killed: waits until the HPA reports that it cannot
/// read the metric, runs `meanwhile` (a change of the load, say), then waits for [`HELD_SYNCS`]
/// more failed syncs (counted by the HPA's own warning events), during which the Deployment must
/// keep [`LOW_REPLICAS`], the HPA must keep desiring them and must not scale. Does not check the
/// environment's processes: one of them is down on purpose.
async fn held_while_metric_fails(
    c: &Cluster,
    hpas: &Api<HorizontalPodAutoscaler>,
    deployments: &Api<Deployment>,
    meanwhile: impl Future<Output = Result<()>>,
) -> Result<Held> {
    let client = &c.client;
    let last_scale = hpas.get(HPA).await?.status.and_then(|s| s.last_scale_time);
    let t_down = Instant::now();
    let reason = wait::until(
        "the HPA to fail reading the external metric",
        STEP,
        || async {
            Ok(match scaling_active(hpas).await? {
                Some((status, reason)) if status == "False" => Check::Done(reason),
                other => Check::Pending(format!("ScalingActive {other:?}")),
            })
        },
    )
    .await?;
    let failed_after = t_down.elapsed();
    meanwhile.await?;
    // Watched, not waited on: a scale-up fails the step at once.
    let first = failed_metric_events(client).await?;
    let watched = Instant::now();
    let held_syncs = loop {
        let r = replicas(deployments).await?;
        ensure!(
            r == LOW_REPLICAS,
            "the Deployment changed to {r} replicas while the metric could not be read"
        );
        let desired = hpas.get(HPA).await?.status.map(|s| s.desired_replicas);
        ensure!(
            desired == Some(LOW_REPLICAS),
            "the HPA desired {desired:?} replicas while the metric could not be read"
        );
        let n = failed_metric_events(client).await? - first;
        if n >= HELD_SYNCS as i32 {
            break n;
        }
        ensure!(
            watched.elapsed() < STEP,
            "timed out after {STEP:?} waiting for {HELD_SYNCS} more failed HPA syncs: {n} seen"
        );
        tokio::time::sleep(HOLD_POLL).await;
    };
    let after = hpas.get(HPA).await?.status.and_then(|s| s.last_scale_time);
    ensure!(
        after == last_scale,
        "the HPA scaled while the metric could not be read"
    );
    Ok(Held {
        reason,
        failed_after,
        held_syncs,
    })
}

/// Status and reason of the HPA's `ScalingActive` condition.
async fn scaling_active(hpas: &Api<HorizontalPodAutoscaler>) -> Result<Option<(String, String)>> {
    Ok(hpas
        .get(HPA)
        .await?
        .status
        .and_then(|s| s.conditions)
        .and_then(|cs| cs.into_iter().find(|c| c.type_ == "ScalingActive"))
        .map(|c| (c.status, c.reason.unwrap_or_default())))
}

/// Waits until the HPA reads its metric again (`ScalingActive=True`).
async fn wait_scaling_active(c: &Cluster, hpas: &Api<HorizontalPodAutoscaler>) -> Result<()> {
    wait::until("the HPA to read its metric again", STEP, || async {
        c.check_processes()?;
        Ok(match scaling_active(hpas).await? {
            Some((status, _)) if status == "True" => Check::Done(()),
            other => Check::Pending(format!("ScalingActive {other:?}")),
        })
    })
    .await
}
