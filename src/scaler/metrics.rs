//! The scaler's own metrics: requests by RPC and status code, request latency, the last demand
//! reported and the last demand measured per ScaledObject (they differ when a forecast decided;
//! the forecast's rebuild after a restart reads the measured one), the forecast rebuilds, and the
//! capacity per replica learned for the ScaledObjects with learned capacity.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, atomic::AtomicU64},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// The measured-demand gauge's name without the registry's prefix (`nightshift_`): the
/// forecast's rebuild queries it by this name.
pub const MEASURED_DEMAND: &str = "scaler_measured_demand_replicas";

/// The measured-demand gauge's `service` label: the service the trigger reads
/// ([`super::metadata::TriggerConfig::service`]) as 16 hex digits.
pub fn service_label(service: u64) -> String {
    format!("{service:016x}")
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    rpc: &'static str,
    code: &'static str,
}

/// The gRPC status code's name as the `code` label shows it (`Ok`, `InvalidArgument`, …): a
/// static name, so that counting a call allocates nothing.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "Ok",
        Code::Cancelled => "Cancelled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcOnly {
    rpc: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ObjectLabels {
    namespace: String,
    scaled_object: String,
}

impl ObjectLabels {
    fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            scaled_object: name.to_string(),
        }
    }
}

/// A ScaledObject's measured demand, by the service its trigger read: a forecast rebuilt after a
/// restart reads only the demand of the service the trigger reads now.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MeasuredLabels {
    namespace: String,
    scaled_object: String,
    service: String,
}

impl MeasuredLabels {
    fn new(namespace: &str, name: &str, service: u64) -> Self {
        Self {
            namespace: namespace.to_string(),
            scaled_object: name.to_string(),
            service: service_label(service),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CapacityLabels {
    namespace: String,
    scaled_object: String,
    /// `prompt` or `generated` tokens.
    kind: &'static str,
}

/// The two kinds of token rate a capacity is learned for, as labelled.
const TOKEN_KINDS: [&str; 2] = ["prompt", "generated"];

fn rpc_histogram() -> Histogram {
    // 50 µs .. ~1.6 s: a cached answer takes tens of microseconds, an uncached one the
    // upstream's latency.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.00005, 2.0, 16,
    ))
}

/// Handle to the scaler metrics; cheap to clone.
#[derive(Clone)]
pub struct ScalerMetrics {
    requests: Family<RpcLabels, Counter>,
    duration: Family<RpcOnly, Histogram, fn() -> Histogram>,
    demand: Family<ObjectLabels, Gauge<f64, AtomicU64>>,
    measured: Family<MeasuredLabels, Gauge<f64, AtomicU64>>,
    /// Each ScaledObject's demand series, by namespace and name.
    series: Arc<Mutex<HashMap<String, HashMap<String, ObjectSeries>>>>,
    pods: Family<ObjectLabels, Gauge>,
    rebuilds: Family<OutcomeLabels, Counter>,
    capacity: Family<CapacityLabels, Gauge<f64, AtomicU64>>,
    capacity_samples: Family<ObjectLabels, Gauge>,
}

impl Default for ScalerMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(rpc_histogram),
            demand: Family::default(),
            measured: Family::default(),
            series: Arc::default(),
            pods: Family::default(),
            rebuilds: Family::default(),
            capacity: Family::default(),
            capacity_samples: Family::default(),
        }
    }
}

impl ScalerMetrics {
    /// Registers the metrics (names get the registry's prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "scaler_requests",
            "gRPC requests from KEDA, by RPC and status code",
            self.requests.clone(),
        );
        registry.register(
            "scaler_request_duration_seconds",
            "Time to answer KEDA's gRPC requests, by RPC",
            self.duration.clone(),
        );
        registry.register(
            "scaler_demand_replicas",
            "Last demand reported per ScaledObject, in replicas (the HPA target is this × 100 / 100)",
            self.demand.clone(),
        );
        registry.register(
            MEASURED_DEMAND,
            "Last demand measured per ScaledObject, in replicas, before any forecast raised it \
             (what the forecast learns from)",
            self.measured.clone(),
        );
        registry.register(
            "scaler_forecast_rebuilds",
            "Rebuilds of a ScaledObject's forecast from Prometheus after a start, by outcome (ok, \
             failed)",
            self.rebuilds.clone(),
        );
        registry.register(
            "scaler_pods",
            "Pods that reported readings at the last demand decision per ScaledObject (the \
             replicas serving)",
            self.pods.clone(),
        );
        registry.register(
            "scaler_learned_capacity_tokens_per_second",
            "Tokens per second one replica sustains while requests queue, learned per \
             ScaledObject with learned capacity, by kind (prompt, generated)",
            self.capacity.clone(),
        );
        registry.register(
            "scaler_learned_capacity_samples",
            "Saturated readings the learned capacity per ScaledObject is taken from",
            self.capacity_samples.clone(),
        );
    }

    /// Records the capacity per replica learned for a ScaledObject and its sample count.
    pub fn learned_capacity(
        &self,
        namespace: &str,
        name: &str,
        per_replica: crate::core::capacity::Throughput,
        samples: usize,
    ) {
        for (kind, value) in TOKEN_KINDS
            .into_iter()
            .zip([per_replica.prompt, per_replica.generated])
        {
            self.capacity
                .get_or_create(&CapacityLabels {
                    namespace: namespace.to_string(),
                    scaled_object: name.to_string(),
                    kind,
                })
                .set(value);
        }
        self.capacity_samples
            .get_or_create(&ObjectLabels::new(namespace, name))
            .set(i64::try_from(samples).unwrap_or(i64::MAX));
    }

    /// Drops the learned-capacity series of a ScaledObject.
    pub fn forget_capacity(&self, namespace: &str, name: &str) {
        for kind in TOKEN_KINDS {
            self.capacity.remove(&CapacityLabels {
                namespace: namespace.to_string(),
                scaled_object: name.to_string(),
                kind,
            });
        }
        self.capacity_samples
            .remove(&ObjectLabels::new(namespace, name));
    }

    /// Counts one answered request.
    pub fn request(&self, rpc: &'static str, code: tonic::Code, seconds: f64) {
        self.requests
            .get_or_create(&RpcLabels {
                rpc,
                code: code_name(code),
            })
            .inc();
        self.duration
            .get_or_create(&RpcOnly { rpc })
            .observe(seconds);
    }

    /// Records the demand last reported for a ScaledObject, the demand measured (the same unless
    /// a forecast raised it) of the `service` the trigger reads, and the pods it was read from
    /// (`None` for a raw query, which reads no pods). A trigger changed to another service drops
    /// the measured series of the one before.
    pub fn demand(
        &self,
        namespace: &str,
        name: &str,
        service: u64,
        replicas: f64,
        measured: f64,
        pods: Option<usize>,
    ) {
        let reading = Reading {
            service,
            replicas,
            measured,
            pods,
        };
        // Held until the series are set, so that two evaluations at once leave one series.
        let mut series = self.series();
        match series
            .get_mut(namespace)
            .and_then(|names| names.get_mut(name))
        {
            Some(object) => object.set(self, namespace, name, reading),
            None => {
                let mut object = ObjectSeries::new(self, namespace, name, service);
                object.set(self, namespace, name, reading);
                series
                    .entry(namespace.to_string())
                    .or_default()
                    .insert(name.to_string(), object);
            }
        }
    }

    /// Drops the demand and pods series of a ScaledObject that is no longer evaluated, so that
    /// deleted ScaledObjects neither stay in `/metrics` nor hold memory.
    pub fn forget(&self, namespace: &str, name: &str) {
        let labels = ObjectLabels::new(namespace, name);
        // Held while the families' series go, so that no evaluation meanwhile keeps a handle to
        // a series no longer exported.
        let mut series = self.series();
        if let Some(names) = series.get_mut(namespace) {
            if let Some(object) = names.remove(name) {
                self.measured.remove(&object.measured_labels);
            }
            if names.is_empty() {
                series.remove(namespace);
            }
        }
        self.demand.remove(&labels);
        self.pods.remove(&labels);
        drop(series);
        self.forget_capacity(namespace, name);
    }

    fn series(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<String, ObjectSeries>>> {
        self.series.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one forecast rebuild from Prometheus, `ok` or not.
    pub fn rebuild(&self, ok: bool) {
        let outcome = if ok { "ok" } else { "failed" };
        self.rebuilds
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }
}

/// One evaluation's figures for a ScaledObject's demand series.
#[derive(Clone, Copy)]
struct Reading {
    service: u64,
    replicas: f64,
    measured: f64,
    pods: Option<usize>,
}

/// One ScaledObject's demand series: handles to the families' gauges, set at every evaluation
/// without building their labels again, and the service the measured series is of, with its
/// labels, to drop it when the trigger changes service.
struct ObjectSeries {
    demand: Gauge<f64, AtomicU64>,
    service: u64,
    measured_labels: MeasuredLabels,
    measured: Gauge<f64, AtomicU64>,
    /// Made at the first evaluation that read pods (a raw query reads none).
    pods: Option<Gauge>,
}

impl ObjectSeries {
    fn new(metrics: &ScalerMetrics, namespace: &str, name: &str, service: u64) -> Self {
        let measured_labels = MeasuredLabels::new(namespace, name, service);
        Self {
            demand: metrics
                .demand
                .get_or_create(&ObjectLabels::new(namespace, name))
                .clone(),
            service,
            measured: metrics.measured.get_or_create(&measured_labels).clone(),
            measured_labels,
            pods: None,
        }
    }

    fn set(&mut self, metrics: &ScalerMetrics, namespace: &str, name: &str, reading: Reading) {
        self.demand.set(reading.replicas);
        if self.service != reading.service {
            metrics.measured.remove(&self.measured_labels);
            self.service = reading.service;
            self.measured_labels = MeasuredLabels::new(namespace, name, reading.service);
            self.measured = metrics
                .measured
                .get_or_create(&self.measured_labels)
                .clone();
        }
        self.measured.set(reading.measured);
        if let Some(pods) = reading.pods {
            self.pods
                .get_or_insert_with(|| {
                    metrics
                        .pods
                        .get_or_create(&ObjectLabels::new(namespace, name))
                        .clone()
                })
                .set(i64::try_from(pods).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).expect("encode");
        out
    }

    #[test]
    fn a_forgotten_scaled_object_leaves_metrics() {
        let metrics = ScalerMetrics::default();
        let mut registry = Registry::with_prefix("nightshift");
        metrics.register(&mut registry);
        metrics.demand("team-a", "deleted", 7, 2.0, 1.0, Some(4));
        metrics.demand("team-a", "kept", 7, 3.0, 3.0, Some(2));
        let learned = crate::core::capacity::Throughput {
            prompt: 900.0,
            generated: 300.0,
        };
        metrics.learned_capacity("team-a", "deleted", learned, 3);
        metrics.learned_capacity("team-a", "kept", learned, 3);
        metrics.forget("team-a", "deleted");
        let text = exposition(&registry);
        assert!(
            text.contains(
                "nightshift_scaler_learned_capacity_tokens_per_second{namespace=\"team-a\",scaled_object=\"kept\",kind=\"prompt\"} 900"
            ),
            "{text}"
        );
        assert!(!text.contains("scaled_object=\"deleted\""), "{text}");
        assert!(text.contains("scaled_object=\"kept\""), "{text}");
    }

    #[test]
    fn the_measured_demand_is_of_the_service_read_now() {
        let metrics = ScalerMetrics::default();
        let mut registry = Registry::with_prefix("nightshift");
        metrics.register(&mut registry);
        metrics.demand("team-a", "llama", 0xab, 2.0, 1.0, None);
        metrics.demand("team-a", "llama", 0xab, 3.0, 1.5, None);
        let old = "nightshift_scaler_measured_demand_replicas{namespace=\"team-a\",scaled_object=\"llama\",service=\"00000000000000ab\"}";
        let text = exposition(&registry);
        assert!(text.contains(&format!("{old} 1.5")), "{text}");
        // The trigger reads another service: only that one's series is left.
        metrics.demand("team-a", "llama", 0xcd, 4.0, 4.0, None);
        let new = "nightshift_scaler_measured_demand_replicas{namespace=\"team-a\",scaled_object=\"llama\",service=\"00000000000000cd\"}";
        let text = exposition(&registry);
        assert!(text.contains(&format!("{new} 4.0")), "{text}");
        assert!(!text.contains(old), "{text}");
        metrics.forget("team-a", "llama");
        assert!(!exposition(&registry).contains("measured_demand_replicas{"));
    }

    #[test]
    fn code_labels_are_the_status_codes_names() {
        for n in 0..=16 {
            let code = tonic::Code::from(n);
            assert_eq!(code_name(code), format!("{code:?}"), "code {n}");
        }
    }
}
