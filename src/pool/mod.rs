//! The GPU pool: spare-GPU accounting, spare marks on nodes, preemption tracking and status.
//!
//! - [`accounting`] (pure): GPUs per pool node, protected / lent / free, as the scheduler counts.
//! - [`marks`] (pure): which nodes are spare given the headroom, and the label patches.
//! - [`windows`] (pure): daily lending windows.
//! - [`lease`]: leader election over a Lease, so that one replica writes.
//! - [`controller`]: the state machine between watch events and patches, plus metrics.
//! - [`status`]: the `/status` document and the `nightshift status` table.
//! - `fixtures`: pod and node builders for tests and benchmarks (feature `test-support`).
//!
//! This module wires them to the API server (watches, patches, the Lease) and owns the options
//! and the one error type; it maps errors to HTTP in one place ([`Error::http_status`]).

pub mod accounting;
pub mod controller;
#[cfg(any(test, feature = "test-support"))]
pub mod fixtures;
pub mod lease;
pub mod marks;
pub mod status;
pub mod windows;

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use axum::{Json, Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use clap::Args;
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{admin::ReadyHandle, runtime::Context};
use accounting::DEFAULT_GPU_RESOURCE;
use controller::{Controller, Metrics, Policy};
use lease::{Elector, LeaseClient, LeaseError, Timing};
use marks::LabelPatch;
use status::StatusReport;
use windows::Windows;

/// Label that selects GPU-pool nodes (any value: the pool's name).
pub const POOL_LABEL: &str = "nightshift.io/pool";
/// Node label: `"true"` when research pods may be sent to the node.
pub const SPARE_LABEL: &str = "nightshift.io/spare";
/// Node label: how many GPUs research pods may take on the node.
pub const SPARE_GPUS_LABEL: &str = "nightshift.io/spare-gpus";
/// Field manager name for the label patches.
const FIELD_MANAGER: &str = "nightshift-pool";
/// How often marks are recomputed: events arrive in bursts (a job of 64 pods), so reconciling
/// once a second patches each node once per burst, not once per pod, and keeps marks at most a
/// second behind.
const RECONCILE_INTERVAL: Duration = Duration::from_secs(1);
/// Page size of the one-shot pod listing of `nightshift status` (the API server's usual page).
const LIST_PAGE: u32 = 500;

/// Which nodes form the pool and how spare GPUs are decided (shared by the controller and the
/// `status` command).
#[derive(Clone, Debug, Args)]
pub struct SelectionArgs {
    /// Label selector of the GPU-pool nodes (e.g. `nightshift.io/pool=a100`).
    #[arg(long = "pool-node-selector", env = "NIGHTSHIFT_POOL_NODE_SELECTOR", default_value = POOL_LABEL)]
    pub node_selector: String,

    /// Extended-resource name of GPUs on pool nodes.
    #[arg(long = "pool-gpu-resource", env = "NIGHTSHIFT_POOL_GPU_RESOURCE", default_value = DEFAULT_GPU_RESOURCE)]
    pub gpu_resource: String,

    /// GPUs kept free of research work cluster-wide for inference bursts (whole nodes are
    /// reserved first).
    #[arg(
        long = "pool-headroom",
        env = "NIGHTSHIFT_POOL_HEADROOM",
        default_value_t = 0
    )]
    pub headroom: u64,

    /// Daily lending windows, comma-separated `HH:MM-HH:MM@Zone` (e.g.
    /// `20:00-08:00@Asia/Seoul`); outside them no node is marked spare. Empty: always.
    #[arg(long = "pool-lending-windows", env = "NIGHTSHIFT_POOL_LENDING_WINDOWS", default_value = "", value_parser = parse_windows)]
    pub lending_windows: Windows,
}

fn parse_windows(s: &str) -> Result<Windows, String> {
    s.parse().map_err(|e: windows::WindowError| e.to_string())
}

impl SelectionArgs {
    fn policy(&self) -> Policy {
        Policy {
            gpu_resource: self.gpu_resource.clone(),
            headroom: self.headroom,
            windows: self.lending_windows.clone(),
        }
    }
}

/// Options of the GPU-pool controller.
#[derive(Clone, Debug, Args)]
pub struct PoolArgs {
    #[command(flatten)]
    pub selection: SelectionArgs,

    /// Namespace of the Lease that elects the one replica writing spare marks.
    #[arg(
        long = "pool-lease-namespace",
        env = "NIGHTSHIFT_POOL_LEASE_NAMESPACE",
        default_value = "nightshift-system"
    )]
    pub lease_namespace: String,

    /// Name of that Lease.
    #[arg(
        long = "pool-lease-name",
        env = "NIGHTSHIFT_POOL_LEASE_NAME",
        default_value = "nightshift-pool"
    )]
    pub lease_name: String,

    /// This replica's identity in the Lease (default: `$POD_NAME`, else `$HOSTNAME`).
    #[arg(long = "pool-identity", env = "NIGHTSHIFT_POOL_IDENTITY")]
    pub identity: Option<String>,

    /// How long a silent leader keeps the Lease before a standby takes over (e.g. `15s`).
    #[arg(long = "pool-lease-duration", env = "NIGHTSHIFT_POOL_LEASE_DURATION", default_value = "15s", value_parser = crate::duration::parse_duration)]
    pub lease_duration: Duration,
}

/// Options of `nightshift status`.
#[derive(Clone, Debug, Args)]
pub struct StatusArgs {
    /// Read the status from a running nightshift's admin server (e.g. `http://localhost:8080`)
    /// instead of computing it from the cluster with the local kubeconfig.
    #[arg(long, env = "NIGHTSHIFT_STATUS_FROM")]
    pub from: Option<String>,

    /// Print the JSON document instead of tables.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub selection: SelectionArgs,
}

/// Errors of the GPU pool.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the GPU-pool controller is off: no Kubernetes cluster is configured")]
    Off,
    #[error("the pool node selector must not be empty (e.g. {POOL_LABEL})")]
    EmptySelector,
    #[error("cannot connect to Kubernetes (set KUBECONFIG or use --from URL): {0}")]
    Connect(#[source] kube::Error),
    #[error("listing {what} failed: {source}")]
    List {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("patching the spare marks of node {node} failed: {source}")]
    Patch {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("the watch of {0} ended")]
    WatchEnded(&'static str),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("fetching {url} failed: {source}")]
    Fetch {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url} answered {status}: {body}")]
    FetchStatus {
        url: String,
        status: u16,
        body: String,
    },
}

impl Error {
    /// The HTTP status this error becomes on the admin port.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Error::Off => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> axum::response::Response {
        let body = serde_json::json!({ "error": self.to_string() });
        (self.http_status(), Json(body)).into_response()
    }
}

type Shared = Arc<Mutex<Controller>>;

fn lock(c: &Mutex<Controller>) -> MutexGuard<'_, Controller> {
    // The controller's methods leave it consistent between statements; a panic elsewhere while
    // holding the lock does not make the data unusable.
    c.lock().unwrap_or_else(|p| p.into_inner())
}

/// The `/status` route over a running controller.
pub fn status_routes(controller: Shared) -> Router {
    Router::new()
        .route(
            "/status",
            get(|State(c): State<Shared>| async move {
                let report = lock(&c).status(Timestamp::now());
                Json(report)
            }),
        )
        .with_state(controller)
}

/// The `/status` route when the controller is off.
pub fn off_routes() -> Router {
    Router::new().route("/status", get(|| async { Error::Off }))
}

/// Starts the GPU-pool controller: watches, leader election, marks, metrics, `/status`.
pub async fn start(args: PoolArgs, ctx: &mut Context) -> Result<(), Error> {
    let PoolArgs {
        selection,
        lease_namespace,
        lease_name,
        identity,
        lease_duration,
    } = args;
    if selection.node_selector.trim().is_empty() {
        return Err(Error::EmptySelector);
    }
    let Some(client) = ctx.kube.clone() else {
        tracing::warn!(
            "no Kubernetes cluster: the GPU-pool controller is off (no spare marks, no preemption \
             tracking; /status answers 503)"
        );
        ctx.add_admin_routes(off_routes());
        return Ok(());
    };
    let metrics = Metrics::default();
    metrics.register(&mut ctx.registry);
    let controller: Shared = Arc::new(Mutex::new(Controller::new(selection.policy(), metrics)));
    ctx.add_admin_routes(status_routes(controller.clone()));
    let ready = ctx.readiness.register("pool caches synced");

    let identity = identity
        .or_else(|| std::env::var("POD_NAME").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("nightshift-{}", std::process::id()));
    tracing::info!(
        %identity,
        selector = %selection.node_selector,
        resource = %selection.gpu_resource,
        headroom = selection.headroom,
        windows = %selection.lending_windows,
        "starting the GPU-pool controller"
    );
    let (leader_tx, leader_rx) = watch::channel(false);
    let elector = Elector::new(identity, Timing::from_lease_duration(lease_duration));
    let leases = LeaseClient::new(client.clone(), &lease_namespace, &lease_name);
    let token = ctx.supervisor.shutdown_token();
    ctx.supervisor.spawn("pool-lease", {
        let token = token.clone();
        async move {
            elect(leases, elector, leader_tx, token).await;
            Ok(())
        }
    });
    ctx.supervisor.spawn("pool-controller", async move {
        run(
            client,
            selection.node_selector,
            controller,
            leader_rx,
            ready,
            token,
        )
        .await?;
        Ok(())
    });
    Ok(())
}

/// Runs election rounds until shutdown, publishing whether we lead; releases the Lease at the end.
async fn elect(
    leases: LeaseClient,
    mut elector: Elector,
    leader: watch::Sender<bool>,
    token: CancellationToken,
) {
    loop {
        if let Err(e) = leases.round(&mut elector).await {
            tracing::warn!(error = %e, "pool controller election round failed; retrying");
        }
        let now_leader = elector.is_leader(tokio::time::Instant::now());
        leader.send_if_modified(|l| {
            let changed = *l != now_leader;
            *l = now_leader;
            changed
        });
        tokio::select! {
            () = token.cancelled() => break,
            () = tokio::time::sleep(elector.timing.retry_period) => {}
        }
    }
    leader.send_replace(false);
    if elector.is_leader(tokio::time::Instant::now())
        && let Err(e) = leases.release(&elector).await
    {
        tracing::warn!(error = %e, "could not release the pool controller lease");
    }
}

/// Sends spare-mark label patches.
pub trait NodePatcher {
    fn patch(
        &self,
        patch: &LabelPatch,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send;
}

/// Patches node labels through the API server (merge patch of `metadata.labels`).
pub struct KubePatcher(pub Api<Node>);

impl NodePatcher for KubePatcher {
    async fn patch(&self, patch: &LabelPatch) -> Result<(), Error> {
        let params = PatchParams::default();
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..params
        };
        match self
            .0
            .patch(&patch.node, &params, &Patch::Merge(patch.merge_patch()))
            .await
        {
            Ok(_) => Ok(()),
            // The node is gone: nothing to unmark.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(source) => Err(Error::Patch {
                node: patch.node.clone(),
                source,
            }),
        }
    }
}

/// One reconcile pass: recompute, then send the patches (outside the lock).
pub async fn reconcile_once(controller: &Mutex<Controller>, patcher: &impl NodePatcher) -> usize {
    let patches = lock(controller).reconcile(Timestamp::now(), tokio::time::Instant::now());
    let mut sent = 0;
    for p in &patches {
        match patcher.patch(p).await {
            Ok(()) => {
                tracing::info!(node = %p.node, spare_gpus = p.spare_gpus, "spare marks updated");
                lock(controller).patched(p);
                sent += 1;
            }
            Err(e) => {
                tracing::warn!(error = %e, "spare marks not updated; retrying next pass");
                lock(controller).metrics().patched(false);
            }
        }
    }
    sent
}

async fn run(
    client: kube::Client,
    selector: String,
    controller: Shared,
    mut leader: watch::Receiver<bool>,
    ready: ReadyHandle,
    token: CancellationToken,
) -> Result<(), Error> {
    let nodes_api: Api<Node> = Api::all(client.clone());
    let pods_api: Api<Pod> = Api::all(client);
    let mut nodes = watcher(
        nodes_api.clone(),
        watcher::Config::default().labels(&selector),
    )
    .default_backoff()
    .boxed();
    let mut pods = watcher(pods_api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let patcher = KubePatcher(nodes_api);
    let mut tick = tokio::time::interval(RECONCILE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = token.cancelled() => return Ok(()),
            event = nodes.next() => match event {
                Some(Ok(e)) => lock(&controller).on_node_event(e),
                Some(Err(e)) => tracing::warn!(error = %e, "pool node watch failed; retrying"),
                None => return Err(Error::WatchEnded("nodes")),
            },
            event = pods.next() => match event {
                Some(Ok(e)) => lock(&controller).on_pod_event(e, Timestamp::now()),
                Some(Err(e)) => tracing::warn!(error = %e, "pod watch failed; retrying"),
                None => return Err(Error::WatchEnded("pods")),
            },
            changed = leader.changed() => {
                if changed.is_err() {
                    // The election task ended: only at shutdown.
                    return Ok(());
                }
                let now_leader = *leader.borrow_and_update();
                tracing::info!(leader = now_leader, "pool controller leadership changed");
                lock(&controller).set_leader(now_leader);
            }
            _ = tick.tick() => {
                reconcile_once(&controller, &patcher).await;
                ready.set(lock(&controller).synced());
            }
        }
    }
}

/// Builds a one-shot status report straight from the cluster (no marks are written).
pub async fn report_from_cluster(
    client: kube::Client,
    selection: &SelectionArgs,
) -> Result<StatusReport, Error> {
    let nodes_api: Api<Node> = Api::all(client.clone());
    let pods_api: Api<Pod> = Api::all(client);
    let now = Timestamp::now();
    let mut controller = Controller::new(selection.policy(), Metrics::default());
    let nodes = nodes_api
        .list(&ListParams::default().labels(&selection.node_selector))
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
            let at = d.at.unwrap_or(now);
            Some(accounting::DisruptionRecord {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                node: p.node.clone(),
                reason: d.reason.clone(),
                ran_seconds: p.started.map(|s| at.duration_since(s).as_secs().max(0)),
                gpus: p.gpus.unwrap_or(0),
                at,
            })
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

/// `nightshift status`: the report as text (or JSON).
pub async fn status_command(args: StatusArgs) -> Result<String, Error> {
    let report = match &args.from {
        Some(base) => report_from_server(base).await?,
        None => {
            let client = kube::Client::try_default().await.map_err(Error::Connect)?;
            report_from_cluster(client, &args.selection).await?
        }
    };
    if args.json {
        Ok(serde_json::to_string_pretty(&report).unwrap_or_default() + "\n")
    } else {
        Ok(report.render())
    }
}
