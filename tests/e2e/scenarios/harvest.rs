//! Harvest and preemption on the real scheduler: research pods fill the spare GPUs of the pool,
//! inference scales up and the scheduler preempts research pods for it (they get
//! `DisruptionTarget`/`PreemptionByScheduler`), the research Job replaces them (they wait),
//! inference scales down and the same Job's pods take the GPUs back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::harness::cluster::{Cluster, GPU_NODES, GPUS_PER_NODE};
use crate::harness::objects::{self, is_bound, is_running};
use crate::harness::victims::{self, VictimWatch};
use crate::harness::wait::{self, Check};

const NS: &str = "e2e-harvest";
/// GPUs per inference replica: half a node, so that two replicas share a node.
const INFERENCE_GPUS: u32 = 4;
const INFERENCE_START: i32 = 2;
const INFERENCE_PEAK: i32 = 6;
/// How long the scheduler and controllers get for each step; far above the few seconds they
/// take, so a slow shared machine does not make the test flaky.
const STEP: Duration = Duration::from_secs(120);

pub async fn run(cluster: Arc<Cluster>) -> Result<()> {
    let client = cluster.client.clone();
    objects::ensure_priority_classes(&client).await?;
    cluster.create_namespace(NS, json!({})).await?;

    let total = GPU_NODES * GPUS_PER_NODE;
    let research_n = (total - INFERENCE_START as u32 * INFERENCE_GPUS) as i32;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    deployments
        .create(
            &PostParams::default(),
            &objects::inference_deployment("inference", INFERENCE_START, INFERENCE_GPUS)?,
        )
        .await?;
    wait_running(&cluster, "role=inference", INFERENCE_START as usize).await?;

    // Research fills every spare GPU.
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let t = Instant::now();
    jobs.create(
        &PostParams::default(),
        &objects::indexed_research_job("research", research_n)?,
    )
    .await?;
    wait_running(&cluster, "role=research", research_n as usize).await?;
    eprintln!(
        "harvest: {research_n} research pods running on the {} spare GPUs in {:.1} s",
        research_n,
        t.elapsed().as_secs_f64()
    );
    let used = victims::gpus_in_use(&client, NS).await?;
    ensure!(
        used == total,
        "expected all {total} GPUs in use, found {used}"
    );

    // Record every pod the scheduler marks as a preemption victim; the watch is established
    // before scaling, so no early victim is missed.
    let victim_watch = VictimWatch::start(&client, NS, STEP).await?;

    // Inference scales up: the scheduler must make room by preempting research pods.
    let t_up = Instant::now();
    objects::scale_deployment(&client, NS, "inference", INFERENCE_PEAK).await?;
    wait_bound(&cluster, "role=inference", INFERENCE_PEAK as usize).await?;
    let bound_after = t_up.elapsed();
    wait_running(&cluster, "role=inference", INFERENCE_PEAK as usize).await?;
    let running_after = t_up.elapsed();
    let needed = ((INFERENCE_PEAK - INFERENCE_START) as u32 * INFERENCE_GPUS) as usize;
    let research_left = research_n as usize - needed;
    wait_running(&cluster, "role=research", research_left).await?;
    let n_victims = victim_watch.wait_research(needed, STEP).await?;
    let inference_hit = victim_watch.inference();
    drop(victim_watch);
    ensure!(
        inference_hit == 0,
        "{inference_hit} inference pods were preempted"
    );
    eprintln!(
        "harvest: scale-up {INFERENCE_START}->{INFERENCE_PEAK}: all inference pods bound in {:.2} s, \
         running in {:.2} s; {n_victims} research pods preempted (DisruptionTarget/PreemptionByScheduler)",
        bound_after.as_secs_f64(),
        running_after.as_secs_f64()
    );
    // The replacement research pods wait: preemptionPolicy Never, nothing lower to evict.
    let research = objects::pods(&client, NS, "role=research").await?;
    let running = research.values().filter(|p| is_running(p)).count();
    ensure!(
        running == research_left,
        "{running} research pods running after scale-up, expected {research_left}"
    );
    ensure!(
        victims::gpus_in_use(&client, NS).await? <= total,
        "GPUs over-committed after preemption"
    );

    // The Job controller replaces the preempted pods: kwok turns a deleted pod Failed first, as
    // a kubelet does, and the pod failure policy ignores failures carrying `DisruptionTarget`.
    // The replacements wait (preemptionPolicy Never, nothing lower to evict).
    let t_replace = Instant::now();
    let replaced = wait::until(
        &format!("the research Job to replace its {needed} preempted pods"),
        STEP,
        || async {
            let pods = objects::pods(&client, NS, "role=research").await?;
            let waiting = pods
                .values()
                .filter(|p| !is_bound(p) && p.metadata.deletion_timestamp.is_none())
                .count();
            Ok(if waiting >= needed {
                Check::Done(waiting)
            } else {
                Check::Pending(format!("{waiting} replacement pods waiting"))
            })
        },
    )
    .await?;
    ensure!(
        replaced == needed,
        "{replaced} replacement research pods, expected {needed}"
    );
    eprintln!(
        "harvest: the research Job replaced its {needed} preempted pods {:.1} s after the scale-up settled (per-index backoff)",
        t_replace.elapsed().as_secs_f64()
    );
    let job = jobs.get("research").await?;
    let failed = job.status.as_ref().and_then(|s| s.failed).unwrap_or(0);
    ensure!(
        failed == 0,
        "preempted pods were counted as {failed} Job failures despite the pod failure policy"
    );

    // Inference scales down: the same Job's waiting pods land on the freed GPUs.
    let t_down = Instant::now();
    objects::scale_deployment(&client, NS, "inference", INFERENCE_START).await?;
    wait_running(&cluster, "role=research", research_n as usize).await?;
    eprintln!(
        "harvest: scale-down {INFERENCE_PEAK}->{INFERENCE_START}: {research_n} research pods running again in {:.2} s",
        t_down.elapsed().as_secs_f64()
    );
    let research = objects::pods(&client, NS, "role=research").await?;
    ensure!(
        research
            .values()
            .filter(|p| is_running(p))
            .all(|p| objects::node_of(p).is_some_and(|n| n.starts_with("gpu-"))),
        "a research pod runs outside the GPU pool"
    );

    // The Job goes first: deleting the namespace under a running Indexed Job with
    // `backoffLimitPerIndex` left its pods Failed with their job-tracking finalizer (the Job
    // still Running) for minutes here; deleting the Job first finishes in seconds.
    jobs.delete("research", &kube::api::DeleteParams::background())
        .await?;
    cluster.delete_namespace(NS).await
}

/// Waits until exactly `n` pods matching `selector` run (and none more are bound).
async fn wait_running(cluster: &Cluster, selector: &str, n: usize) -> Result<()> {
    victims::wait_pods(cluster, NS, selector, n, is_running, STEP).await
}

async fn wait_bound(cluster: &Cluster, selector: &str, n: usize) -> Result<()> {
    let client = cluster.client.clone();
    wait::until(
        &format!("{n} bound pods with {selector} in {NS}"),
        STEP,
        || async {
            cluster.check_processes()?;
            let pods = objects::pods(&client, NS, selector).await?;
            let bound = pods.values().filter(|p| is_bound(p)).count();
            Ok(if bound >= n {
                Check::Done(())
            } else {
                Check::Pending(format!("{bound} bound of {} pods", pods.len()))
            })
        },
    )
    .await
}
