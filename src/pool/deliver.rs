//! Reclaim notices, the transport: reads what each inference service needs (its ScaledObject's
//! nightshift trigger evaluated by the scaler of this process, its scale target's replicas and
//! GPUs per replica) and delivers the controller's decisions to research pods: the
//! `nightshift.io/reclaim-notice` annotation, the `nightshift.io/ReclaimNotice` condition, and a
//! POST to the checkpoint endpoint a pod declares.
//!
//! Every decision is [`super::reclaim`]'s; this part only reads and writes. Nothing here blocks
//! the controller: the API calls run on their own task, checkpoint calls on tasks of their own,
//! bounded in time and in number.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::future::BoxFuture;
use jiff::Timestamp;
use k8s_openapi::api::{
    apps::v1::{Deployment, StatefulSet},
    core::v1::{Pod, PodTemplateSpec},
};
use kube::{
    Api,
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use serde_json::json;
use tokio::sync::Semaphore;

use super::{
    accounting::{Hook, pod_gpu_request},
    reclaim::{Action, Change, ServiceDemand},
};
use crate::core::vocabulary::{
    RECLAIM_NOTICE_ANNOTATION, RECLAIM_NOTICE_CONDITION, RECLAIM_NOTICE_SERVICE_ANNOTATION,
};

// How often notices are decided, shared with the simulator.
pub use crate::core::notice::NOTICE_INTERVAL;

/// ScaledObjects read per pass: far more inference services than one GPU pool serves; beyond
/// it the rest are left out of notices (logged), so a cluster of thousands of unrelated
/// ScaledObjects does not make every pass thousands of reads.
pub const MAX_SERVICES: usize = 256;

/// A checkpoint endpoint has this long to answer: the call is a signal, not the checkpoint.
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(2);

/// Checkpoint calls in flight at once: a burst notice to a 64-pod Job calls 64 pods; beyond
/// 32 concurrent calls, the rest wait their turn (each is bounded by [`HOOK_TIMEOUT`]).
pub const MAX_HOOK_CALLS: usize = 32;

/// Field manager of the pod patches.
const FIELD_MANAGER: &str = "nightshift-pool";

/// What the scaler makes of one ScaledObject trigger.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Evaluated {
    /// Not a nightshift trigger (its metadata is not ours, or the source policy refuses it).
    NotOurs,
    /// Demand in replicas.
    Demand(f64),
    /// Ours, but the source could not be read now.
    Failed,
}

/// Evaluates a ScaledObject's trigger metadata into demand: the scaler of this process, wired
/// in by the binary.
pub trait DemandSource: Send + Sync {
    fn evaluate(
        &self,
        namespace: String,
        name: String,
        metadata: TriggerMetadata,
    ) -> BoxFuture<'static, Evaluated>;
}

/// A trigger's `metadata` as KEDA hands it to a scaler: every value a string, keys in order.
pub type TriggerMetadata = BTreeMap<String, String>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// Metrics of the delivery (registered under `nightshift_pool_*`).
#[derive(Clone, Debug, Default)]
pub struct DeliveryMetrics {
    hook_calls: Family<ResultLabel, Counter>,
}

impl DeliveryMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "pool_checkpoint_calls",
            "Calls to research pods' checkpoint endpoints on a reclaim notice, by result",
            self.hook_calls.clone(),
        );
    }
}

/// The KEDA ScaledObject resource.
fn scaled_objects() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "keda.sh",
        "v1alpha1",
        "ScaledObject",
    ))
}

/// Reads every inference service's demand, replicas and GPUs per replica. `None` when the
/// ScaledObjects cannot be listed (no KEDA, no permission, API server away): the pass is
/// skipped and the notices stand.
pub async fn read_services(
    client: &kube::Client,
    scaler: &dyn DemandSource,
    resource: &str,
) -> Option<Vec<ServiceDemand>> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &scaled_objects());
    let list = match api.list(&ListParams::default()).await {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(error = %e, "cannot list ScaledObjects: no reclaim notice this pass");
            return None;
        }
    };
    if list.items.len() > MAX_SERVICES {
        tracing::warn!(
            count = list.items.len(),
            max = MAX_SERVICES,
            "more ScaledObjects than reclaim notices follow; the rest are left out"
        );
    }
    let mut services = Vec::new();
    for so in list.items.into_iter().take(MAX_SERVICES) {
        if let Some(s) = read_service(client, scaler, resource, so).await {
            services.push(s);
        }
    }
    Some(services)
}

/// One ScaledObject: its first trigger the scaler takes as its own, and its scale target.
async fn read_service(
    client: &kube::Client,
    scaler: &dyn DemandSource,
    resource: &str,
    so: DynamicObject,
) -> Option<ServiceDemand> {
    let namespace = so.metadata.namespace.clone()?;
    let name = so.metadata.name.clone()?;
    let spec = so.data.get("spec")?;
    let mut demand = None;
    for trigger in spec.get("triggers")?.as_array()? {
        let kind = trigger.get("type").and_then(|t| t.as_str()).unwrap_or("");
        if kind != "external" && kind != "external-push" {
            continue;
        }
        let Some(metadata) = string_map(trigger.get("metadata")) else {
            continue;
        };
        match scaler
            .evaluate(namespace.clone(), name.clone(), metadata)
            .await
        {
            Evaluated::NotOurs => continue,
            Evaluated::Demand(d) => demand = Some(Some(d)),
            Evaluated::Failed => demand = Some(None),
        }
        break;
    }
    let demand = demand?;
    let target = spec.get("scaleTargetRef")?;
    let target_name = target.get("name")?.as_str()?;
    let kind = target
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or("Deployment");
    let (replicas, template) = match read_target(client, &namespace, kind, target_name).await {
        Ok(found) => found,
        Err(why) => {
            tracing::debug!(%namespace, scaled_object = %name, %why, "no reclaim notice for this service");
            return None;
        }
    };
    let gpus = template_gpus(template, resource)?;
    Some(ServiceDemand {
        namespace,
        name,
        demand,
        replicas,
        gpus_per_replica: u32::try_from(gpus).ok()?,
    })
}

/// A trigger's metadata as strings (KEDA's own rule: every value is a string).
fn string_map(v: Option<&serde_json::Value>) -> Option<TriggerMetadata> {
    v?.as_object()?
        .iter()
        .map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

/// The replicas asked of a Deployment or StatefulSet, and its pod template. Other kinds (custom
/// resources with a scale subresource) are not followed.
async fn read_target(
    client: &kube::Client,
    namespace: &str,
    kind: &str,
    name: &str,
) -> Result<(u32, Option<PodTemplateSpec>), String> {
    let as_count = |r: Option<i32>| u32::try_from(r.unwrap_or(1)).unwrap_or(0);
    match kind {
        "Deployment" => {
            let d = Api::<Deployment>::namespaced(client.clone(), namespace)
                .get(name)
                .await
                .map_err(|e| e.to_string())?;
            let spec = d.spec.ok_or("no spec")?;
            Ok((as_count(spec.replicas), Some(spec.template)))
        }
        "StatefulSet" => {
            let s = Api::<StatefulSet>::namespaced(client.clone(), namespace)
                .get(name)
                .await
                .map_err(|e| e.to_string())?;
            let spec = s.spec.ok_or("no spec")?;
            Ok((as_count(spec.replicas), Some(spec.template)))
        }
        other => Err(format!("scale target kind {other} is not followed")),
    }
}

/// GPUs one replica of `template` requests (`None` when it asks for none or is unreadable).
fn template_gpus(template: Option<PodTemplateSpec>, resource: &str) -> Option<u64> {
    let pod = Pod {
        spec: template?.spec,
        ..Pod::default()
    };
    pod_gpu_request(&pod, resource).filter(|g| *g > 0)
}

/// Delivers notices to pods through the API server, and calls checkpoint endpoints.
#[derive(Clone)]
pub struct Deliverer {
    client: kube::Client,
    http: reqwest::Client,
    calls: Arc<Semaphore>,
    metrics: DeliveryMetrics,
}

impl Deliverer {
    pub fn new(client: kube::Client, metrics: DeliveryMetrics) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(HOOK_TIMEOUT)
            .connect_timeout(HOOK_TIMEOUT)
            // The endpoint is the pod's own: never follow it elsewhere.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()?;
        Ok(Self {
            client,
            http,
            calls: Arc::new(Semaphore::new(MAX_HOOK_CALLS)),
            metrics,
        })
    }

    /// Delivers one change. `Err` when the annotation could not be written (the controller
    /// gives the notice again next pass); the condition and the endpoint are best effort.
    pub async fn deliver(&self, change: &Change) -> Result<(), kube::Error> {
        let pod = &change.pod;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        match &change.action {
            Action::Give { at, service, hook } => {
                annotate(&pods, &pod.name, Some((at, service.as_str()))).await?;
                let message = format!(
                    "inference service {service} is about to need this pod's GPUs: checkpoint now"
                );
                condition(&pods, &pod.name, true, "InferenceScalingUp", &message, at).await;
                if let Some(hook) = hook {
                    self.call(hook.clone(), pod.id(), *at, service.clone());
                }
            }
            Action::Withdraw => {
                annotate(&pods, &pod.name, None).await?;
                let message = "inference demand fell back; the pod keeps its GPUs";
                let now = Timestamp::now();
                condition(&pods, &pod.name, false, "DemandFellBack", message, &now).await;
            }
        }
        Ok(())
    }

    /// POSTs the notice to the pod's checkpoint endpoint on a task of its own.
    fn call(&self, hook: Hook, pod: String, at: Timestamp, service: String) {
        if !allowed(&hook) {
            tracing::warn!(%pod, ip = %hook.ip, "checkpoint endpoint address refused");
            self.count("refused");
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let Ok(_permit) = this.calls.clone().acquire_owned().await else {
                return;
            };
            let body = json!({
                "pod": pod,
                "noticeAt": at.to_string(),
                "service": service,
                "reason": "InferenceScalingUp",
            });
            match post(&this.http, &hook.url(), &body).await {
                Ok(_) => {
                    tracing::info!(%pod, url = %hook.url(), "checkpoint endpoint called");
                    this.count("ok");
                }
                Err(e) => {
                    tracing::warn!(%pod, url = %hook.url(), error = %e, "checkpoint endpoint failed");
                    this.count(if e.is_timeout() { "timeout" } else { "error" });
                }
            }
        });
    }

    fn count(&self, result: &'static str) {
        self.metrics
            .hook_calls
            .get_or_create(&ResultLabel { result })
            .inc();
    }
}

/// One POST of a notice; an answer other than 2xx is an error.
async fn post(http: &reqwest::Client, url: &str, body: &serde_json::Value) -> reqwest::Result<()> {
    http.post(url)
        .json(body)
        .send()
        .await?
        .error_for_status()
        .map(drop)
}

/// Whether nightshift may call this address for a pod. A pod's address is given by the
/// kubelet, not its author, yet a host-network pod has its node's: loopback, unspecified,
/// link-local (the cloud metadata endpoint) and multicast are refused, so a pod cannot make
/// nightshift reach its own host's local services.
fn allowed(hook: &Hook) -> bool {
    let ip = hook.ip;
    let link_local = match ip {
        std::net::IpAddr::V4(v4) => v4.is_link_local() || v4.is_broadcast(),
        std::net::IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    !(ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() || link_local)
}

/// Sets (`Some`: when, and for which service) or removes (`None`) the notice annotations.
async fn annotate(
    pods: &Api<Pod>,
    name: &str,
    notice: Option<(&Timestamp, &str)>,
) -> Result<(), kube::Error> {
    let at = notice.map(|(at, _)| serde_json::Value::String(at.to_string()));
    let service = notice.map(|(_, service)| serde_json::Value::String(service.to_string()));
    let patch = json!({"metadata": {"annotations": {
        RECLAIM_NOTICE_ANNOTATION: at,
        RECLAIM_NOTICE_SERVICE_ANNOTATION: service,
    }}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    match pods.patch(name, &params, &Patch::Merge(patch)).await {
        Ok(_) => Ok(()),
        // The pod is gone: nothing left to tell.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Sets the notice condition (a strategic merge on `status.conditions`, keyed by type, so the
/// kubelet's conditions are untouched). Best effort: the annotation is the notice of record.
async fn condition(
    pods: &Api<Pod>,
    name: &str,
    on: bool,
    reason: &str,
    message: &str,
    at: &Timestamp,
) {
    let patch = json!({"status": {"conditions": [{
        "type": RECLAIM_NOTICE_CONDITION,
        "status": if on { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "lastTransitionTime": at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    }]}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    if let Err(e) = pods
        .patch_status(name, &params, &Patch::Strategic(patch))
        .await
    {
        tracing::warn!(pod = %name, error = %e, "reclaim notice condition not set");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(ip: &str) -> Hook {
        Hook {
            ip: ip.parse().expect("ip"),
            port: 8080,
            path: "/checkpoint".into(),
        }
    }

    #[test]
    fn a_pod_address_is_called_and_host_local_ones_refused() {
        assert!(allowed(&hook("10.244.1.7")));
        assert!(allowed(&hook("fd00::7")));
        for ip in [
            "127.0.0.1",
            "0.0.0.0",
            "169.254.169.254",
            "::1",
            "fe80::1",
            "224.0.0.1",
        ] {
            assert!(!allowed(&hook(ip)), "{ip}");
        }
        assert_eq!(hook("fd00::7").url(), "http://[fd00::7]:8080/checkpoint");
    }

    #[tokio::test]
    async fn a_checkpoint_endpoint_that_never_answers_is_given_up_after_the_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/checkpoint", listener.local_addr().expect("addr"));
        // Accepts, reads nothing, never answers.
        let hung = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(200))
            .build()
            .expect("client");
        let t = std::time::Instant::now();
        let err = post(&client, &url, &json!({}))
            .await
            .expect_err("no answer");
        assert!(err.is_timeout(), "{err}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        hung.abort();
    }

    #[tokio::test]
    async fn a_checkpoint_endpoint_answering_an_error_is_an_error() {
        let app = axum::Router::new().route(
            "/checkpoint",
            axum::routing::post(|| async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/checkpoint", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let client = reqwest::Client::new();
        assert!(post(&client, &url, &json!({"pod": "a/b"})).await.is_err());
        server.abort();
    }

    #[test]
    fn trigger_metadata_must_be_strings() {
        let m = string_map(Some(&json!({"model": "m", "targetWaiting": "4"}))).expect("map");
        assert_eq!(m.get("model").map(String::as_str), Some("m"));
        assert!(string_map(Some(&json!({"targetWaiting": 4}))).is_none());
        assert!(string_map(Some(&json!("text"))).is_none());
    }

    #[test]
    fn a_replica_s_gpus_come_from_the_template() {
        let template: PodTemplateSpec = serde_json::from_value(json!({"spec": {"containers": [
            {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": "4"}}}
        ]}}))
        .expect("template");
        assert_eq!(template_gpus(Some(template), "nvidia.com/gpu"), Some(4));
        let cpu: PodTemplateSpec =
            serde_json::from_value(json!({"spec": {"containers": [{"name": "c"}]}}))
                .expect("template");
        assert_eq!(template_gpus(Some(cpu), "nvidia.com/gpu"), None);
    }
}
