//! Reclaim notice on the real control plane: nightshift as deployed (`nightshift run`, with a
//! token of the base ServiceAccount: the notice's patches need no rule beyond the base's), the real
//! KEDA and HPA, the shipped vLLM example, and research pods that declare a checkpoint endpoint
//! (a test server on this machine: the pods use the host network, and kwok gives them the node's
//! address, which is this machine's).
//!
//! Eight research pods fill every other GPU, each on a node chosen by the scenario, started one
//! after another, the two oldest in a lower research class (`research-scavenger`, 2 GPUs each, on
//! one node beside a 4-GPU research pod): the scheduler's victims for the next replica are then
//! those two, decided by the class within the node and between nodes, and neither by the fewest
//! victims nor by the latest start. Load rises slowly: nightshift's demand comes within the
//! margin of the next replica → the research pods the scheduler will preempt for it get the
//! annotation, the condition, an Event and one call of their endpoint → the load crosses the
//! replica → KEDA → HPA → the scheduler preempts. The pods warned must be exactly the pods
//! preempted (printed as a confusion table: warned and preempted, warned only, preempted only),
//! and the simulator's scheduler model, run on the cluster's state, must name them too. Reported
//! as well: the lead time. Then a rise that stops short: a notice, withdrawn when the load falls
//! back (annotation removed, condition `False`), and nothing preempted.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::harness::binary::{self, Nightshift, Registration, Workspace};
use crate::harness::bounds;
use crate::harness::cluster::{Cluster, GPU_NODES};
use crate::harness::deploy::{forbidden_lines, service_account_kubeconfig, wait_webhook_active};
use crate::harness::example::{
    adapt_deployment, adapt_scaled_object, create_model_token, read_example, start_source,
    wait_hpa_desired, wait_replicas,
};
use crate::harness::model::{self, Choice};
use crate::harness::objects::{
    self, INFERENCE_VALUE, RESEARCH_CLASS, RESEARCH_VALUE, SCAVENGER_CLASS, SCAVENGER_VALUE,
    is_running,
};
use crate::harness::research::{self, create_started};
use crate::harness::victims::{self, VictimWatch};
use crate::harness::wait::{self, Check};

const INFERENCE_NS: &str = "e2e-notice";
const RESEARCH_NS: &str = "e2e-notice-research";
const INFERENCE_SELECTOR: &str = "app.kubernetes.io/name=vllm-llama";
const RESEARCH_SELECTOR: &str = "role=research";
/// GPUs per inference replica (the example's).
const GPUS: u32 = 4;
/// Queue lengths. Demand = waiting / 5 (the example's `waitingTarget`) replicas; with a margin of
/// 0.5 a service at 1 replica warns for its 2nd from demand 0.5 on; the HPA asks for the 2nd above
/// 1.0 (past its 10 % tolerance).
const QUIET: f64 = 2.0; // 0.4: no notice
const CLOSE: f64 = 3.0; // 0.6: notice for the 2nd replica
const OVER: f64 = 6.0; // 1.2: 2 replicas → preemption; no notice for a 3rd (1.7 < 2)
const SHORT: f64 = 8.0; // 1.6 at 2 replicas: notice for the 3rd, the HPA stays at 2
/// The window of demand peaks, shortened from 10 minutes so a withdrawal follows in seconds.
const WINDOW: &str = "2s";
/// A port nothing listens on, for the webhook URL until nightshift reports its own (no research
/// pod is created in between).
const PLACEHOLDER_PORT: u16 = 9;
/// Deadline of each step; far above the seconds each takes, for a loaded 2-core machine.
const STEP: Duration = Duration::from_secs(120);

pub async fn run(cluster: Arc<Cluster>) -> Result<()> {
    let c = &*cluster;
    let dir = tempfile::Builder::new()
        .prefix("nightshift-e2e-notice-")
        .tempdir()?;
    let result = scenario(c, dir.path()).await;
    binary::delete_namespaces_now(c, &[INFERENCE_NS, RESEARCH_NS]).await?;
    result
}

/// Checkpoint calls received, by pod (`namespace/name` from the body).
type Calls = Arc<Mutex<BTreeMap<String, usize>>>;

/// A checkpoint endpoint on this machine's address (where kwok puts host-network pods).
async fn hook_server() -> Result<(u16, Calls, tokio::task::JoinHandle<()>)> {
    let ip = crate::harness::process::host_ip()?;
    let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
    let port = listener.local_addr()?.port();
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let app = axum::Router::new().route(
        "/checkpoint",
        axum::routing::post(move |body: axum::Json<Value>| {
            let seen = seen.clone();
            async move {
                let pod = body["pod"].as_str().unwrap_or("?").to_string();
                if let Ok(mut s) = seen.lock() {
                    *s.entry(pod).or_default() += 1;
                }
                axum::http::StatusCode::ACCEPTED
            }
        }),
    );
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((port, calls, task))
}

/// A research pod of `gpus` GPUs on the host network, declaring the checkpoint port, that only
/// `node` may take (its hostname label; the webhook adds the pool's requirements beside it).
fn research_pod(name: &str, port: u16, gpus: u32, node: &str) -> Value {
    let mut pod = research::research_pod(name, &[("role", "research")]);
    pod["metadata"]["annotations"] = json!({"nightshift.io/checkpoint-port": port.to_string()});
    pod["spec"]["hostNetwork"] = json!(true);
    pod["spec"]["terminationGracePeriodSeconds"] = json!(5);
    pod["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    pod["spec"]["containers"][0]["resources"] = json!({
        "requests": {"cpu": "100m", "nvidia.com/gpu": gpus.to_string()},
        "limits": {"nvidia.com/gpu": gpus.to_string()},
    });
    pod
}

fn notice_of(p: &Pod) -> Option<String> {
    p.metadata
        .annotations
        .as_ref()?
        .get("nightshift.io/reclaim-notice")
        .cloned()
}

fn condition_of(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "nightshift.io/ReclaimNotice")
        .map(|c| c.status.clone())
}

/// Research pods under notice now, by name.
async fn noticed(c: &Cluster) -> Result<BTreeMap<String, Pod>> {
    Ok(objects::pods(&c.client, RESEARCH_NS, RESEARCH_SELECTOR)
        .await?
        .into_iter()
        .filter(|(_, p)| notice_of(p).is_some() && p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// Waits until some research pods are under notice, with their condition `True`, and they are
/// all the pods nightshift counts under notice (one pass may warn several, delivered one after
/// another); returns them.
async fn wait_noticed(
    c: &Cluster,
    nightshift: &Nightshift,
    what: &str,
) -> Result<BTreeMap<String, Pod>> {
    wait::until(what, STEP, || async {
        c.check_processes()?;
        let n = noticed(c).await?;
        let out = nightshift
            .metric("nightshift_pool_reclaim_notices_out")
            .await?;
        let ready = !n.is_empty()
            && n.len() as f64 == out
            && n.values()
                .all(|p| condition_of(p).as_deref() == Some("True"));
        Ok(if ready {
            Check::Done(n)
        } else {
            Check::Pending(format!("{} pods annotated, {out} under notice", n.len()))
        })
    })
    .await
}

async fn scenario(c: &Cluster, dir: &Path) -> Result<()> {
    let client = c.client.clone();
    c.keda().await?;
    let (emu, prom) = start_source(dir, INFERENCE_NS, QUIET).await?;
    let extra = [
        format!("--scaler-allowed-prometheus={}", prom.address()),
        "--scaler-allow-loopback".to_string(),
        format!("--pool-notice-window={WINDOW}"),
        // The scenario's queue lengths are chosen for this margin and hysteresis (the defaults
        // are tuned in the simulator and may move).
        "--pool-notice-margin=0.5".to_string(),
        "--pool-notice-hysteresis=0.25".to_string(),
    ];
    // The lower research class exists before nightshift starts, so that its webhook knows it
    // and keeps it on the pods that ask for it.
    objects::ensure_scavenger_class(&client).await?;
    // Under the base ServiceAccount's token: the notice needs no rule beyond the base's.
    let ws = Workspace::new()?;
    let _registration = Registration::new(c);
    ws.apply_local_overlay(c, PLACEHOLDER_PORT)?;
    let kubeconfig = service_account_kubeconfig(c, &ws)?;
    let mut nightshift =
        Nightshift::start_with(c, "nightshift-notice", &kubeconfig, &ws.certs(), 0, &extra).await?;
    ws.apply_local_overlay(c, nightshift.webhook.port())?;
    nightshift.wait_ready().await?;
    c.create_namespace(RESEARCH_NS, json!({"nightshift.io/research": "true"}))
        .await?;
    c.create_namespace(INFERENCE_NS, json!({})).await?;
    wait_webhook_active(c, RESEARCH_NS).await?;
    let (port, calls, _server) = hook_server().await?;

    // The example, one replica.
    create_model_token(c, INFERENCE_NS)?;
    let deployment = adapt_deployment(read_example("deployment.yaml")?, INFERENCE_NS)?;
    let mut so = adapt_scaled_object(
        read_example("scaledobject.yaml")?,
        INFERENCE_NS,
        &nightshift.scaler.to_string(),
        &prom.address(),
    )?;
    so["spec"]["pollingInterval"] = json!(1);
    for object in [&deployment, &so] {
        binary::kubectl_ok(c, &["apply", "-f", "-"], Some(&object.to_string()))?;
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), INFERENCE_NS);
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), INFERENCE_NS);
    wait_hpa_desired(c, &hpas, 1).await?;
    wait_replicas(c, &deployments, 1).await?;
    victims::wait_pods(c, INFERENCE_NS, INFERENCE_SELECTOR, 1, is_running, STEP).await?;

    // Research on every other GPU, one pod after the other so that their start times differ,
    // each on a node of its own choosing (`serving` is the node the first replica runs on):
    //   other[0]: train-0, train-1 (2 GPUs each, the lower class), train-2 (4 GPUs)
    //   serving: train-3; other[1]: train-4, train-5; other[2]: train-6, train-7 (4 GPUs each)
    // For the 2nd replica (4 GPUs) the scheduler removes the two oldest pods, both of the lower
    // class, and keeps train-2. A predictor that preferred the fewest victims would name one
    // pod of 4 GPUs; one that ranked by start alone, train-7; one that reprieved by start before
    // class, train-2 on other[0] and then train-7 by the node ranking.
    let serving = objects::pods(&client, INFERENCE_NS, INFERENCE_SELECTOR)
        .await?
        .values()
        .find_map(|p| objects::node_of(p).map(str::to_string))
        .context("the first inference replica is bound to no node")?;
    let other: Vec<String> = (0..GPU_NODES)
        .map(|i| format!("gpu-{i}"))
        .filter(|n| *n != serving)
        .collect();
    ensure!(
        other.len() == 3,
        "the first replica runs on {serving}, outside the pool's nodes {other:?}"
    );
    let layout: [(&str, u32, &str); 8] = [
        (SCAVENGER_CLASS, 2, &other[0]),
        (SCAVENGER_CLASS, 2, &other[0]),
        (RESEARCH_CLASS, 4, &other[0]),
        (RESEARCH_CLASS, 4, &serving),
        (RESEARCH_CLASS, 4, &other[1]),
        (RESEARCH_CLASS, 4, &other[1]),
        (RESEARCH_CLASS, 4, &other[2]),
        (RESEARCH_CLASS, 4, &other[2]),
    ];
    for (i, (class, gpus, node)) in layout.iter().enumerate() {
        let name = format!("train-{i}");
        let mut pod = research_pod(&name, port, *gpus, node);
        if *class == SCAVENGER_CLASS {
            pod["spec"]["priorityClassName"] = json!(SCAVENGER_CLASS);
        }
        let stored = create_started(&client, RESEARCH_NS, pod, STEP).await?;
        let p = research::get_pod(&client, RESEARCH_NS, &name).await?;
        let priority = p.spec.as_ref().and_then(|s| s.priority);
        let want = if *class == SCAVENGER_CLASS {
            SCAVENGER_VALUE
        } else {
            RESEARCH_VALUE
        };
        ensure!(
            priority == Some(want),
            "{name}: priority {priority:?}, expected {want} (the webhook keeps a lower research \
             class)"
        );
        ensure!(
            objects::node_of(&p) == Some(*node),
            "{name} started {stored} on {:?}, not on {node}",
            objects::node_of(&p)
        );
    }
    ensure!(
        noticed(c).await?.is_empty(),
        "no notice while demand is far from the next replica"
    );

    // Phase 1: the load rises slowly; a notice, then the preemption.
    let watch = VictimWatch::start(&client, RESEARCH_NS, STEP).await?;
    let t_rise = Instant::now();
    emu.set(0, |e| e.waiting = CLOSE);
    let first = wait_noticed(c, &nightshift, "a reclaim notice for the 2nd replica").await?;
    let notice_after = t_rise.elapsed();
    ensure!(
        watch.research() == 0,
        "a research pod was preempted before the load crossed the replica"
    );
    let warned: Vec<String> = first.keys().cloned().collect();
    // The simulator's scheduler model on the cluster as it stands, for the same replica: a third
    // opinion beside the predictor's and the real scheduler's.
    let nodes: Vec<String> = (0..GPU_NODES).map(|i| format!("gpu-{i}")).collect();
    let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let view = model::read(&client, &nodes).await?;
    let modelled: Vec<String> = match view.schedule(GPUS, INFERENCE_VALUE) {
        Choice::Preempt { victims, .. } => victims
            .iter()
            .filter_map(|v| v.strip_prefix(&format!("{RESEARCH_NS}/")))
            .map(str::to_string)
            .collect(),
        other => bail!("the 2nd replica must preempt; the model decides {other:?}"),
    };
    let layout = view.describe(view.earliest());
    // The notice names the service whose scale-up it foretells, for the Preempted Event to come.
    let service = first
        .values()
        .find_map(|p| {
            p.metadata
                .annotations
                .as_ref()?
                .get("nightshift.io/reclaim-notice-service")
                .cloned()
        })
        .ok_or_else(|| anyhow!("no warned pod names the service its notice is for"))?;
    ensure!(
        service.starts_with(&format!("{INFERENCE_NS}/")),
        "the notice names {service:?}, not a ScaledObject of {INFERENCE_NS}"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), RESEARCH_NS);
    wait::until("the ReclaimNotice Event", STEP, || async {
        let list = events.list(&ListParams::default()).await?;
        let found = list.items.iter().any(|e| {
            e.reason.as_deref() == Some("ReclaimNotice")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&warned[0])
        });
        Ok(if found {
            Check::Done(())
        } else {
            Check::Pending("no Event yet".into())
        })
    })
    .await?;
    emu.set(0, |e| e.waiting = OVER);
    wait_hpa_desired(c, &hpas, 2).await?;
    watch.wait_research(1, STEP).await?;
    let lead = t_rise.elapsed().saturating_sub(notice_after);
    victims::wait_pods(c, INFERENCE_NS, INFERENCE_SELECTOR, 2, is_running, STEP).await?;
    let preempted = watch.research_names();
    let with_notice = preempted.iter().filter(|p| warned.contains(p)).count();
    // The predictor measured against the real scheduler: whom it warned and whom the scheduler
    // took, for the same replica.
    let both: Vec<&String> = warned.iter().filter(|w| preempted.contains(w)).collect();
    let spared: Vec<&String> = warned.iter().filter(|w| !preempted.contains(w)).collect();
    let unwarned: Vec<&String> = preempted.iter().filter(|p| !warned.contains(p)).collect();
    eprintln!(
        "notice: the 2nd replica over {} research pods in 2 classes on {} nodes ({layout}): \
         warned and preempted {both:?}; warned, not preempted {spared:?}; preempted unwarned \
         {unwarned:?}; the simulator's scheduler model: {modelled:?}",
        view.nodes
            .iter()
            .flat_map(|n| &n.pods)
            .filter(|p| p.priority < INFERENCE_VALUE)
            .count(),
        nodes.len(),
    );
    eprintln!(
        "notice: notice {:.2} s after the load came close; preempted {} research pod(s), {} of \
         them warned first ({:.0} %); lead time notice → preemption ≈ {:.1} s",
        notice_after.as_secs_f64(),
        preempted.len(),
        with_notice,
        100.0 * with_notice as f64 / preempted.len().max(1) as f64,
        lead.as_secs_f64()
    );
    bounds::NEAR_REPLICA_TO_NOTICE.check(notice_after)?;
    ensure!(
        spared.is_empty() && unwarned.is_empty() && !both.is_empty(),
        "the notice should name exactly the research pods the scheduler preempts: preempted \
         {preempted:?}, warned {warned:?}"
    );
    ensure!(
        modelled == preempted,
        "the simulator's scheduler model would preempt {modelled:?}, kube-scheduler took \
         {preempted:?}"
    );
    // nightshift counts a preemption when its own watch sees the pod go, which may come after
    // this test's watch saw it.
    wait::until(
        &format!(
            "nightshift counting {} preemption(s) with notice",
            preempted.len()
        ),
        STEP,
        || async {
            let noticed = nightshift
                .metric("nightshift_pool_preempted_research_pods_total{noticed=\"true\"}")
                .await?;
            Ok(if noticed >= preempted.len() as f64 {
                Check::Done(())
            } else {
                Check::Pending(format!("{noticed} counted"))
            })
        },
    )
    .await?;
    // Its Preempted Event names the service that took the GPUs.
    let taken_by = format!("Preempted by the scheduler for inference service {service} (");
    wait::until("a Preempted Event naming the service", STEP, || async {
        let list = events.list(&ListParams::default()).await?;
        let found = list.items.iter().any(|e| {
            e.reason.as_deref() == Some("Preempted")
                && e.note.as_deref().is_some_and(|n| n.starts_with(&taken_by))
                && e.regarding
                    .as_ref()
                    .and_then(|r| r.name.as_ref())
                    .is_some_and(|n| preempted.contains(n))
        });
        Ok(if found {
            Check::Done(())
        } else {
            Check::Pending(format!("no Event saying {taken_by:?}"))
        })
    })
    .await?;

    // Phase 2: a rise that stops short: a notice, then withdrawn; nothing preempted.
    let before = watch.research();
    emu.set(0, |e| e.waiting = SHORT);
    let second = wait_noticed(c, &nightshift, "a reclaim notice for the 3rd replica").await?;
    let t_fall = Instant::now();
    emu.set(0, |e| e.waiting = OVER);
    let names: Vec<String> = second.keys().cloned().collect();
    let pods: Api<Pod> = Api::namespaced(client.clone(), RESEARCH_NS);
    wait::until("the notice withdrawn", STEP, || async {
        c.check_processes()?;
        let mut standing = Vec::new();
        for n in &names {
            let p = pods.get(n).await?;
            if notice_of(&p).is_some() || condition_of(&p).as_deref() != Some("False") {
                standing.push(n.clone());
            }
        }
        Ok(if standing.is_empty() {
            Check::Done(())
        } else {
            Check::Pending(format!("still under notice: {standing:?}"))
        })
    })
    .await?;
    ensure!(
        watch.research() == before,
        "a rise that stopped short preempted research"
    );
    ensure!(
        deployments
            .get("vllm-llama")
            .await?
            .spec
            .and_then(|s| s.replicas)
            == Some(2),
        "the HPA should have stayed at 2 replicas"
    );

    // The endpoint: one call per notice.
    let calls = calls.lock().map_err(|_| anyhow!("poisoned"))?.clone();
    for pod in warned.iter().chain(&names) {
        let key = format!("{RESEARCH_NS}/{pod}");
        ensure!(
            calls.get(&key) == Some(&1),
            "{key}: {:?} checkpoint calls, expected exactly one (all: {calls:?})",
            calls.get(&key)
        );
    }
    eprintln!(
        "notice: stop-short notice on {names:?} withdrawn {:.2} s after the load fell back; \
         nothing preempted; checkpoint calls {calls:?}",
        t_fall.elapsed().as_secs_f64()
    );
    nightshift
        .check_running()
        .context("nightshift after the notice scenario")?;
    let refused = forbidden_lines(&nightshift);
    ensure!(
        refused.is_empty(),
        "nightshift under the ServiceAccount was refused API calls:\n{}",
        refused.join("\n")
    );
    Ok(())
}
