//! Reclaim notice on the real control plane: nightshift as deployed (`nightshift run`, with a
//! token of the base ServiceAccount: the notice's patches need no rule beyond the base's), the real
//! KEDA and HPA, the shipped vLLM example, and research pods that declare a checkpoint endpoint
//! (a test server on this machine: the pods use the host network, and kwok gives them the node's
//! address, which is this machine's).
//!
//! Load rises slowly: nightshift's demand comes within the margin of the next replica → the
//! research pod the scheduler will preempt for it gets the annotation, the condition, an Event
//! and one call of its endpoint → the load crosses the replica → KEDA → HPA → the scheduler
//! preempts. Reported: the fraction of preempted research pods that had a notice first, and the
//! lead time. Then a rise that stops short: a notice, withdrawn when the load falls back
//! (annotation removed, condition `False`), and nothing preempted.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::harness::binary::{self, Nightshift, Registration, Workspace};
use crate::harness::bounds;
use crate::harness::cluster::{Cluster, GPU_NODES, GPUS_PER_NODE};
use crate::harness::deploy::{forbidden_lines, service_account_kubeconfig, wait_webhook_active};
use crate::harness::example::{
    adapt_deployment, adapt_scaled_object, create_model_token, read_example, start_source,
    wait_hpa_desired, wait_replicas,
};
use crate::harness::objects::{self, is_running};
use crate::harness::research::{self, create_pod};
use crate::harness::victims::{self, VictimWatch};
use crate::harness::wait::{self, Check};

const INFERENCE_NS: &str = "e2e-notice";
const RESEARCH_NS: &str = "e2e-notice-research";
const INFERENCE_SELECTOR: &str = "app.kubernetes.io/name=vllm-llama";
const RESEARCH_SELECTOR: &str = "role=research";
/// GPUs per research pod and per inference replica (the example's): one replica, one victim.
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

/// A research pod of [`GPUS`] GPUs on the host network, declaring the checkpoint port.
fn research_pod(name: &str, port: u16) -> Value {
    let mut pod = research::research_pod(name, &[("role", "research")]);
    pod["metadata"]["annotations"] = json!({"nightshift.io/checkpoint-port": port.to_string()});
    pod["spec"]["hostNetwork"] = json!(true);
    pod["spec"]["terminationGracePeriodSeconds"] = json!(5);
    pod["spec"]["containers"][0]["resources"] = json!({
        "requests": {"cpu": "100m", "nvidia.com/gpu": GPUS.to_string()},
        "limits": {"nvidia.com/gpu": GPUS.to_string()},
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

/// Waits until some research pod is under notice, with its condition `True`; returns them.
async fn wait_noticed(c: &Cluster, what: &str) -> Result<BTreeMap<String, Pod>> {
    wait::until(what, STEP, || async {
        c.check_processes()?;
        let n = noticed(c).await?;
        let ready = !n.is_empty()
            && n.values()
                .all(|p| condition_of(p).as_deref() == Some("True"));
        Ok(if ready {
            Check::Done(n)
        } else {
            Check::Pending(format!("{} pods annotated", n.len()))
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

    // Research on every other GPU, one pod after the other so that their start times differ:
    // the scheduler's choice among nodes with one victim each is then the latest-started pod.
    let research = (GPU_NODES * GPUS_PER_NODE / GPUS - 1) as usize;
    for i in 0..research {
        let name = format!("train-{i}");
        create_pod(&client, RESEARCH_NS, research_pod(&name, port)).await?;
        let started = wait::until(&format!("{name} running"), STEP, || async {
            let p: Pod = Api::namespaced(client.clone(), RESEARCH_NS)
                .get(&name)
                .await?;
            Ok(match p.status.as_ref().and_then(|s| s.start_time.clone()) {
                Some(t) if is_running(&p) => Check::Done(t.0),
                _ => Check::Pending("not running".into()),
            })
        })
        .await?;
        // Start times have a one-second resolution: the next pod starts in a later second.
        wait::until("the next second", STEP, || async {
            Ok(
                if jiff::Timestamp::now().as_second() > started.as_second() {
                    Check::Done(())
                } else {
                    Check::Pending("same second".into())
                },
            )
        })
        .await?;
    }
    ensure!(
        noticed(c).await?.is_empty(),
        "no notice while demand is far from the next replica"
    );

    // Phase 1: the load rises slowly; a notice, then the preemption.
    let watch = VictimWatch::start(&client, RESEARCH_NS, STEP).await?;
    let t_rise = Instant::now();
    emu.set(0, |e| e.waiting = CLOSE);
    let first = wait_noticed(c, "a reclaim notice for the 2nd replica").await?;
    let notice_after = t_rise.elapsed();
    ensure!(
        watch.research() == 0,
        "a research pod was preempted before the load crossed the replica"
    );
    let warned: Vec<String> = first.keys().cloned().collect();
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
        with_notice == preempted.len(),
        "every preempted research pod should have had its notice first: preempted {preempted:?}, \
         warned {warned:?}"
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
    let second = wait_noticed(c, "a reclaim notice for the 3rd replica").await?;
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
