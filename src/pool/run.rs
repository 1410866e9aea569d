//! The running GPU-pool controller: leader election over a Lease, the node and pod watches
//! feeding the [`Controller`], the label patches it asks for, and the `/status` route.
//!
//! Transport only: every decision is the controller's. Started by [`start`].

use std::sync::{Arc, Mutex, MutexGuard};

use axum::{Json, Router, extract::State, routing::get};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::{
    Api,
    api::{Patch, PatchParams},
    runtime::{
        WatchStreamExt,
        events::{Event, EventType, Recorder, Reporter},
        watcher,
    },
};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::{
    Error, PoolArgs,
    controller::{Controller, MAX_NOTICES, Metrics},
    deliver::{Deliverer, DeliveryMetrics, DemandSource, NOTICE_INTERVAL, read_services},
    lease::{Elector, LeaseClient, Timing},
    marks::LabelPatch,
    node_selector,
    notices::{OwnerNotice, PodNotice},
    reclaim,
};
use crate::{core::vocabulary::Vocabulary, runtime::Context, runtime::admin::ReadyHandle};

/// Field manager name for the label patches.
const FIELD_MANAGER: &str = "nightshift-pool";
/// How often marks are recomputed: events arrive in bursts (a job of 64 pods), so reconciling
/// once a second patches each node once per burst, not once per pod, and keeps marks at most a
/// second behind.
const RECONCILE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Starts the GPU-pool controller with the shared names: watches, leader election, marks,
/// events on disrupted research pods, metrics, `/status`. Returns the running controller (`None`
/// without a cluster), for the researchers' view.
pub async fn start(
    args: PoolArgs,
    vocabulary: Vocabulary,
    demand: Option<Arc<dyn DemandSource>>,
    ctx: &mut Context,
) -> Result<Option<Shared>, Error> {
    let PoolArgs {
        lending,
        lease_namespace,
        lease_name,
        identity,
        lease_duration,
        notice,
    } = args;
    let selector = node_selector(&vocabulary)?;
    let policy = lending.policy(vocabulary)?;
    let notice_policy = notice.policy()?;
    let Some(client) = ctx.kube.clone() else {
        tracing::warn!(
            "no Kubernetes cluster: the GPU-pool controller is off (no spare marks, no preemption \
             tracking; /status answers 503)"
        );
        ctx.add_admin_routes(off_routes());
        return Ok(None);
    };
    let identity = identity
        .or_else(|| std::env::var("POD_NAME").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("nightshift-{}", std::process::id()));
    tracing::info!(
        %identity,
        %selector,
        resource = %policy.vocabulary.gpu_resource,
        headroom = policy.headroom,
        windows = %policy.windows,
        "starting the GPU-pool controller"
    );
    let patcher = KubePatcher {
        nodes: Api::all(client.clone()),
        vocabulary: policy.vocabulary.clone(),
    };
    let metrics = Metrics::default();
    metrics.register(&mut ctx.registry);
    let resource = policy.vocabulary.gpu_resource.clone();
    let mut c = Controller::new(policy, metrics);
    c.set_notice_policy(notice_policy);
    let controller: Shared = Arc::new(Mutex::new(c));
    ctx.add_admin_routes(status_routes(controller.clone()));
    let ready = ctx.readiness.register("pool caches synced");

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.to_string(),
            instance: Some(identity.clone()),
        },
    );
    let (notice_tx, notice_rx) = mpsc::channel(MAX_NOTICES);
    ctx.supervisor.spawn("pool-events", async move {
        publish_notices(recorder, notice_rx).await;
        Ok(())
    });
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
    match demand.filter(|_| notice.enabled) {
        Some(scaler) => {
            let delivery = DeliveryMetrics::default();
            delivery.register(&mut ctx.registry);
            let deliverer = Deliverer::new(client.clone(), delivery).map_err(Error::HookClient)?;
            let (client, controller, token) = (client.clone(), controller.clone(), token.clone());
            ctx.supervisor.spawn("pool-notices", async move {
                give_notices(client, scaler, resource, controller, deliverer, token).await;
                Ok(())
            });
        }
        None if notice.enabled => tracing::info!(
            "reclaim notices are off: they need the scaler in the same process (`nightshift run`)"
        ),
        None => tracing::info!("reclaim notices are off (--pool-notices=false)"),
    }
    ctx.supervisor.spawn("pool-controller", {
        let controller = controller.clone();
        async move {
            watch_and_patch(
                client,
                selector,
                controller,
                Outputs {
                    patcher,
                    notices: notice_tx,
                },
                leader_rx,
                ready,
                token,
            )
            .await?;
            Ok(())
        }
    });
    Ok(Some(controller))
}

/// Decides and delivers reclaim notices every [`NOTICE_INTERVAL`] while leading, until
/// shutdown. A pass whose ScaledObjects cannot be read is skipped: the notices stand.
async fn give_notices(
    client: kube::Client,
    scaler: Arc<dyn DemandSource>,
    resource: String,
    controller: Shared,
    deliverer: Deliverer,
    token: CancellationToken,
) {
    let mut tick = tokio::time::interval(NOTICE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        if !lock(&controller).is_leader() {
            continue;
        }
        let Some(services) = read_services(&client, scaler.as_ref(), &resource).await else {
            continue;
        };
        let changes = lock(&controller).notice_pass(&services, Timestamp::now());
        for change in changes {
            if let Err(e) = deliverer.deliver(&change).await {
                tracing::warn!(pod = %change.pod.id(), error = %e, "reclaim notice not delivered; retrying next pass");
                if matches!(change.action, reclaim::Action::Give { .. }) {
                    lock(&controller).notice_undelivered(&change.pod.key);
                }
            }
        }
    }
}

/// One Event to publish: on a research pod, or on its Job or Workflow.
struct Publication {
    regarding: ObjectReference,
    event: Event,
}

fn event(reason: &'static str, action: &'static str, warning: bool, note: &str) -> Event {
    Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_string(),
        note: Some(note.to_string()),
        action: action.to_string(),
        secondary: None,
    }
}

impl From<PodNotice> for Publication {
    fn from(n: PodNotice) -> Self {
        Self {
            event: event(n.reason, n.action, n.warning, &n.note),
            regarding: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(n.namespace),
                name: Some(n.name),
                uid: n.uid,
                ..ObjectReference::default()
            },
        }
    }
}

impl From<OwnerNotice> for Publication {
    fn from(n: OwnerNotice) -> Self {
        Self {
            event: event(n.reason, n.action, n.warning, &n.note),
            regarding: ObjectReference {
                api_version: Some(n.owner.kind.api_version().into()),
                kind: Some(n.owner.kind.kind().into()),
                namespace: Some(n.namespace),
                name: Some(n.owner.name),
                uid: Some(n.owner.uid),
                ..ObjectReference::default()
            },
        }
    }
}

/// Publishes the controller's notices as `events.k8s.io/v1` Events on the research pods and
/// their owners, until the sending side closes (at shutdown). kube's recorder turns a repeat of
/// the same event within minutes into a series (one Event, a count) instead of a new object.
async fn publish_notices(recorder: Recorder, mut notices: mpsc::Receiver<Publication>) {
    while let Some(Publication { regarding, event }) = notices.recv().await {
        let namespace = regarding.namespace.as_deref().unwrap_or_default();
        let kind = regarding.kind.as_deref().unwrap_or_default();
        let name = regarding.name.as_deref().unwrap_or_default();
        match recorder.publish(&event, &regarding).await {
            Ok(()) => {
                tracing::debug!(%namespace, %kind, %name, reason = %event.reason, "event published")
            }
            Err(e) => {
                tracing::warn!(
                    error = %e, %namespace, %kind, %name, reason = %event.reason,
                    "could not publish an event on a research pod or its owner"
                )
            }
        }
    }
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

/// Where the watch loop sends what the controller decides: label patches to the API server,
/// notices to the event publisher.
struct Outputs {
    patcher: KubePatcher,
    notices: mpsc::Sender<Publication>,
}

/// Feeds the controller from the watches of pool nodes and of every pod, follows the
/// leadership, and sends the patches the controller asks for on every tick. Runs until shutdown
/// (or until a watch ends, which is an error).
async fn watch_and_patch(
    client: kube::Client,
    selector: String,
    controller: Shared,
    Outputs { patcher, notices }: Outputs,
    mut leader: watch::Receiver<bool>,
    ready: ReadyHandle,
    token: CancellationToken,
) -> Result<(), Error> {
    let mut nodes = watcher(
        Api::<Node>::all(client.clone()),
        watcher::Config::default().labels(&selector),
    )
    .default_backoff()
    .boxed();
    let mut pods = watcher(Api::<Pod>::all(client), watcher::Config::default())
        .default_backoff()
        .boxed();
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
                let (on_pods, on_owners) = {
                    let mut c = lock(&controller);
                    (c.take_notices(), c.take_owner_notices())
                };
                let publications = on_pods
                    .into_iter()
                    .map(Publication::from)
                    .chain(on_owners.into_iter().map(Publication::from));
                for p in publications {
                    if notices.try_send(p).is_err() {
                        tracing::warn!("too many events waiting to be published; one dropped");
                    }
                }
            }
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

/// Sends spare-mark label patches.
pub trait NodePatcher {
    fn patch(
        &self,
        patch: &LabelPatch,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send;
}

/// Patches node labels through the API server (merge patch of `metadata.labels`), with the
/// label names of `vocabulary`.
pub struct KubePatcher {
    pub nodes: Api<Node>,
    pub vocabulary: Vocabulary,
}

impl NodePatcher for KubePatcher {
    async fn patch(&self, patch: &LabelPatch) -> Result<(), Error> {
        let params = PatchParams::default();
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..params
        };
        let merge = Patch::Merge(patch.merge_patch(&self.vocabulary));
        match self.nodes.patch(&patch.node, &params, &merge).await {
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

/// The controller, shared between the watch loop and the `/status` and view handlers.
pub type Shared = Arc<Mutex<Controller>>;

/// Locks the shared controller.
pub fn lock(c: &Mutex<Controller>) -> MutexGuard<'_, Controller> {
    // The controller's methods leave it consistent between statements; a panic elsewhere while
    // holding the lock does not make the data unusable.
    c.lock().unwrap_or_else(|p| p.into_inner())
}
