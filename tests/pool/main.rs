//! The pool's status over real HTTP: `/status` served by the admin router on a loopback port,
//! read back by the library client and by the `nightshift status --from` command.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use jiff::Timestamp;
use kube::runtime::watcher;
use nightshift::{
    core::vocabulary::Vocabulary,
    pool::{
        controller::{Controller, LendingPolicy, Metrics},
        report, run,
        windows::Windows,
    },
    test_support::fixtures::{node, pod},
};
use tokio_util::sync::CancellationToken;

/// Serves `router` on 127.0.0.1:0 until dropped.
struct Server {
    url: String,
    stop: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn serve(router: axum::Router) -> Server {
    let listener = nightshift::runtime::admin::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let stop = CancellationToken::new();
    tokio::spawn(nightshift::runtime::admin::serve(
        listener,
        router,
        stop.clone(),
    ));
    Server { url, stop }
}

fn controller() -> Arc<Mutex<Controller>> {
    let now = Timestamp::now();
    let mut c = Controller::new(
        LendingPolicy {
            vocabulary: Vocabulary::default(),
            headroom: 4,
            windows: Windows::default(),
        },
        Metrics::default(),
    );
    c.on_node_event(watcher::Event::Init);
    for n in [
        node("gpu-a", 8),
        node("gpu-b", 8),
        node("gpu-c", 8).cordoned(),
    ] {
        c.on_node_event(watcher::Event::InitApply(n.build()));
    }
    c.on_node_event(watcher::Event::InitDone);
    c.on_pod_event(watcher::Event::Init, now);
    for p in [
        pod("inference", "vllm-0").on("gpu-a").gpus(4),
        pod("research", "sft-step-3").on("gpu-a").gpus(2).research(),
        pod("research", "eval-7").unbound().gpus(2).research(),
    ] {
        c.on_pod_event(watcher::Event::InitApply(p.build()), now);
    }
    c.on_pod_event(watcher::Event::InitDone, now);
    let rl = pod("research", "rl-run-2").on("gpu-b").gpus(4).research();
    c.on_pod_event(watcher::Event::Apply(rl.clone().build()), now);
    c.on_pod_event(
        watcher::Event::Apply(rl.disrupted("PreemptionByScheduler", now).build()),
        now,
    );
    c.set_leader(true);
    c.reconcile(now, tokio::time::Instant::now());
    Arc::new(Mutex::new(c))
}

#[tokio::test]
async fn status_is_served_as_json_and_read_back_unchanged() {
    let server = serve(run::status_routes(controller())).await;
    let report = report::report_from_server(&server.url)
        .await
        .expect("status");
    assert_eq!(report.nodes.len(), 3);
    assert_eq!(report.leader, Some(true));
    assert_eq!(report.totals.lent, 6);
    assert_eq!(report.research_pods.len(), 3);
    assert_eq!(report.recent_disruptions.len(), 1);
    assert_eq!(report.recent_disruptions[0].reason, "PreemptionByScheduler");
    let gpu_b = report
        .nodes
        .iter()
        .find(|n| n.name == "gpu-b")
        .expect("gpu-b");
    assert_eq!(gpu_b.free, 4);
}

#[tokio::test]
async fn status_of_a_controller_that_is_off_is_a_clear_503() {
    let server = serve(run::off_routes()).await;
    let err = report::report_from_server(&server.url)
        .await
        .expect_err("off");
    let msg = err.to_string();
    assert!(
        msg.contains("503") && msg.contains("no Kubernetes cluster"),
        "{msg}"
    );
}

async fn run_status_command(url: &str) -> std::process::Output {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .args(["status", "--from", url])
        .kill_on_drop(true)
        .output();
    // Bounded: the command answers in milliseconds on loopback.
    tokio::time::timeout(Duration::from_secs(30), child)
        .await
        .expect("status command finished")
        .expect("status command ran")
}

#[tokio::test]
async fn the_status_command_prints_tables_from_a_running_nightshift() {
    let server = serve(run::status_routes(controller())).await;
    let out = run_status_command(&server.url).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("GPU pool: 3 nodes, 24 GPUs: 4 protected, 6 lent, 14 free"),
        "{stdout}"
    );
    assert!(stdout.contains("cordoned"), "{stdout}");
    assert!(stdout.contains("sft-step-3"), "{stdout}");
    assert!(stdout.contains("PreemptionByScheduler"), "{stdout}");
}

#[tokio::test]
async fn the_status_command_fails_clearly_when_nightshift_cannot_answer() {
    let server = serve(run::off_routes()).await;
    let out = run_status_command(&server.url).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("503"), "{stderr}");
}
