//! The spare gate on the real scheduler: research pods, marked by the webhook, bind only to nodes
//! the pool controller marked spare. Headroom nodes take inference but no research even while
//! research waits; a closed lending window stops new research binds while running research keeps
//! running; the reopened window lets the waiting pods bind.
//!
//! nightshift runs as deployed (`nightshift run`, webhook registered through the local overlay)
//! with one node's worth of headroom and two lending windows a few tens of seconds apart, given to
//! the second so that the scenario sees them close and open.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use jiff::{Timestamp, tz::TimeZone};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use crate::harness::binary::{self, SPARE};
use crate::harness::cluster::{Cluster, GPU_NODES, GPUS_PER_NODE};
use crate::harness::deploy::{deploy_with, wait_webhook_active};
use crate::harness::objects::{self, is_bound, is_running, node_of};
use crate::harness::pool::wait_marks;
use crate::harness::victims::VictimWatch;
use crate::harness::wait::{self, Check};

const RESEARCH_NS: &str = "e2e-gate-research";
const INFERENCE_NS: &str = "e2e-gate-inference";
/// How long the controllers and the scheduler get for each step (they take about a second).
const STEP: Duration = Duration::from_secs(60);
/// The first lending window stays open this long after nightshift starts: time for the open
/// phase's steps (a few seconds each here) with a wide margin for a loaded 2-core machine.
const OPEN_FOR: Duration = Duration::from_secs(90);
/// Then lending is closed this long before the second window opens: long enough to free GPUs
/// and watch that nothing binds.
const CLOSED_FOR: Duration = Duration::from_secs(40);
/// How long a "nothing binds" observation lasts: many scheduling cycles (the scheduler retries
/// unschedulable pods when the cluster changes, and at least every few seconds).
const OBSERVE: Duration = Duration::from_secs(4);
/// Research pods beyond the spare GPUs, which must wait.
const WAITING: u32 = 4;
/// GPUs freed while the window is closed: as many as wait, so that all of them fit once it
/// reopens.
const FREED: u32 = WAITING;
/// GPUs per inference replica.
const INFERENCE_GPUS: u32 = 4;

pub async fn run(cluster: Arc<Cluster>) -> Result<()> {
    let c = &*cluster;
    let result = scenario(c).await;
    result.and(binary::clean_pool(c, &[RESEARCH_NS, INFERENCE_NS]).await)
}

async fn scenario(c: &Cluster) -> Result<()> {
    let client = c.client.clone();
    objects::ensure_priority_classes(&client).await?;
    let started = Instant::now();
    let now = Timestamp::now();
    let windows = windows_around(now, OPEN_FOR, CLOSED_FOR)?;
    let extra = vec![
        format!("--pool-headroom={GPUS_PER_NODE}"),
        format!("--pool-lending-windows={windows}"),
    ];
    let (_ws, mut ns, _registration) = deploy_with(c, "nightshift-gate", &extra).await?;
    c.create_namespace(RESEARCH_NS, json!({"nightshift.io/research": "true"}))
        .await?;
    c.create_namespace(INFERENCE_NS, json!({})).await?;
    wait_webhook_active(c, RESEARCH_NS).await?;

    // Open window, headroom of one node: every node but one is marked spare.
    let marks = wait_marks(c, "3 spare nodes and 1 headroom node", |m| {
        m.values().filter(|v| v.is_some()).count() == (GPU_NODES - 1) as usize
    })
    .await?;
    let headroom = marks
        .iter()
        .find(|(_, v)| v.is_none())
        .map(|(n, _)| n.clone())
        .context("no headroom node")?;
    eprintln!("gate: lending windows {windows}; headroom node {headroom}");

    // Research asks for more GPUs than are spare: the spare GPUs fill (job "train" and job
    // "short", which is deleted later to free GPUs), the rest ("waiting") waits, and the headroom
    // node takes none of it.
    let spare_gpus = (GPU_NODES - 1) * GPUS_PER_NODE;
    let research_n = spare_gpus + WAITING;
    let research_watch = VictimWatch::start(&client, RESEARCH_NS, STEP).await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), RESEARCH_NS);
    let t = Instant::now();
    for (name, n) in [("train", spare_gpus - FREED), ("short", FREED)] {
        jobs.create(
            &PostParams::default(),
            &objects::research_job(name, n as i32, false)?,
        )
        .await?;
    }
    wait_research(c, spare_gpus as usize, spare_gpus as usize).await?;
    jobs.create(
        &PostParams::default(),
        &objects::research_job("waiting", WAITING as i32, false)?,
    )
    .await?;
    wait_research(c, spare_gpus as usize, research_n as usize).await?;
    eprintln!(
        "gate: {spare_gpus} research pods bound to spare GPUs in {:.1} s, {WAITING} waiting",
        t.elapsed().as_secs_f64()
    );
    observe_research(c, spare_gpus as usize, &headroom, "headroom kept").await?;

    // Inference takes the headroom node at once: nothing to preempt.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), INFERENCE_NS);
    let t = Instant::now();
    deployments
        .create(
            &PostParams::default(),
            &objects::inference_deployment("vllm", 1, INFERENCE_GPUS)?,
        )
        .await?;
    let inference = wait::until("the inference replica to bind", STEP, || async {
        c.check_processes()?;
        let pods = objects::pods(&client, INFERENCE_NS, "role=inference").await?;
        Ok(match pods.values().find(|p| is_bound(p)) {
            Some(p) => Check::Done(node_of(p).unwrap_or_default().to_string()),
            None => Check::Pending(format!("{} pods, none bound", pods.len())),
        })
    })
    .await?;
    ensure!(
        inference == headroom,
        "the inference replica bound to {inference}, not to the headroom node {headroom}"
    );
    ensure!(
        research_watch.research() == 0,
        "research was preempted although the headroom node was free"
    );
    eprintln!(
        "gate: inference bound to headroom node {headroom} in {:.2} s, no preemption",
        t.elapsed().as_secs_f64()
    );
    deployments.delete("vllm", &DeleteParams::default()).await?;
    ensure!(
        started.elapsed() < OPEN_FOR,
        "the open-window steps took {:.0} s, longer than the window ({OPEN_FOR:?}): the machine \
         is too slow for this scenario's timing",
        started.elapsed().as_secs_f64()
    );

    // The window closes (nightshift says so in `nightshift_pool_lending_open`), and no node is
    // marked: the spare nodes are full by now, so marks alone would not tell a closed window.
    let t = Instant::now();
    let admin = ns.admin_api();
    wait::until("the lending window to close", OPEN_FOR + STEP, || async {
        let open = admin.metric("nightshift_pool_lending_open").await?;
        Ok(if open == 0.0 {
            Check::Done(())
        } else {
            Check::Pending(format!("nightshift_pool_lending_open {open}"))
        })
    })
    .await?;
    wait_marks(c, "no spare node while the window is closed", |m| {
        m.values().all(Option::is_none)
    })
    .await?;
    let closed_at = Instant::now();
    eprintln!(
        "gate: window closed, marks gone after {:.1} s of waiting",
        t.elapsed().as_secs_f64()
    );
    // Free GPUs on the formerly spare nodes (job "short" ends), while the research still
    // running keeps running and the waiting pods keep waiting.
    jobs.delete("short", &DeleteParams::background()).await?;
    let still_bound = (spare_gpus - FREED) as usize;
    wait_research(c, still_bound, still_bound + WAITING as usize).await?;
    observe_research(c, still_bound, &headroom, "window closed").await?;
    let running = research_pods(c)
        .await?
        .values()
        .filter(|p| is_running(p))
        .count();
    ensure!(
        running == still_bound,
        "{running} research pods running while the window is closed, expected {still_bound}"
    );
    ensure!(
        closed_at.elapsed() < CLOSED_FOR,
        "the closed-window steps outlasted the closed window ({CLOSED_FOR:?})"
    );
    eprintln!("gate: window closed: {FREED} GPUs freed, no research pod bound to them");

    // The second window opens: the freed GPUs are lent again and the waiting pods take them.
    let t = Instant::now();
    wait_research_within(
        c,
        spare_gpus as usize,
        spare_gpus as usize,
        CLOSED_FOR + STEP,
    )
    .await?;
    eprintln!(
        "gate: window reopened: waiting research bound again after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    observe_research(c, spare_gpus as usize, &headroom, "reopened").await?;
    ensure!(
        research_watch.research() == 0,
        "research was preempted in a scenario without inference pressure"
    );
    ns.check_running()
}

/// `HH:MM:SS-HH:MM:SS@UTC,HH:MM:SS-HH:MM:SS@UTC`: a window open since an hour ago that closes
/// `open_for` from `now`, and one that opens `closed_for` later and stays open for an hour.
fn windows_around(now: Timestamp, open_for: Duration, closed_for: Duration) -> Result<String> {
    let at = |offset: i64| -> Result<String> {
        let t = now.checked_add(jiff::SignedDuration::from_secs(offset))?;
        Ok(t.to_zoned(TimeZone::UTC)
            .time()
            .strftime("%H:%M:%S")
            .to_string())
    };
    let open = i64::try_from(open_for.as_secs())?;
    let reopen = open + i64::try_from(closed_for.as_secs())?;
    Ok(format!(
        "{}-{}@UTC,{}-{}@UTC",
        at(-3600)?,
        at(open)?,
        at(reopen)?,
        at(reopen + 3600)?
    ))
}

async fn research_pods(c: &Cluster) -> Result<BTreeMap<String, Pod>> {
    objects::pods(&c.client, RESEARCH_NS, "role=research").await
}

/// Waits until `bound` research pods are bound and `total` exist (the rest waiting).
async fn wait_research(c: &Cluster, bound: usize, total: usize) -> Result<()> {
    wait_research_within(c, bound, total, STEP).await
}

async fn wait_research_within(
    c: &Cluster,
    bound: usize,
    total: usize,
    timeout: Duration,
) -> Result<()> {
    wait::until(
        &format!("{bound} of {total} research pods bound"),
        timeout,
        || async {
            c.check_processes()?;
            let pods = research_pods(c).await?;
            let live: Vec<&Pod> = pods
                .values()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let n_bound = live.iter().filter(|p| is_bound(p)).count();
            Ok(if n_bound == bound && live.len() == total {
                Check::Done(())
            } else {
                Check::Pending(format!("{n_bound} bound of {}", live.len()))
            })
        },
    )
    .await
}

/// Watches the research pods for [`OBSERVE`]: exactly `bound` stay bound, none on `headroom`,
/// and every bound one carries the webhook's spare gate. A bounded observation, not a sleep: it
/// fails at the first pod that binds where it must not.
async fn observe_research(c: &Cluster, bound: usize, headroom: &str, phase: &str) -> Result<()> {
    let until = Instant::now() + OBSERVE;
    while Instant::now() < until {
        c.check_processes()?;
        let pods = research_pods(c).await?;
        let live: Vec<&Pod> = pods
            .values()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let on_headroom: Vec<&str> = live
            .iter()
            .filter(|p| node_of(p) == Some(headroom))
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        ensure!(
            on_headroom.is_empty(),
            "{phase}: research pods bound to the headroom node {headroom}: {on_headroom:?}"
        );
        let n_bound = live.iter().filter(|p| is_bound(p)).count();
        ensure!(
            n_bound == bound,
            "{phase}: {n_bound} research pods bound, expected {bound} with the rest waiting"
        );
        for p in &live {
            let text = serde_json::to_string(&p.spec)?;
            ensure!(
                text.contains(SPARE),
                "{phase}: research pod {:?} lacks the spare gate",
                p.metadata.name
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}
