//! Failure modes of the deployed webhook, on the real API server:
//! - the serving certificate is rotated on disk (`nightshift certs generate` again, same CA)
//!   while pods are created one after another: not one creation fails;
//! - the nightshift process is killed: research pods are rejected with a message naming the
//!   webhook (`failurePolicy: Fail`), other pods are created as usual;
//! - nightshift is started again on the same port: research pods are mutated again, and the
//!   spare marks (removed while it was down) and `/status` come back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use crate::harness::binary::{
    self, ADMISSION_POLICY, Nightshift, SPARE, SPARE_GPUS, WEBHOOK_CONFIG, generate_certs,
    kubectl_ok, remove_spare_marks, serves_current_certificate,
};
use crate::harness::cluster::{Cluster, GPU_NODES, POOL_LABEL};
use crate::harness::deploy::{deploy, wait_webhook_active};
use crate::harness::research::{assert_marked, assert_untouched, create_pod, research_pod};
use crate::harness::wait::{self, Check};

const RESEARCH_NS: &str = "e2e-failure-research";
const PLAIN_NS: &str = "e2e-failure-plain";
/// Certificate rotations during the stream of pod creations.
const ROTATIONS: usize = 3;
/// Pods created after each rotation was picked up, before the next one: the new certificate
/// must serve real admissions, not only be loaded.
const PODS_PER_ROTATION: usize = 5;
const STEP: Duration = Duration::from_secs(60);

pub async fn run(cluster: Arc<Cluster>) -> Result<()> {
    let c = &*cluster;
    let result = scenario(c).await;
    let cleanup = binary::delete_namespaces_now(c, &[RESEARCH_NS, PLAIN_NS]).await;
    result.and(cleanup)
}

async fn scenario(c: &Cluster) -> Result<()> {
    let client = c.client.clone();
    let (ws, mut ns, _registration) = deploy(c, "nightshift-failure").await?;
    c.create_namespace(RESEARCH_NS, json!({"nightshift.io/research": "true"}))
        .await?;
    c.create_namespace(PLAIN_NS, json!({})).await?;
    wait_webhook_active(c, RESEARCH_NS).await?;

    // 1. Certificate rotation under a stream of creations. CPU-only research pods: they go
    // through the same webhook and patch but leave the GPU pool alone.
    let stop = Arc::new(AtomicBool::new(false));
    let created = Arc::new(AtomicUsize::new(0));
    let stream = {
        let client = client.clone();
        let stop = stop.clone();
        let created = created.clone();
        tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(client, RESEARCH_NS);
            let mut failures = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let mut pod = research_pod(&format!("stream-{i}"), &[]);
                pod["spec"]["containers"][0]["resources"] = json!({});
                i += 1;
                let pod: Pod = match serde_json::from_value(pod) {
                    Ok(p) => p,
                    Err(e) => {
                        failures.push(e.to_string());
                        continue;
                    }
                };
                match pods.create(&PostParams::default(), &pod).await {
                    Ok(p) if p.spec.as_ref().and_then(|s| s.priority) == Some(-1000) => {
                        created.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(p) => failures.push(format!(
                        "stream-{}: stored unmarked ({:?})",
                        i - 1,
                        p.spec.and_then(|s| s.priority_class_name)
                    )),
                    Err(e) => failures.push(format!("stream-{}: {e}", i - 1)),
                }
            }
            failures
        })
    };
    let t = Instant::now();
    let admin = ns.admin_api();
    let webhook = ns.webhook;
    for r in 0..ROTATIONS {
        let before_reloads = ns
            .metric("nightshift_webhook_certificate_reloads_total")
            .await?;
        let before_pods = created.load(Ordering::SeqCst);
        generate_certs(&ws.certs())?;
        wait::until(
            &format!("rotation {} to be picked up and serve admissions", r + 1),
            STEP,
            || {
                let running = ns.check_running();
                let admin = admin.clone();
                let pods = created.load(Ordering::SeqCst);
                let certs = ws.certs();
                async move {
                    running?;
                    let reloads = admin
                        .metric("nightshift_webhook_certificate_reloads_total")
                        .await?;
                    // A fresh handshake gets the new certificate, valid for the same caBundle.
                    let current = serves_current_certificate(webhook, &certs).await?;
                    Ok(
                        if reloads > before_reloads
                            && current
                            && pods >= before_pods + PODS_PER_ROTATION
                        {
                            Check::Done(())
                        } else {
                            Check::Pending(format!(
                                "{reloads} reloads (was {before_reloads}), new certificate served: \
                                 {current}, {pods} pods (was {before_pods})"
                            ))
                        },
                    )
                }
            },
        )
        .await?;
    }
    stop.store(true, Ordering::SeqCst);
    let failures = stream.await?;
    let n = created.load(Ordering::SeqCst);
    ensure!(
        failures.is_empty(),
        "{} of {} pod creations failed during certificate rotation:\n{}",
        failures.len(),
        n + failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "failure: {ROTATIONS} certificate rotations during {n} pod creations in {:.1} s: 0 failed",
        t.elapsed().as_secs_f64()
    );

    // 2. nightshift hung (SIGSTOP: connections are accepted, nothing answers): research pods
    // are rejected once the webhook's timeoutSeconds (5 s) pass, other pods are not delayed.
    let pods: Api<Pod> = Api::namespaced(client.clone(), RESEARCH_NS);
    ns.freeze(true)?;
    let t = Instant::now();
    let hung: Pod = serde_json::from_value(research_pod("while-hung", &[]))?;
    let hung_result = pods.create(&PostParams::default(), &hung).await;
    let hung_in = t.elapsed();
    let t_plain = Instant::now();
    let plain = create_pod(&client, PLAIN_NS, research_pod("plain-while-hung", &[])).await;
    let plain_in = t_plain.elapsed();
    ns.freeze(false)?;
    let hung_err = match hung_result {
        Ok(_) => anyhow::bail!("a research pod was admitted while the webhook hung"),
        Err(kube::Error::Api(status)) => status.message,
        Err(e) => e.to_string(),
    };
    ensure!(
        hung_err.contains("failed calling webhook") && hung_in < Duration::from_secs(10),
        "a hung webhook must fail the research pod within its 5 s timeout; after {hung_in:?}: {hung_err}"
    );
    assert_untouched(&plain?).context("ordinary pod while the webhook hung")?;
    eprintln!(
        "failure: webhook hung: research pod rejected after {:.2} s ({hung_err}); ordinary pod \
         created in {:.0} ms",
        hung_in.as_secs_f64(),
        plain_in.as_secs_f64() * 1000.0
    );
    wait_webhook_active(c, RESEARCH_NS).await?;

    // 3. nightshift killed: research pods are rejected, everything else is created.
    let port = ns.webhook.port();
    ns.kill();
    let t = Instant::now();
    let refused: Pod = serde_json::from_value(research_pod("while-down", &[]))?;
    let err = match pods.create(&PostParams::default(), &refused).await {
        Ok(_) => anyhow::bail!("a research pod was admitted while the webhook was down"),
        Err(kube::Error::Api(status)) => status.message,
        Err(e) => e.to_string(),
    };
    let rejected_in = t.elapsed();
    ensure!(
        err.contains("failed calling webhook") && err.contains("namespace.research.nightshift.io"),
        "the rejection does not say which webhook failed: {err}"
    );
    ensure!(
        pods.get_opt("while-down").await?.is_none(),
        "the rejected pod was stored"
    );
    // A pod labelled research outside a research namespace goes through the second webhook.
    let labelled = create_pod(
        &client,
        PLAIN_NS,
        research_pod("labelled-while-down", &[("nightshift.io/research", "true")]),
    )
    .await;
    ensure!(
        labelled
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("pod.research.nightshift.io")),
        "a research-labelled pod was not rejected by the second webhook: {labelled:?}"
    );
    let t_plain = Instant::now();
    let plain = create_pod(&client, PLAIN_NS, research_pod("plain-while-down", &[])).await?;
    let plain_in = t_plain.elapsed();
    assert_untouched(&plain).context("ordinary pod while the webhook is down")?;
    eprintln!(
        "failure: webhook down: research pod rejected in {:.0} ms with: {err}; ordinary pod \
         created in {:.0} ms",
        rejected_in.as_secs_f64() * 1000.0,
        plain_in.as_secs_f64() * 1000.0
    );

    // While it is down, the spare marks are lost (as if someone removed them).
    remove_spare_marks(c)?;

    // 4. Restart on the same port (the registered URL): everything recovers.
    let t = Instant::now();
    let mut ns = Nightshift::start(
        c,
        "nightshift-failure-restarted",
        &c.kubeconfig,
        &ws.certs(),
        port,
    )
    .await?;
    ns.wait_ready().await?;
    let ready_in = t.elapsed();
    wait_webhook_active(c, RESEARCH_NS).await?;
    let pod = create_pod(&client, RESEARCH_NS, research_pod("after-restart", &[])).await?;
    assert_marked(&pod, true).context("research pod after the restart")?;
    let admitting_in = t.elapsed();
    let nodes: Api<Node> = Api::all(client.clone());
    wait::until("spare marks on every GPU node again", STEP, || {
        let running = ns.check_running();
        let nodes = nodes.clone();
        async move {
            running?;
            let list = nodes
                .list(&ListParams::default().labels(POOL_LABEL))
                .await?;
            let marked = list
                .items
                .iter()
                .filter(|n| {
                    n.metadata
                        .labels
                        .as_ref()
                        .is_some_and(|l| l.contains_key(SPARE) && l.contains_key(SPARE_GPUS))
                })
                .count();
            Ok(if marked == GPU_NODES as usize {
                Check::Done(())
            } else {
                Check::Pending(format!("{marked} of {GPU_NODES} marked"))
            })
        }
    })
    .await?;
    let marks_in = t.elapsed();
    let status: serde_json::Value = serde_json::from_str(&ns.admin_get("/status").await?)?;
    let research_listed = status["research_pods"].as_array().map_or(0, Vec::len);
    ensure!(
        status["synced"] == true
            && status["nodes"].as_array().map_or(0, Vec::len) == GPU_NODES as usize,
        "/status after the restart: synced {}, nodes {}",
        status["synced"],
        status["nodes"]
    );
    eprintln!(
        "failure: restarted on port {port}: ready in {:.2} s, admitting research pods in {:.2} s, \
         spare marks back in {:.2} s; /status lists {GPU_NODES} nodes and {research_listed} research pods",
        ready_in.as_secs_f64(),
        admitting_in.as_secs_f64(),
        marks_in.as_secs_f64()
    );

    // 5. The webhook configuration deleted (by mistake, or an uninstall in the wrong order):
    // the ValidatingAdmissionPolicy alone still keeps unmarked research pods out.
    kubectl_ok(
        c,
        &["delete", "mutatingwebhookconfiguration", WEBHOOK_CONFIG],
        None,
    )?;
    let probe: Pod = serde_json::from_value(research_pod("unmarked", &[]))?;
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let t = Instant::now();
    let denial = wait::until(
        "the admission policy to reject an unmarked research pod",
        STEP,
        || async {
            Ok(match pods.create(&dry, &probe).await {
                Err(kube::Error::Api(s)) if s.message.contains(ADMISSION_POLICY) => {
                    Check::Done(s.message)
                }
                Err(e) => Check::Pending(e.to_string()),
                Ok(p) => Check::Pending(format!(
                    "admitted with class {:?}",
                    p.spec.and_then(|s| s.priority_class_name)
                )),
            })
        },
    )
    .await?;
    ensure!(
        denial.contains("must run with priorityClassName nightshift-research"),
        "the policy's message does not say what is wrong: {denial}"
    );
    // The policy's rule is the webhook's: without the webhook, a research pod that brings its
    // own class below the research class, never preempting, is still admitted.
    crate::harness::objects::ensure_priority_class(
        &client,
        "e2e-scavenger",
        crate::harness::objects::RESEARCH_VALUE - 4000,
        "Never",
    )
    .await?;
    let mut own = research_pod("own-lower-class-no-webhook", &[]);
    own["spec"]["priorityClassName"] = serde_json::json!("e2e-scavenger");
    let own: Pod = serde_json::from_value(own)?;
    pods.create(&dry, &own).await.context(
        "the admission policy alone must admit a research pod with its own lower, \
         non-preempting class (the webhook's rule)",
    )?;
    ensure!(
        pods.create(&PostParams::default(), &probe).await.is_err()
            && pods.get_opt("unmarked").await?.is_none(),
        "an unmarked research pod was stored without the webhook"
    );
    let plain = create_pod(&client, PLAIN_NS, research_pod("plain-no-webhook", &[])).await?;
    assert_untouched(&plain)?;
    eprintln!(
        "failure: webhook configuration deleted: the admission policy rejects unmarked research \
         pods ({:.2} s after the deletion): {denial}",
        t.elapsed().as_secs_f64()
    );
    ns.check_running()
}
