//! The latest decision per ScaledObject, kept for the admin endpoint
//! `GET /scaler/decisions[/{namespace}/{name}]`: each signal's raw value, target and ratio, and
//! the result (or the error that was returned instead), and, for a trigger with `forecast`,
//! what the forecast expected and whether it decided, and, for a trigger with learned capacity,
//! what it learned and the targets it gave.

use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use axum::{
    Json, Router,
    extract::{Path, State},
    http::StatusCode,
    response::IntoResponse,
    routing::get,
};
use serde::Serialize;

use crate::sources::idle::{IDLE, IdleMap};

/// One signal's contribution.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TermView {
    /// `waiting`, `running`, `kvCache`, `generationTokens`, `promptTokens` or `query`.
    pub signal: &'static str,
    /// The total over pods as read from the source.
    pub raw: f64,
    /// The per-replica target.
    pub target: f64,
    /// `raw / target`: replicas this signal asks for.
    pub ratio: f64,
}

/// The latest evaluation of one ScaledObject.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub namespace: String,
    pub name: String,
    /// Time of the evaluation, written in RFC 3339 (formatted when the explanation is read, not
    /// on every evaluation).
    #[serde(serialize_with = "rfc3339")]
    pub at: jiff::Timestamp,
    /// Where the readings came from (shared with the trigger, not copied at every evaluation).
    #[serde(serialize_with = "text")]
    pub source: Arc<str>,
    /// Pods that contributed readings.
    pub pods: Option<usize>,
    pub terms: Vec<TermView>,
    /// The signal with the largest ratio.
    pub driver: Option<&'static str>,
    /// Demand reported, in replicas: the largest ratio, or the forecast's demand when it decided.
    pub replicas: Option<f64>,
    /// What `GetMetrics` reports (`replicas × 100`, against a target of 100).
    pub metric_value: Option<f64>,
    /// What `IsActive` answers.
    pub active: Option<bool>,
    pub activation_threshold: f64,
    /// The gRPC error returned instead of a value, if any.
    pub error: Option<ErrorView>,
    /// The daily forecast, for a trigger with `forecast: daily`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forecast: Option<ForecastView>,
    /// The learned capacity, for a trigger with `capacity: learned`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityView>,
}

/// A timestamp as RFC 3339 text (`jiff`'s display form), written straight into the output.
fn rfc3339<S: serde::Serializer>(at: &jiff::Timestamp, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(at)
}

/// Shared text, written as the string it is.
fn text<S: serde::Serializer>(text: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(text)
}

/// What the learned capacity did in one evaluation.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CapacityView {
    /// `capacityUtilization`: the fraction of the capacity a replica should carry.
    pub utilization: f64,
    /// Saturated readings the capacity is learned from (the most recent are kept).
    pub samples: usize,
    /// This evaluation's reading was a new saturated sample (requests waiting behind every pod).
    pub sampled: bool,
    /// Prompt and generated tokens per second one replica sustains; `None` while learning.
    pub per_replica: Option<crate::core::capacity::Throughput>,
    /// The learned per-replica token-rate targets (`utilization × perReplica`); `None` while
    /// learning.
    pub targets: Option<crate::core::capacity::Throughput>,
    /// Token signals whose target is set by hand and used instead of the learned one.
    pub hand_set: Vec<String>,
    /// In words: learned from how many readings, or still learning.
    pub state: String,
}

/// What the daily forecast did in one evaluation.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ForecastView {
    /// Demand measured from the source, in replicas; `None` when the read failed (the error is
    /// answered, the forecast does not replace it).
    pub measured: Option<f64>,
    /// Demand the service's daily shape expects within the lead, in replicas; `None` while it has
    /// no earlier day at these times of day.
    pub expected: Option<f64>,
    /// How far ahead the forecast looks (`forecastLead`), seconds.
    pub lead_seconds: f64,
    /// Days with readings in the shape's history (at most 14).
    pub days_learned: usize,
    /// The forecast decided: it expected more than was measured, and `replicas` is its demand.
    pub decided: bool,
    /// Where the shape's history comes from (live evaluations, or rebuilt from Prometheus).
    pub history: String,
}

/// An error returned to KEDA.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ErrorView {
    pub code: String,
    pub message: String,
}

/// Latest explanation per (namespace, name); a ScaledObject not evaluated for [`IDLE`] (deleted,
/// or pointed at another scaler) is forgotten.
#[derive(Clone)]
pub struct Decisions {
    inner: Arc<Mutex<IdleMap<(String, String), Explanation>>>,
}

impl Default for Decisions {
    fn default() -> Self {
        Self::with_idle(IDLE)
    }
}

impl Decisions {
    /// Decisions forgetting ScaledObjects not evaluated for `idle`.
    pub fn with_idle(idle: std::time::Duration) -> Self {
        Self {
            inner: Arc::new(Mutex::new(IdleMap::new(idle))),
        }
    }

    /// Stores the latest explanation for its ScaledObject; returns the (namespace, name) of the
    /// ScaledObjects forgotten meanwhile, whose other per-object state the caller drops too.
    pub fn record(&self, e: Explanation) -> Vec<(String, String)> {
        let key = (e.namespace.clone(), e.name.clone());
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, e, Instant::now())
            .into_iter()
            .map(|(key, _)| key)
            .collect()
    }

    /// The latest explanation of one ScaledObject.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Explanation> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Every latest explanation, ordered by namespace and name.
    pub fn all(&self) -> Vec<Explanation> {
        let mut all: Vec<Explanation> = self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        all
    }

    /// Admin routes serving the explanations as JSON.
    pub fn routes(&self) -> Router {
        Router::new()
            .route("/scaler/decisions", get(list))
            .route("/scaler/decisions/{namespace}/{name}", get(one))
            .with_state(self.clone())
    }
}

async fn list(State(d): State<Decisions>) -> impl IntoResponse {
    Json(d.all())
}

async fn one(
    State(d): State<Decisions>,
    Path((namespace, name)): Path<(String, String)>,
) -> impl IntoResponse {
    match d.get(&namespace, &name) {
        Some(e) => Json(e).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no decision yet for ScaledObject {namespace}/{name}\n"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn explanation(name: &str) -> Explanation {
        Explanation {
            namespace: "team-a".into(),
            name: name.into(),
            at: "2026-11-30T00:00:00Z".parse().expect("an RFC 3339 time"),
            source: "test".into(),
            pods: Some(1),
            terms: Vec::new(),
            driver: None,
            replicas: Some(1.0),
            metric_value: Some(100.0),
            active: Some(true),
            activation_threshold: 0.0,
            error: None,
            forecast: None,
            capacity: None,
        }
    }

    #[test]
    fn scaled_objects_no_longer_evaluated_are_forgotten_and_named() {
        // A second: a pause of this thread shorter than most of it cannot make "kept" idle.
        let idle = std::time::Duration::from_secs(1);
        let decisions = Decisions::with_idle(idle);
        assert!(decisions.record(explanation("deleted")).is_empty());
        assert!(decisions.record(explanation("kept")).is_empty());
        // The passage of time is what is under test: "deleted" is not evaluated again.
        let started = Instant::now();
        let mut forgotten = Vec::new();
        while started.elapsed() <= 2 * idle {
            forgotten.extend(decisions.record(explanation("kept")));
            std::thread::sleep(idle / 10);
        }
        assert_eq!(
            forgotten,
            vec![("team-a".to_string(), "deleted".to_string())]
        );
        assert!(decisions.get("team-a", "deleted").is_none());
        assert_eq!(
            decisions
                .all()
                .iter()
                .map(|e| e.name.as_str())
                .collect::<Vec<_>>(),
            vec!["kept"]
        );
    }

    #[test]
    fn the_time_and_signals_read_as_text() {
        let mut e = explanation("a");
        e.terms.push(TermView {
            signal: "waiting",
            raw: 3.0,
            target: 5.0,
            ratio: 0.6,
        });
        e.driver = Some("waiting");
        let json = serde_json::to_value(&e).expect("serialises");
        assert_eq!(json["at"], "2026-11-30T00:00:00Z");
        assert_eq!(json["terms"][0]["signal"], "waiting");
        assert_eq!(json["driver"], "waiting");
    }

    #[test]
    fn all_is_ordered_by_namespace_and_name() {
        let decisions = Decisions::default();
        for name in ["c", "a", "b"] {
            decisions.record(explanation(name));
        }
        let names: Vec<String> = decisions.all().into_iter().map(|e| e.name).collect();
        assert_eq!(names, vec!["a", "b", "c"]);
    }
}
