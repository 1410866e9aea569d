//! Chaos on the real control plane while GPUs are lent:
//! - the kube-apiserver is killed and started again (same flags, port and etcd data) while
//!   research pods run on spare GPUs and more are being created: a creation either fails or is
//!   stored marked, never stored unmarked; nightshift keeps running, its watches resume, and the
//!   spare marks and `/status` accounting converge on the state changed after the restart;
//! - nightshift alone is cut off from the API server (its connection runs through a proxy the
//!   test cuts): it steps down (`nightshift_pool_leader` 0) within its Lease. Another replica
//!   then holds the Lease and the link heals: nightshift reads the cluster again (its `/status`
//!   shows the marks as the nodes carry them, all of them wrong) and writes none of them, though
//!   it could. Once the other replica releases the Lease, nightshift takes it and rewrites the
//!   marks within the time it was watched, so a write in that time would have been seen.
//!
//! Each part prints its recovery times.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::harness::binary::{
    self, AdminApi, NAMESPACE, Nightshift, Registration, SPARE, SPARE_GPUS, Workspace, kubectl_ok,
    remove_spare_marks, spare_labels,
};
use crate::harness::bounds::Bound;
use crate::harness::cluster::{Cluster, GPU_NODES};
use crate::harness::deploy::{deploy, wait_webhook_active};
use crate::harness::objects::{self, is_bound};
use crate::harness::pool::{converged, wait_leader, wait_marked_nodes};
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
/// production 15 s; stepping down takes 2/3 of it (the renew deadline) and one check (2/15).
const LEASE: Duration = Duration::from_secs(6);
/// A partitioned leader must stop acting before anyone may take its Lease over: within the
/// Lease after the cut (its last renewal came before it). The test reads the leader gauge every
/// 250 ms over HTTP, so it may see the step-down up to two of its polls late.
const STEP_DOWN: Bound = Bound {
    step: "partitioned leader → stepped down",
    max: Duration::from_millis(6_500),
};
/// How long the stepped-down nightshift, reconnected, is watched for marks it must not write:
/// four of its 1 s reconcile passes. A leader rewrites wrong marks at its next pass; that it
/// does within this time is checked once the Lease is released.
const OBSERVE: Duration = Duration::from_secs(4);
/// The pool Lease (`--pool-lease-name`'s default, in `--pool-lease-namespace`).
const LEASE_NAME: &str = "nightshift-pool";
/// The other replica that holds the Lease while nightshift stands by.
const OTHER_HOLDER: &str = "nightshift-e2e-other-replica";

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
    // Whatever happened, no Lease held by a replica that does not exist: later scenarios'
    // nightshift would wait for it to expire.
    let lease = write_lease(c, None, Some(OTHER_HOLDER)).await;
    let unmark = remove_spare_marks(c);
    result.and(lease).and(unmark)
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
    wait_leader(c, &mut ns, 0.0, STEP).await?;
    let stepped_down = cut.elapsed();
    STEP_DOWN.check(stepped_down)?;
    let status: Value = serde_json::from_str(&admin.get("/status").await?)?;
    ensure!(
        status["leader"] == false,
        "/status while partitioned says leader {}",
        status["leader"]
    );

    // Another replica takes the Lease, as one would once it expired, and renews it. The marks
    // are made wrong behind nightshift's back: half the nodes unmarked, the others marked with
    // one spare GPU.
    let other = OtherHolder::take(c).await?;
    let wrong = make_marks_wrong(c).await?;

    // Heal: nightshift reaches the API server again. Its watches catch up (its /status shows the
    // wrong marks and that it would write others on every node), and it stands by.
    proxy.cut(false);
    let healed = Instant::now();
    wait_sees_wrong_marks(&admin, &wrong).await?;
    let reconnected = healed.elapsed();
    let leader_status: Value = serde_json::from_str(&admin.get("/status").await?)?;
    ensure!(
        leader_status["leader"] == false,
        "nightshift leads while another replica holds the Lease: {}",
        leader_status["leader"]
    );

    // It could write now, and must not: for OBSERVE, the marks stay exactly as they were made.
    let observe = Instant::now();
    while observe.elapsed() < OBSERVE {
        ns.check_running()?;
        let now = spare_labels(c).await?;
        ensure!(
            now == wrong,
            "a stepped-down nightshift changed the spare marks while another replica held the \
             Lease: {wrong:?} became {now:?}"
        );
        let leading = admin.metric("nightshift_pool_leader").await?;
        ensure!(
            leading == 0.0,
            "nightshift_pool_leader {leading} while another replica holds the Lease"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The other replica releases the Lease: nightshift takes it and corrects the marks, within
    // the time it was watched above.
    other.release(c).await?;
    let released = Instant::now();
    wait_leader(c, &mut ns, 1.0, STEP).await?;
    let leader_in = released.elapsed();
    converged(c, &ns, 0, "after the other replica released the Lease").await?;
    let marks_in = released.elapsed();
    ensure!(
        marks_in <= OBSERVE,
        "nightshift, leading again, corrected the marks only after {marks_in:?}: a write during \
         the {OBSERVE:?} it was watched as a standby might have gone unseen"
    );
    ns.check_running()?;
    ensure!(
        !ns.log().contains("panicked"),
        "nightshift panicked: {}",
        ns.log_tail(30)
    );
    eprintln!(
        "chaos: partitioned (Lease {} s): stepped down after {:.2} s (bound {:.1} s); another \
         replica took the Lease; healed: nightshift saw the cluster again after {:.2} s and \
         wrote no mark for {:.0} s; Lease released: leader again in {:.2} s, marks corrected \
         in {:.2} s",
        LEASE.as_secs(),
        stepped_down.as_secs_f64(),
        STEP_DOWN.max.as_secs_f64(),
        reconnected.as_secs_f64(),
        OBSERVE.as_secs_f64(),
        leader_in.as_secs_f64(),
        marks_in.as_secs_f64()
    );
    Ok(())
}

/// Makes every pool node's spare marks wrong: the first half unmarked, the others marked with
/// one spare GPU (the pool is empty: every node has all its GPUs spare). Returns the labels.
async fn make_marks_wrong(c: &Cluster) -> Result<BTreeMap<String, BTreeMap<String, String>>> {
    remove_spare_marks(c)?;
    let names: Vec<String> = spare_labels(c).await?.into_keys().collect();
    let marked = &names[names.len() / 2..];
    let mut args: Vec<&str> = vec!["label", "nodes"];
    args.extend(marked.iter().map(String::as_str));
    let (spare, spare_gpus) = (format!("{SPARE}=true"), format!("{SPARE_GPUS}=1"));
    args.extend([spare.as_str(), spare_gpus.as_str(), "--overwrite"]);
    kubectl_ok(c, &args, None)?;
    spare_labels(c).await
}

/// Waits until nightshift's `/status` shows every node's marks as `wrong` has them (its node
/// watch delivers again) and a different decision for each (a leader would rewrite them all).
async fn wait_sees_wrong_marks(
    admin: &AdminApi,
    wrong: &BTreeMap<String, BTreeMap<String, String>>,
) -> Result<()> {
    wait::until("nightshift to see the wrong marks", STEP, || async {
        let status: Value = serde_json::from_str(&admin.get("/status").await?)?;
        let mut pending = Vec::new();
        for node in status["nodes"].as_array().into_iter().flatten() {
            let name = node["name"].as_str().unwrap_or_default();
            let carried = wrong
                .get(name)
                .and_then(|l| l.get(SPARE_GPUS))
                .map(String::as_str);
            let seen = node["marked_spare_gpus"].as_str();
            let decided = node["spare_gpus"].as_u64().map(|g| g.to_string());
            if seen != carried || decided.is_none() || decided.as_deref() == carried {
                pending.push(format!(
                    "{name}: carries {carried:?}, /status sees {seen:?} and decides {decided:?}"
                ));
            }
        }
        let nodes = status["nodes"].as_array().map_or(0, Vec::len);
        Ok(if pending.is_empty() && nodes == wrong.len() {
            Check::Done(())
        } else {
            Check::Pending(format!("{nodes} nodes in /status; {pending:?}"))
        })
    })
    .await
}

/// Another replica holding the pool Lease: it takes it and renews it at nightshift's own
/// retry period (2/15 of the Lease), so that nightshift, which judges a Lease by how long it
/// stays unchanged, stands by.
struct OtherHolder {
    stop: Arc<AtomicBool>,
    /// Taken by [`OtherHolder::release`]; aborted on drop (a failed scenario).
    renewals: Option<tokio::task::JoinHandle<Result<()>>>,
}

impl OtherHolder {
    async fn take(c: &Cluster) -> Result<Self> {
        write_lease(c, Some(OTHER_HOLDER), None).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let renewals = {
            let (client, stop) = (c.client.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    tokio::time::sleep(LEASE * 2 / 15).await;
                    renew(&client, OTHER_HOLDER).await?;
                }
                Ok(())
            })
        };
        Ok(Self {
            stop,
            renewals: Some(renewals),
        })
    }

    /// Stops renewing and gives the Lease up (no holder), as a replica shutting down does.
    async fn release(mut self, c: &Cluster) -> Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(renewals) = self.renewals.take() {
            renewals.await.context("the other replica's renewals")??;
        }
        write_lease(c, None, Some(OTHER_HOLDER)).await
    }
}

impl Drop for OtherHolder {
    fn drop(&mut self) {
        if let Some(renewals) = self.renewals.take() {
            renewals.abort();
        }
    }
}

/// Writes the pool Lease's holder (`None`: released), renewed now; with `only_if`, only when
/// that identity holds it.
async fn write_lease(c: &Cluster, holder: Option<&str>, only_if: Option<&str>) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), NAMESPACE);
    let Some(mut lease) = leases.get_opt(LEASE_NAME).await? else {
        return Ok(());
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    if only_if.is_some() && spec.holder_identity.as_deref() != only_if {
        return Ok(());
    }
    let now = MicroTime(Timestamp::now());
    if spec.holder_identity.as_deref() != holder {
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        spec.acquire_time = Some(now.clone());
    }
    spec.holder_identity = holder.map(str::to_string);
    spec.renew_time = Some(now);
    spec.lease_duration_seconds = Some(i32::try_from(LEASE.as_secs())?);
    leases
        .replace(LEASE_NAME, &PostParams::default(), &lease)
        .await
        .with_context(|| format!("writing Lease {NAMESPACE}/{LEASE_NAME} for {holder:?}"))?;
    Ok(())
}

/// One renewal of the Lease by `holder`; fails if someone else took it.
async fn renew(client: &kube::Client, holder: &str) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let mut lease = leases.get(LEASE_NAME).await?;
    let spec = lease.spec.get_or_insert_with(Default::default);
    ensure!(
        spec.holder_identity.as_deref() == Some(holder),
        "the pool Lease was taken from {holder} by {:?}",
        spec.holder_identity
    );
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    leases
        .replace(LEASE_NAME, &PostParams::default(), &lease)
        .await?;
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
