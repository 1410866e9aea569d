//! The researchers' view as people and scripts use it: the page and `/api/view` of the view
//! router over a controller loaded with a fixture pool, through `oneshot` calls, over loopback
//! HTTP, and in a real headless Chromium ([`browser`]).

use nightshift::test_support::prometheus_bin;

mod browser;
mod prometheus;

use std::sync::{Arc, Mutex};

use axum::{body::Body, http::Request};
use jiff::Timestamp;
use kube::runtime::watcher;
use nightshift::{
    core::vocabulary::{RECLAIM_NOTICE_ANNOTATION, RECLAIM_NOTICE_SERVICE_ANNOTATION, Vocabulary},
    pool::{
        controller::{Controller, LendingPolicy, Metrics},
        history::Sample,
        windows::Windows,
    },
    scaler::explain::Explanation,
    test_support::fixtures::{node, pod},
    view::{self, ViewState, model::View},
};
use tower::ServiceExt;

/// The fixture pool: 4 nodes × 8 GPUs, one of them held as headroom (`--pool-headroom 8`).
/// gpu-a: 4 inference + 2 research (team-a), 2 free; gpu-b: 6 + 2 research (team-b), the 2 of
/// a pod just preempted and not gone yet; gpu-c: free, the headroom node; gpu-d: 8 inference.
/// team-a has one pod waiting.
/// A day of samples, a minute apart, fills the charts.
pub fn controller() -> Arc<Mutex<Controller>> {
    controller_at(Timestamp::now())
}

/// The scaler's decision for inference/llama at `at`: `demand` replicas, read from as many
/// pods as it rounds up to.
fn decision(at: Timestamp, demand: f64) -> Explanation {
    Explanation {
        namespace: "inference".into(),
        name: "llama".into(),
        at,
        source: "pods of service llama-vllm".into(),
        pods: Some(demand.ceil() as usize),
        terms: Vec::new(),
        driver: Some("waiting"),
        replicas: Some(demand),
        metric_value: Some(demand * 100.0),
        active: Some(true),
        activation_threshold: 0.0,
        error: None,
        forecast: None,
        capacity: None,
    }
}

/// The fixture pool with a view over it, whose history started a day ago, and the scaler's
/// decisions for inference/llama sampled every 5 minutes over the last day: demand swings
/// around 2.5 replicas (1 to 4) with the replicas following it; now it is 2.5 with 3 serving.
pub fn state() -> ViewState {
    let now = Timestamp::now();
    let day = jiff::SignedDuration::from_hours(24);
    // The page's clock stays at the fixture's now: its charts' 5-minute steps are placed from
    // it, so a second ticking over between building the fixture and asking would move them.
    let state = ViewState::new(controller_at(now), now.checked_sub(day).expect("ts"))
        .with_clock(move || now);
    for m in (0..24 * 60 / 5).rev() {
        let at = now
            .checked_sub(jiff::SignedDuration::from_mins(m * 5))
            .expect("ts");
        let demand = 2.5 + 1.5 * (m as f64 * 5.0 / 1440.0 * std::f64::consts::TAU).sin();
        state.sample(&[decision(at, demand)], at);
    }
    state
}

fn controller_at(now: Timestamp) -> Arc<Mutex<Controller>> {
    let mut c = Controller::new(
        LendingPolicy {
            vocabulary: Vocabulary::default(),
            headroom: 8,
            windows: Windows::default(),
        },
        Metrics::default(),
    );
    c.on_node_event(watcher::Event::Init);
    for n in ["gpu-a", "gpu-b", "gpu-c", "gpu-d"] {
        c.on_node_event(watcher::Event::InitApply(node(n, 8).build()));
    }
    c.on_node_event(watcher::Event::InitDone);
    c.on_pod_event(watcher::Event::Init, now);
    for p in [
        pod("inference", "vllm-0").on("gpu-a").gpus(4),
        pod("inference", "vllm-1").on("gpu-d").gpus(8),
        pod("team-a", "sft-step-3").on("gpu-a").gpus(2).research(),
        pod("team-a", "eval-7").unbound().gpus(2).research(),
        pod("team-b", "rl-run-1").on("gpu-b").gpus(6).research(),
    ] {
        c.on_pod_event(watcher::Event::InitApply(p.build()), now);
    }
    c.on_pod_event(watcher::Event::InitDone, now);
    c.set_leader(true);
    let started = now
        .checked_sub(jiff::SignedDuration::from_secs(7200))
        .expect("ts");
    let warned = now
        .checked_sub(jiff::SignedDuration::from_secs(90))
        .expect("ts");
    let rl = pod("team-b", "rl-run-2")
        .on("gpu-b")
        .gpus(2)
        .research()
        .started(started)
        .annotation(RECLAIM_NOTICE_ANNOTATION, &warned.to_string())
        .annotation(RECLAIM_NOTICE_SERVICE_ANNOTATION, "inference/llama");
    c.on_pod_event(watcher::Event::Apply(rl.clone().build()), now);
    c.on_pod_event(
        watcher::Event::Apply(rl.disrupted("PreemptionByScheduler", now).build()),
        now,
    );
    let day = 24 * 60;
    for i in 0..day {
        // Research rises at night: a smooth, recognisable shape.
        let research = (8.0 + 4.0 * (i as f64 / day as f64 * std::f64::consts::TAU).sin()) as u32;
        c.record_sample(Sample {
            at: now.as_second() - (day - i) * 60,
            inference: 12,
            research,
            free: 12 - research.min(12),
            headroom: 8,
        });
    }
    // Two hours of lending: team-a 2 GPUs × 2 h, team-b 8 GPUs × 2 h.
    let t0 = tokio::time::Instant::now();
    c.reconcile(now, t0);
    c.reconcile(now, t0 + std::time::Duration::from_secs(7200));
    Arc::new(Mutex::new(c))
}

async fn get(path: &str) -> (u16, String, String) {
    let response = view::router(state())
        .oneshot(Request::get(path).body(Body::empty()).expect("request"))
        .await
        .expect("response");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = axum::body::to_bytes(response.into_body(), 1 << 24)
        .await
        .expect("body");
    (
        status,
        content_type,
        String::from_utf8(body.to_vec()).expect("utf-8"),
    )
}

#[tokio::test]
async fn the_page_shows_the_pool_research_and_preemptions_of_the_fixture() {
    let (status, content_type, html) = get("/").await;
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/html"), "{content_type}");
    for expected in [
        "Inference GPUs<b>12</b>",
        "Research GPUs<b>10</b>",
        "Headroom GPUs<b>8</b>",
        "Free GPUs<b>2</b>",
        "Nodes<b>4</b>",
        "32 GPUs in all.",
        "<a href=\"?namespace=team-a\">team-a</a>",
        "rl-run-2",
        "PreemptionByScheduler",
        "<td>inference/llama</td>",
        "2h0m",
        "Last 24 hours",
        "holds 1441 samples since",
        "History since restart at",
        "data-service=\"inference/llama\"",
        "demand <span class=\"demand\">2.5</span>, replicas <span class=\"replicas\">3.0</span>",
    ] {
        assert!(html.contains(expected), "{expected} missing in the page");
    }
}

#[tokio::test]
async fn the_json_holds_the_same_figures_for_scripts() {
    let (status, content_type, body) = get("/api/view").await;
    assert_eq!(status, 200);
    assert_eq!(content_type, "application/json");
    let v: View = serde_json::from_str(&body).expect("view JSON");
    assert_eq!(
        (
            v.pool.gpus.inference,
            v.pool.gpus.research,
            v.pool.gpus.free,
            v.pool.gpus.headroom
        ),
        (12, 10, 2, 8)
    );
    let team_b = v
        .namespaces
        .iter()
        .find(|n| n.namespace == "team-b")
        .expect("team-b");
    assert_eq!(v.preemptions[0].service.as_deref(), Some("inference/llama"));
    assert_eq!(v.preemptions[0].warned_seconds, Some(90));
    // The preempted pod holds its GPUs until it is gone, as the scheduler counts.
    assert_eq!((team_b.gpus_now, team_b.preemptions), (8, 1));
    assert_eq!(
        team_b.gpu_hours_lost, 4.0,
        "2 GPUs × 2 h without checkpoint"
    );
    let team_a = v
        .namespaces
        .iter()
        .find(|n| n.namespace == "team-a")
        .expect("team-a");
    assert_eq!((team_a.gpus_now, team_a.waiting_pods), (2, 1));
    assert_eq!(v.preemptions.len(), 1);
    assert_eq!(
        v.charts.day.len(),
        288,
        "24 h of 5-minute points, the last ending now"
    );
    assert!(v.charts.week.len() >= 24);
    let llama = &v.charts.services[0];
    assert_eq!(
        (llama.namespace.as_str(), llama.name.as_str()),
        ("inference", "llama")
    );
    assert!(
        (24..=25).contains(&llama.week.len()),
        "a day of hourly means"
    );
    let latest = llama.latest.expect("latest");
    assert_eq!((latest.demand, latest.replicas), (2.5, 3.0));
    assert!(llama.week.iter().all(|p| (1.0..=4.0).contains(&p.demand)));
}

#[tokio::test]
async fn the_namespace_filter_narrows_research_to_one_namespace() {
    let (_, _, body) = get("/api/view?namespace=team-a").await;
    let v: View = serde_json::from_str(&body).expect("view JSON");
    assert_eq!(v.namespace.as_deref(), Some("team-a"));
    let names: Vec<&str> = v.namespaces.iter().map(|n| n.namespace.as_str()).collect();
    assert_eq!(names, ["team-a"]);
    assert!(v.preemptions.is_empty(), "team-a was not preempted");
    assert_eq!(v.pool.gpus.total(), 32, "the pool stays whole");
    let (_, _, html) = get("/?namespace=team-a").await;
    assert!(html.contains("research of team-a"));
    assert!(!html.contains("rl-run-2"));
    let (_, _, all) = get("/?namespace=").await;
    assert!(
        all.contains("rl-run-2"),
        "an empty filter shows every namespace"
    );
}
