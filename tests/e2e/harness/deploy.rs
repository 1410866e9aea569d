//! nightshift deployed into the test cluster as the scenarios need it: as the administrator
//! with its webhook registered through the local overlay, or under a token of the base
//! ServiceAccount; and the checks that its registration took effect and that no API call was
//! refused.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

use crate::harness::binary::{
    NAMESPACE, Nightshift, Registration, Workspace, kubectl_ok, token_kubeconfig,
};
use crate::harness::cluster::Cluster;
use crate::harness::objects::RESEARCH_CLASS;
use crate::harness::research::{priority_class, research_pod};
use crate::harness::wait::{self, Check};

/// The base manifests' ServiceAccount.
const SERVICE_ACCOUNT: &str = "nightshift";
/// How long the API server gets to pick up a webhook configuration (it takes a moment).
const STEP: Duration = Duration::from_secs(120);

/// Starts nightshift as the administrator and registers its webhook: a workspace with fresh
/// certificates, the process on free ports, the local overlay applied for the port it reported,
/// `/readyz` green. Dropping the registration removes the webhook configuration again.
pub async fn deploy<'a>(
    c: &'a Cluster,
    name: &str,
) -> Result<(Workspace, Nightshift, Registration<'a>)> {
    deploy_with(c, name, &[]).await
}

/// [`deploy`] with extra options for `nightshift run`.
pub async fn deploy_with<'a>(
    c: &'a Cluster,
    name: &str,
    extra: &[String],
) -> Result<(Workspace, Nightshift, Registration<'a>)> {
    let ws = Workspace::new()?;
    let registration = Registration::new(c);
    let t = Instant::now();
    let mut ns = Nightshift::start_with(c, name, &c.kubeconfig, &ws.certs(), 0, extra).await?;
    ws.apply_local_overlay(c, ns.webhook.port())?;
    ns.wait_ready().await?;
    eprintln!(
        "{name}: started and ready in {:.2} s (webhook https://{}, admin http://{})",
        t.elapsed().as_secs_f64(),
        ns.webhook,
        ns.admin
    );
    Ok((ws, ns, registration))
}

/// Waits until the API server sends research pods to the webhook: the webhook configuration is
/// read by the API server through a watch, so it takes effect a moment after it is applied. A
/// server-side dry-run of a research pod shows when the mutation happens.
pub async fn wait_webhook_active(c: &Cluster, research_ns: &str) -> Result<Duration> {
    let t = Instant::now();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), research_ns);
    let probe: Pod = serde_json::from_value(research_pod("webhook-probe", &[]))?;
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait::until("the webhook to mutate research pods", STEP, || async {
        c.check_processes()?;
        Ok(match pods.create(&dry, &probe).await {
            Ok(p) if priority_class(&p) == Some(RESEARCH_CLASS) => Check::Done(()),
            Ok(p) => Check::Pending(format!("class {:?}", priority_class(&p))),
            Err(e) => Check::Pending(e.to_string()),
        })
    })
    .await?;
    Ok(t.elapsed())
}

/// A kubeconfig in `ws` with a token of the base manifests' ServiceAccount (whose overlay must
/// be applied): nightshift started with it has the base rules and nothing else.
pub fn service_account_kubeconfig(c: &Cluster, ws: &Workspace) -> Result<PathBuf> {
    let token = kubectl_ok(
        c,
        &[
            "-n",
            NAMESPACE,
            "create",
            "token",
            SERVICE_ACCOUNT,
            "--duration=1h",
        ],
        None,
    )?;
    let kubeconfig = ws.root().join("serviceaccount.kubeconfig");
    token_kubeconfig(c, token.trim(), &kubeconfig)?;
    Ok(kubeconfig)
}

/// Lines of nightshift's log that mention a refused API call.
pub fn forbidden_lines(ns: &Nightshift) -> Vec<String> {
    ns.log()
        .lines()
        .filter(|l| l.to_lowercase().contains("forbidden"))
        .map(str::to_string)
        .collect()
}
