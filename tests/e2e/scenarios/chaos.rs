//! Chaos on the real control plane while GPUs are lent:
//! - the kube-apiserver is killed and started again (same flags, port and etcd data) while
//!   research pods run on spare GPUs and more are being created: a creation either fails or is
//!   stored marked, never stored unmarked; nightshift keeps running, its watches resume, and the
//!   spare marks and `/status` accounting converge on the state changed after the restart;
//! - nightshift alone is cut off from the API server (its connection runs through a proxy the
//!   test cuts) for longer than its Lease: it steps down (`nightshift_pool_leader` 0) and writes
//!   no marks; once the link heals it takes the Lease back and the marks return.
//!
//! Each part prints its recovery times.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::harness::binary::{self, Nightshift, Registration, Workspace, remove_spare_marks};
use crate::harness::cluster::{Cluster, GPU_NODES};
use crate::harness::deploy::{deploy, wait_webhook_active};
use crate::harness::objects::{self, is_bound};
use crate::harness::pool::{converged, marked_nodes, wait_leader, wait_marked_nodes};
use crate::harness::proxy::Proxy;
use crate::harness::research::research_pod;
use crate::harness::wait::{self, Check};

const RESTART_NS: &str = "e2e-chaos-restart";
/// How long each step gets (they take a second or two; the API server's restart 5-15 s on a
/// loaded 2-core machine).
const STEP: Duration = Duration::from_secs(90);
/// Research pods running on spare GPUs when the API server goes down, and added after it is back.
const LENT_BEFORE: u32 = 8;
const LENT_AFTER: u32 = 4;
/// How long the API server stays down, watched (not slept): long enough for every client's
/// watch to break and its retries to back off.
const DOWN_FOR: Duration = Duration::from_secs(5);
/// Pause between two creations of the stream: a steady trickle that spans the outage without
/// flooding the API server.
const STREAM_PACE: Duration = Duration::from_millis(200);
/// The Lease of the partitioned nightshift: short, so that the scenario waits seconds, not the
/// production 15 s; stepping down takes 2/3 of it (the renew deadline).
const LEASE: Duration = Duration::from_secs(6);
/// How long the partitioned, stepped-down nightshift is watched for marks it must not write.
const OBSERVE: Duration = Duration::from_secs(4);

pub async fn run_restart(cluster: Arc<Cluster>) -> Result<()> {
    let c = &*cluster;
    let result = restart(c).await;
    let cleanup = binary::delete_namespaces_now(c, &[RESTART_NS]).await;
    let unmark = remove_spare_marks(c);
    result.and(cleanup).and(unmark)
}

pub async fn run_partition(cluster: Arc<Cluster>) -> Result<()> {
    let c = &*cluster;
    let result = partition(c).await;
    let unmark = remove_spare_marks(c);
    result.and(unmark)
}

/// What the stream of creations saw.
#[derive(Default)]
struct Stream {
    /// Stored with the research priority.
    marked: usize,
    /// Refused (API server down or restarting, webhook unreachable from it): the fail-closed
    /// outcome.
    failed: usize,
    /// Stored without the research priority: must stay empty.
    unmarked: Vec<String>,
}

async fn restart(c: &Cluster) -> Result<()> {
    let client = c.client.clone();
    objects::ensure_priority_classes(&client).await?;
    let (_ws, mut ns, _registration) = deploy(c, "nightshift-chaos-restart").await?;
    c.create_namespace(RESTART_NS, json!({"nightshift.io/research": "true"}))
        .await?;
    wait_webhook_active(c, RESTART_NS).await?;

    // Lending: research pods, marked by the webhook, bound to spare GPUs.
    let jobs: Api<Job> = Api::namespaced(client.clone(), RESTART_NS);
    jobs.create(
        &PostParams::default(),
        &objects::research_job("before", LENT_BEFORE as i32, false)?,
    )
    .await?;
    wait_bound(c, LENT_BEFORE as usize).await?;
    converged(c, &ns, LENT_BEFORE, "before the restart").await?;

    // A stream of research pod creations spanning the outage.
    let stop = Arc::new(AtomicBool::new(false));
    let marked = Arc::new(AtomicUsize::new(0));
    let stream = {
        let client = client.clone();
        let (stop, marked) = (stop.clone(), marked.clone());
        tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(client, RESTART_NS);
            let mut seen = Stream::default();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                // CPU-only: the same webhook and patch, without touching the GPU pool.
                let mut pod = research_pod(&format!("stream-{i}"), &[]);
                pod["spec"]["containers"][0]["resources"] = json!({});
                i += 1;
                let Ok(pod) = serde_json::from_value::<Pod>(pod) else {
                    seen.unmarked.push(format!("stream-{}: not a pod", i - 1));
                    continue;
                };
                match pods.create(&PostParams::default(), &pod).await {
                    Ok(p) if p.spec.as_ref().and_then(|s| s.priority) == Some(-1000) => {
                        seen.marked += 1;
                        marked.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(p) => seen.unmarked.push(format!(
                        "{:?}: priority {:?}",
                        p.metadata.name,
                        p.spec.and_then(|s| s.priority)
                    )),
                    Err(_) => seen.failed += 1,
                }
                tokio::time::sleep(STREAM_PACE).await;
            }
            seen
        })
    };
    wait::until("the stream to store a marked pod", STEP, || async {
        let n = marked.load(Ordering::SeqCst);
        Ok(if n > 0 {
            Check::Done(())
        } else {
            Check::Pending("none yet".into())
        })
    })
    .await?;

    // The API server dies. nightshift must neither exit nor panic while it is gone.
    c.kill_apiserver()?;
    let down = Instant::now();
    while down.elapsed() < DOWN_FOR {
        ns.check_running()?;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let marked_before_restart = marked.load(Ordering::SeqCst);
    // Recovery times count from the restart of the process.
    let restarted = Instant::now();
    let apiserver_ready = c.start_apiserver().await?;

    // Admissions resume: the stream stores marked pods again.
    wait::until("a marked pod stored after the restart", STEP, || async {
        let n = marked.load(Ordering::SeqCst);
        Ok(if n > marked_before_restart {
            Check::Done(())
        } else {
            Check::Pending(format!("{n} marked, {marked_before_restart} before"))
        })
    })
    .await?;
    let admitting_in = restarted.elapsed();

    // Watches resumed: a change made after the restart shows in the marks and in /status.
    jobs.create(
        &PostParams::default(),
        &objects::research_job("after", LENT_AFTER as i32, false)?,
    )
    .await?;
    wait_bound(c, (LENT_BEFORE + LENT_AFTER) as usize).await?;
    converged(c, &ns, LENT_BEFORE + LENT_AFTER, "after the restart").await?;
    let converged_in = restarted.elapsed();

    stop.store(true, Ordering::SeqCst);
    let seen = stream.await?;
    ensure!(
        seen.unmarked.is_empty(),
        "research pods stored unmarked around the API server restart: {:?}",
        seen.unmarked
    );
    ns.check_running()?;
    let log = ns.log();
    ensure!(
        !log.contains("panicked"),
        "nightshift panicked: {}",
        ns.log_tail(30)
    );
    eprintln!(
        "chaos: API server killed, down {:.1} s, restarted: ready after {:.2} s, admitting \
         research pods after {:.2} s, marks and /status converged after {:.2} s; stream: {} \
         stored marked, {} refused, 0 unmarked",
        down.elapsed().as_secs_f64() - restarted.elapsed().as_secs_f64(),
        apiserver_ready.as_secs_f64(),
        admitting_in.as_secs_f64(),
        converged_in.as_secs_f64(),
        seen.marked,
        seen.failed
    );
    Ok(())
}

async fn partition(c: &Cluster) -> Result<()> {
    let client = c.client.clone();
    objects::ensure_priority_classes(&client).await?;
    let proxy = Proxy::start(apiserver_addr(c)?).await?;
    let ws = Workspace::new()?;
    let kubeconfig = ws.root().join("through-proxy.kubeconfig");
    std::fs::write(&kubeconfig, proxied_kubeconfig(c, proxy.addr)?)?;
    let _registration = Registration::new(c);
    let lease = format!("--pool-lease-duration={}s", LEASE.as_secs());
    let mut ns = Nightshift::start_with(
        c,
        "nightshift-chaos-partition",
        &kubeconfig,
        &ws.certs(),
        0,
        &[lease],
    )
    .await?;
    ws.apply_local_overlay(c, ns.webhook.port())?;
    ns.wait_ready().await?;
    let admin = ns.admin_api();
    wait_leader(c, &mut ns, 1.0, STEP).await?;
    wait_marked_nodes(c, &mut ns, GPU_NODES as usize, STEP).await?;

    // Cut: nightshift alone loses the API server; it must step down within its Lease.
    proxy.cut(true);
    let cut = Instant::now();
    wait_leader(c, &mut ns, 0.0, LEASE + STEP).await?;
    let stepped_down = cut.elapsed();
    let status: Value = serde_json::from_str(&admin.get("/status").await?)?;
    ensure!(
        status["leader"] == false,
        "/status while partitioned says leader {}",
        status["leader"]
    );
    // The marks are removed behind its back; a stepped-down nightshift writes none.
    remove_spare_marks(c)?;
    let observe = Instant::now();
    while observe.elapsed() < OBSERVE {
        ns.check_running()?;
        let n = marked_nodes(c).await?;
        ensure!(
            n == 0,
            "{n} nodes marked spare while nightshift was partitioned"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Heal: it takes the Lease back and marks again.
    proxy.cut(false);
    let healed = Instant::now();
    wait_leader(c, &mut ns, 1.0, STEP).await?;
    let leader_in = healed.elapsed();
    wait_marked_nodes(c, &mut ns, GPU_NODES as usize, STEP).await?;
    let marks_in = healed.elapsed();
    ns.check_running()?;
    ensure!(
        !ns.log().contains("panicked"),
        "nightshift panicked: {}",
        ns.log_tail(30)
    );
    eprintln!(
        "chaos: partitioned for {:.1} s (Lease {} s): stepped down after {:.2} s, no mark \
         written; healed: leader again in {:.2} s, marks back in {:.2} s",
        healed.duration_since(cut).as_secs_f64(),
        LEASE.as_secs(),
        stepped_down.as_secs_f64(),
        leader_in.as_secs_f64(),
        marks_in.as_secs_f64()
    );
    Ok(())
}

/// Waits until `n` research pods of the restart scenario are bound.
async fn wait_bound(c: &Cluster, n: usize) -> Result<()> {
    wait::until(&format!("{n} research GPU pods bound"), STEP, || async {
        c.check_processes()?;
        let pods = objects::pods(&c.client, RESTART_NS, "role=research").await?;
        let bound = pods.values().filter(|p| is_bound(p)).count();
        Ok(if bound == n {
            Check::Done(())
        } else {
            Check::Pending(format!("{bound} of {} bound", pods.len()))
        })
    })
    .await
}

/// The API server's address, from the administrator's kubeconfig.
fn apiserver_addr(c: &Cluster) -> Result<SocketAddr> {
    let text = std::fs::read_to_string(&c.kubeconfig)?;
    let server = server_line(&text).context("no server in the kubeconfig")?;
    let hostport = server.trim_start_matches("https://").trim_end_matches('/');
    hostport
        .parse()
        .with_context(|| format!("API server address {hostport:?}"))
}

/// The administrator's kubeconfig with the server replaced by the proxy (same CA and token: the
/// serving certificate is valid for 127.0.0.1 on any port).
fn proxied_kubeconfig(c: &Cluster, proxy: SocketAddr) -> Result<String> {
    let text = std::fs::read_to_string(&c.kubeconfig)?;
    let Some(server) = server_line(&text) else {
        bail!("no server in the kubeconfig");
    };
    Ok(text.replace(server, &format!("https://{proxy}")))
}

fn server_line(kubeconfig: &str) -> Option<&str> {
    kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .map(str::trim)
}
