//! `nightshift status`: a one-shot [`StatusReport`], computed from the cluster with the local
//! kubeconfig (no marks are written) or fetched from a running nightshift's admin server.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, api::ListParams, runtime::watcher};

use super::{
    Error, LendingArgs, StatusArgs, accounting,
    controller::{Controller, Metrics},
    node_selector,
    status::StatusReport,
};
use crate::core::vocabulary::Vocabulary;

/// Page size of the one-shot pod listing (the API server's usual page).
const LIST_PAGE: u32 = 500;

/// `nightshift status`: the report as text (or JSON). The names are read only when the report
/// is computed here; a running server reports with its own.
pub async fn status_command(args: StatusArgs, vocabulary: Vocabulary) -> Result<String, Error> {
    let report = match &args.from {
        Some(base) => report_from_server(base).await?,
        None => {
            let client = kube::Client::try_default().await.map_err(Error::Connect)?;
            report_from_cluster(client, &args.lending, vocabulary).await?
        }
    };
    if args.json {
        Ok(serde_json::to_string_pretty(&report).unwrap_or_default() + "\n")
    } else {
        Ok(report.render())
    }
}

/// Builds a one-shot status report straight from the cluster with the shared names (no marks
/// are written).
pub async fn report_from_cluster(
    client: kube::Client,
    lending: &LendingArgs,
    vocabulary: Vocabulary,
) -> Result<StatusReport, Error> {
    let selector = node_selector(&vocabulary)?;
    let nodes_api: Api<Node> = Api::all(client.clone());
    let pods_api: Api<Pod> = Api::all(client);
    let now = Timestamp::now();
    let mut controller = Controller::new(lending.policy(vocabulary)?, Metrics::default());
    let nodes = nodes_api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| Error::List {
            what: "pool nodes",
            source,
        })?;
    controller.on_node_event(watcher::Event::Init);
    for n in nodes {
        controller.on_node_event(watcher::Event::InitApply(n));
    }
    controller.on_node_event(watcher::Event::InitDone);
    controller.on_pod_event(watcher::Event::Init, now);
    let mut params = ListParams::default().limit(LIST_PAGE);
    loop {
        let page = pods_api.list(&params).await.map_err(|source| Error::List {
            what: "pods",
            source,
        })?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        for p in page {
            controller.on_pod_event(watcher::Event::InitApply(p), now);
        }
        match next {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    controller.on_pod_event(watcher::Event::InitDone, now);
    controller.reconcile(now, tokio::time::Instant::now());
    // Disruptions still visible on pods the cluster keeps (failed pods), newest first.
    let mut report = controller.status(now);
    report.leader = None;
    report.recent_disruptions = controller
        .ledger()
        .pods()
        .filter(|p| p.research)
        .filter_map(|p| {
            let d = p.disruption.as_ref()?;
            Some(accounting::DisruptionRecord::new(
                p,
                &d.reason,
                d.at.unwrap_or(now),
            ))
        })
        .collect();
    report
        .recent_disruptions
        .sort_by(|a, b| b.at.cmp(&a.at).then(a.name.cmp(&b.name)));
    Ok(report)
}

/// Fetches the report from a running nightshift's admin server.
pub async fn report_from_server(base: &str) -> Result<StatusReport, Error> {
    let url = format!("{}/status", base.trim_end_matches('/'));
    let fetch = |source| Error::Fetch {
        url: url.clone(),
        source,
    };
    // A status read should answer fast or say why; 10 s covers a loaded cluster's admin port.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(fetch)?;
    let response = client.get(&url).send().await.map_err(fetch)?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(Error::FetchStatus {
            url: url.clone(),
            status: status.as_u16(),
            body,
        });
    }
    response.json().await.map_err(fetch)
}
