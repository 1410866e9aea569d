//! Packing on the real scheduler: the same research load on an empty pool, once with the default
//! scheduler profile and once with the packing profile that the webhook selects
//! (`--webhook-scheduler-name`, the profile from `manifests/examples/scheduler`). Reported: how
//! many nodes keep a whole inference replica's worth of free GPUs, and how many research pods
//! the next inference scale-up preempts. Asserted: with packing, the scale-up fits whole nodes
//! and preempts nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::harness::binary;
use crate::harness::cluster::{Cluster, GPU_NODES, GPUS_PER_NODE};
use crate::harness::deploy::{deploy_with, wait_webhook_active};
use crate::harness::objects::{self, is_bound, node_of};
use crate::harness::pool::wait_marks;
use crate::harness::victims::{VictimWatch, wait_pods};

const RESEARCH_NS: &str = "e2e-packing-research";
const INFERENCE_NS: &str = "e2e-packing-inference";
/// The packing profile's name in the example scheduler configuration.
const PACKING_PROFILE: &str = "nightshift-packing";
/// One-GPU research pods: on 4 nodes of 8 GPUs, spread evenly they leave 3 free GPUs per node
/// (no room for a 4-GPU replica anywhere); packed they leave a whole node and a half free.
const RESEARCH_PODS: u32 = 20;
/// The next inference scale-up: two 4-GPU replicas.
const INFERENCE_REPLICAS: i32 = 2;
const INFERENCE_GPUS: u32 = 4;
const STEP: Duration = Duration::from_secs(60);
/// CPU and memory per one-GPU trainer: 6 of the node's 64 CPUs and 48 of its 512 GiB, the
/// share of one of its 8 GPUs (with room left for the system).
const TRAINER_CPU: &str = "6";
const TRAINER_MEMORY: &str = "48Gi";

/// What one run left on the pool.
struct Layout {
    /// Research pods per node.
    research_per_node: BTreeMap<String, u32>,
    /// Nodes with at least one inference replica's worth of free GPUs.
    whole_replica_nodes: usize,
    /// Research pods preempted by the scale-up.
    preempted: usize,
}

pub async fn run(cluster: Arc<Cluster>) -> Result<()> {
    let c = &*cluster;
    let result = scenario(c).await;
    result.and(binary::clean_pool(c, &[RESEARCH_NS, INFERENCE_NS]).await)
}

async fn scenario(c: &Cluster) -> Result<()> {
    objects::ensure_priority_classes(&c.client).await?;
    let spread = one_run(c, "default", &[]).await?;
    let packed = one_run(
        c,
        "packed",
        &[format!("--webhook-scheduler-name={PACKING_PROFILE}")],
    )
    .await?;
    ensure!(
        packed.preempted == 0,
        "with packing, the scale-up preempted {} research pods (layout {:?})",
        packed.preempted,
        packed.research_per_node
    );
    ensure!(
        packed.whole_replica_nodes >= INFERENCE_REPLICAS as usize,
        "with packing only {} nodes keep {INFERENCE_GPUS} free GPUs (layout {:?})",
        packed.whole_replica_nodes,
        packed.research_per_node
    );
    eprintln!(
        "packing: {RESEARCH_PODS} one-GPU research pods, then {INFERENCE_REPLICAS} inference \
         replicas of {INFERENCE_GPUS} GPUs: default profile {:?} -> {} nodes with a replica's \
         worth free, {} research pods preempted; packing profile {:?} -> {} nodes, {} preempted",
        spread.research_per_node.values().collect::<Vec<_>>(),
        spread.whole_replica_nodes,
        spread.preempted,
        packed.research_per_node.values().collect::<Vec<_>>(),
        packed.whole_replica_nodes,
        packed.preempted
    );
    Ok(())
}

/// One run on an empty pool: nightshift with `extra` options, the research Job, then the
/// inference scale-up; everything is deleted again before returning.
async fn one_run(c: &Cluster, label: &str, extra: &[String]) -> Result<Layout> {
    let client = c.client.clone();
    let (_ws, mut ns, registration) =
        deploy_with(c, &format!("nightshift-packing-{label}"), extra).await?;
    c.create_namespace(RESEARCH_NS, json!({"nightshift.io/research": "true"}))
        .await?;
    c.create_namespace(INFERENCE_NS, json!({})).await?;
    wait_webhook_active(c, RESEARCH_NS).await?;
    // Every node lent before research arrives: otherwise the first pods go where the first
    // marks happen to be, and the layout says nothing about scoring.
    wait_marks(c, "every pool node marked spare", |m| {
        m.values().all(Option::is_some)
    })
    .await?;

    let t = Instant::now();
    Api::<Job>::namespaced(client.clone(), RESEARCH_NS)
        .create(&PostParams::default(), &trainer_job()?)
        .await?;
    wait_pods(
        c,
        RESEARCH_NS,
        "role=research",
        RESEARCH_PODS as usize,
        is_bound,
        STEP,
    )
    .await?;
    let pods = objects::pods(&client, RESEARCH_NS, "role=research").await?;
    let mut research_per_node: BTreeMap<String, u32> = BTreeMap::new();
    for p in pods.values().filter(|p| is_bound(p)) {
        if let Some(node) = node_of(p) {
            *research_per_node.entry(node.to_string()).or_default() += objects::gpus_of(p);
        }
    }
    for i in 0..GPU_NODES {
        research_per_node.entry(format!("gpu-{i}")).or_default();
    }
    let whole_replica_nodes = research_per_node
        .values()
        .filter(|used| GPUS_PER_NODE - **used >= INFERENCE_GPUS)
        .count();
    eprintln!(
        "packing: {label}: {RESEARCH_PODS} research pods bound in {:.1} s: {research_per_node:?}",
        t.elapsed().as_secs_f64()
    );

    let victims = VictimWatch::start(&client, RESEARCH_NS, STEP).await?;
    Api::<Deployment>::namespaced(client.clone(), INFERENCE_NS)
        .create(
            &PostParams::default(),
            &objects::inference_deployment("vllm", INFERENCE_REPLICAS, INFERENCE_GPUS)?,
        )
        .await?;
    wait_pods(
        c,
        INFERENCE_NS,
        "role=inference",
        INFERENCE_REPLICAS as usize,
        is_bound,
        STEP,
    )
    .await?;
    // The scheduler nominates and preempts before it binds: every victim is marked by now, but
    // the watch may still be delivering the last events; wait for the count to be stable.
    let needed = needed_victims(&research_per_node);
    let preempted = if needed > 0 {
        victims.wait_research(needed, STEP).await?
    } else {
        victims.research()
    };
    ensure!(victims.inference() == 0, "an inference pod was preempted");
    drop(victims);
    ns.check_running()?;
    drop(ns);
    drop(registration);
    binary::clean_pool(c, &[RESEARCH_NS, INFERENCE_NS]).await?;
    Ok(Layout {
        research_per_node,
        whole_replica_nodes,
        preempted,
    })
}

/// The research Job: one-GPU trainers that also ask for the CPU and memory a real trainer does
/// (a share of an 8-GPU, 64-CPU node per GPU), so that the default profile's CPU/memory scoring
/// acts as it does in production.
fn trainer_job() -> Result<Job> {
    let mut job =
        serde_json::to_value(objects::research_job("train", RESEARCH_PODS as i32, false)?)?;
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] =
        json!(TRAINER_CPU);
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] =
        json!(TRAINER_MEMORY);
    Ok(serde_json::from_value(job)?)
}

/// The fewest research pods the scale-up must preempt given the layout: replicas go to nodes
/// with room first, then each needs `INFERENCE_GPUS - free` victims on the emptiest node.
fn needed_victims(research_per_node: &BTreeMap<String, u32>) -> usize {
    let mut free: Vec<u32> = research_per_node
        .values()
        .map(|used| GPUS_PER_NODE - used)
        .collect();
    let mut needed = 0;
    for _ in 0..INFERENCE_REPLICAS {
        free.sort_unstable_by(|a, b| b.cmp(a));
        let best = free[0];
        if best >= INFERENCE_GPUS {
            free[0] -= INFERENCE_GPUS;
        } else {
            needed += (INFERENCE_GPUS - best) as usize;
            free[0] = 0;
        }
    }
    needed
}
