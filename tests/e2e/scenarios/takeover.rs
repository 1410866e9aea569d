//! Two nightshift instances, as the shipped Deployment's two replicas run them: both serve the
//! webhook behind the shipped `nightshift` Service (its EndpointSlices list both, at this
//! machine's own address, the way the EndpointSlice controller lists two ready pods) and one of
//! them holds the pool's Lease. The leader is killed (SIGKILL, as when its node dies):
//! - the standby takes the Lease once it expires and keeps the spare marks and the lending
//!   accounting right (it rebuilds both from the cluster, then rewrites removed marks);
//! - admissions keep succeeding through the survivor once the dead instance's readiness probe
//!   fails and its endpoint is marked not ready; in between, an admission the API server sends to
//!   the dead endpoint is refused (`failurePolicy: Fail`), never stored unmarked.
//!
//! The API server picks an endpoint when it opens a connection to the webhook and keeps that
//! connection, so the scenario first lists the leader alone (it then serves every admission)
//! and the standby from then on.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::harness::binary::{self, NAMESPACE, Nightshift, Registration, Workspace};
use crate::harness::bounds;
use crate::harness::cluster::Cluster;
use crate::harness::deploy::wait_webhook_active;
use crate::harness::endpoints::ServiceEndpoints;
use crate::harness::objects::{self, RESEARCH_CLASS, is_running};
use crate::harness::pool::{converged, wait_leader};
use crate::harness::process::host_ip;
use crate::harness::research::{priority_class, research_pod};
use crate::harness::victims;
use crate::harness::wait::{self, Check};

const RESEARCH_NS: &str = "e2e-takeover";
const RESEARCH_SELECTOR: &str = "role=research";
/// The shipped Service (`manifests/base/service.yaml`) and its webhook port's name.
const SERVICE: &str = "nightshift";
const WEBHOOK_PORT: &str = "webhook";
/// Shorter than the production 15 s so that the takeover takes seconds; the standby checks
/// every 2/15 of it. [`bounds::LEADER_KILLED_TO_STANDBY`] is derived from it.
const LEASE: Duration = Duration::from_secs(6);
/// Research pods lent before the takeover (fewer than the pool's GPUs, so nodes stay spare).
const RESEARCH_PODS: i32 = 6;
/// Admissions per phase.
const ADMISSIONS: usize = 20;
/// Deadline of each step; far above the seconds each takes.
const STEP: Duration = Duration::from_secs(120);

pub async fn run(cluster: Arc<Cluster>) -> Result<()> {
    let c = &*cluster;
    let result = scenario(c).await;
    let endpoints = ServiceEndpoints::new(&c.client, NAMESPACE, SERVICE, WEBHOOK_PORT);
    let slices = endpoints.delete_all().await;
    let service = binary::kubectl_ok(
        c,
        &[
            "delete",
            "service",
            SERVICE,
            "--namespace",
            NAMESPACE,
            "--ignore-not-found",
        ],
        None,
    )
    .map(drop);
    let cleanup = binary::clean_pool(c, &[RESEARCH_NS]).await;
    result.and(slices).and(service).and(cleanup)
}

async fn scenario(c: &Cluster) -> Result<()> {
    let client = c.client.clone();
    objects::ensure_priority_classes(&client).await?;
    let host = host_ip()?;
    let ws = Workspace::new()?;
    let _registration = Registration::new(c);

    // The production registration (namespace, RBAC, both webhooks calling the Service).
    binary::kubectl_ok(
        c,
        &["apply", "-f", "-"],
        Some(&ws.render_service_registration()?),
    )?;

    // Two instances, each with its own identity, the webhook on this machine's address.
    let mut a = start(c, &ws, "nightshift-a", host).await?;
    wait_leader(c, &mut a, 1.0, STEP).await?;
    let mut b = start(c, &ws, "nightshift-b", host).await?;
    let b_admin = b.admin_api();
    ensure!(
        b_admin.metric("nightshift_pool_leader").await? == 0.0,
        "the second instance should stand by while the first holds the Lease"
    );

    // The leader alone behind the Service first: the API server dials an endpoint when it opens
    // a connection and keeps the connection, so this makes the leader the instance it calls.
    let endpoints = ServiceEndpoints::new(&client, NAMESPACE, SERVICE, WEBHOOK_PORT);
    endpoints.set("a", host, a.webhook.port(), true).await?;
    endpoints.set("b", host, b.webhook.port(), false).await?;
    c.create_namespace(RESEARCH_NS, json!({"nightshift.io/research": "true"}))
        .await?;
    wait_webhook_active(c, RESEARCH_NS).await?;
    let a_before = reviews(&a).await?;
    let served = admit(c, ADMISSIONS).await?;
    ensure!(
        served.refused == 0,
        "admissions through the Service failed: {:?}",
        served.errors
    );
    let a_served = reviews(&a).await? - a_before;
    ensure!(
        a_served >= ADMISSIONS as f64,
        "the only ready instance should serve every admission: {a_served} of {ADMISSIONS}"
    );
    // Then both ready, as two running replicas are.
    endpoints.set("b", host, b.webhook.port(), true).await?;

    // Research lent by the leader.
    let jobs: Api<Job> = Api::namespaced(client.clone(), RESEARCH_NS);
    jobs.create(
        &PostParams::default(),
        &objects::research_job("research", RESEARCH_PODS, false)?,
    )
    .await?;
    victims::wait_pods(
        c,
        RESEARCH_NS,
        RESEARCH_SELECTOR,
        RESEARCH_PODS as usize,
        is_running,
        STEP,
    )
    .await?;
    converged(c, &a, RESEARCH_PODS as u32, "under the first leader").await?;

    // The leader dies.
    a.kill();
    let killed = Instant::now();
    // The moment the standby reports leading is taken by a watcher of its own, so that the
    // admissions below, slow on a loaded machine, do not count in the takeover time.
    let standby = b.admin_api();
    let leading = tokio::spawn(async move {
        wait::until("the standby leading", STEP, || async {
            let v = standby.metric("nightshift_pool_leader").await?;
            Ok(if v == 1.0 {
                Check::Done(Instant::now())
            } else {
                Check::Pending(format!("{v}"))
            })
        })
        .await
    });
    // Until its readiness probe fails, the API server still sends some admissions there: they
    // are refused, never stored unmarked.
    let exposed = admit(c, ADMISSIONS).await?;
    // The probe fails (connection refused); the endpoint is marked not ready.
    ensure!(
        a.admin_api().get("/readyz").await.is_err(),
        "the killed instance still answers its readiness probe"
    );
    endpoints.set("a", host, a.webhook.port(), false).await?;
    let unready_after = killed.elapsed();
    // The API server reads EndpointSlices through a watch: wait for the first admission that
    // lands, then require every later one to.
    wait::until("admissions through the survivor", STEP, || async {
        let r = admit(c, 1).await?;
        Ok(if r.refused == 0 {
            Check::Done(())
        } else {
            Check::Pending(format!("{:?}", r.errors))
        })
    })
    .await?;
    let b_before = reviews(&b).await?;
    let survivor = admit(c, ADMISSIONS).await?;
    ensure!(
        survivor.refused == 0,
        "admissions failed with the survivor alone behind the Service: {:?}",
        survivor.errors
    );
    ensure!(
        reviews(&b).await? - b_before >= ADMISSIONS as f64,
        "the survivor should have served every admission"
    );

    // The standby takes the Lease once it expires, and keeps marks and accounting right.
    wait_leader(c, &mut b, 1.0, STEP).await?;
    let took_over = leading.await.context("the leadership watcher")?? - killed;
    converged(c, &b, RESEARCH_PODS as u32, "under the new leader").await?;
    // It writes: marks removed behind its back come back.
    binary::remove_spare_marks(c)?;
    let removed = Instant::now();
    converged(c, &b, RESEARCH_PODS as u32, "after the marks were removed").await?;
    let rewritten = removed.elapsed();
    b.check_running()?;
    ensure!(
        !b.log().contains("panicked"),
        "the survivor panicked: {}",
        b.log_tail(30)
    );
    eprintln!(
        "takeover: the leader admitted {a_served} of {ADMISSIONS} through the Service; killed: {} of {ADMISSIONS} admissions refused before its endpoint \
         was marked not ready ({:.2} s), none stored unmarked; the survivor admitted \
         {ADMISSIONS} of {ADMISSIONS}; standby leader after {:.2} s (Lease {} s), {RESEARCH_PODS} \
         GPUs lent in its accounting, removed marks rewritten in {:.2} s",
        exposed.refused,
        unready_after.as_secs_f64(),
        took_over.as_secs_f64(),
        LEASE.as_secs(),
        rewritten.as_secs_f64()
    );
    bounds::LEADER_KILLED_TO_STANDBY.check(took_over)?;
    Ok(())
}

async fn start(c: &Cluster, ws: &Workspace, name: &str, host: IpAddr) -> Result<Nightshift> {
    let extra = [
        format!("--webhook-addr={host}:0"),
        format!("--pool-identity={name}"),
        format!("--pool-lease-duration={}s", LEASE.as_secs()),
    ];
    let mut ns = Nightshift::start_with(c, name, &c.kubeconfig, &ws.certs(), 0, &extra).await?;
    ns.wait_ready().await?;
    Ok(ns)
}

/// Reviews an instance answered so far.
async fn reviews(ns: &Nightshift) -> Result<f64> {
    ns.metric("nightshift_webhook_admissions_total").await
}

/// What a batch of admissions through the API server gave.
struct Admitted {
    refused: usize,
    errors: Vec<String>,
}

/// Creates `n` research pods as a server-side dry run (the whole admission chain, nothing
/// stored): each is either refused or comes back marked; an unmarked one fails the scenario.
async fn admit(c: &Cluster, n: usize) -> Result<Admitted> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), RESEARCH_NS);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut out = Admitted {
        refused: 0,
        errors: Vec::new(),
    };
    for i in 0..n {
        let pod: Pod = serde_json::from_value(research_pod(&format!("probe-{i}"), &[]))?;
        match pods.create(&dry, &pod).await {
            Ok(p) => {
                let class = priority_class(&p);
                if class != Some(RESEARCH_CLASS) {
                    return Err(anyhow!(
                        "a research pod was admitted unmarked (priority class {class:?})"
                    ));
                }
            }
            Err(e) => {
                out.refused += 1;
                out.errors.push(e.to_string());
            }
        }
    }
    Ok(out)
}
