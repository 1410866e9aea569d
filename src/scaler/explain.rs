//! The latest decision per ScaledObject, kept for the admin endpoint
//! `GET /scaler/decisions[/{namespace}/{name}]`: each signal's raw value, target and ratio, and
//! the result (or the error that was returned instead).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use axum::{
    Json, Router,
    extract::{Path, State},
    http::StatusCode,
    response::IntoResponse,
    routing::get,
};
use serde::Serialize;

/// One signal's contribution.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TermView {
    /// `waiting`, `running`, `kvCache`, `generationTokens` or `query`.
    pub signal: String,
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
    /// RFC 3339 time of the evaluation.
    pub at: String,
    /// Where the readings came from.
    pub source: String,
    /// Pods that contributed readings.
    pub pods: Option<usize>,
    pub terms: Vec<TermView>,
    /// The signal with the largest ratio.
    pub driver: Option<String>,
    /// Demand in replicas (the largest ratio).
    pub replicas: Option<f64>,
    /// What `GetMetrics` reports (`replicas × 100`, against a target of 100).
    pub metric_value: Option<f64>,
    /// What `IsActive` answers.
    pub active: Option<bool>,
    pub activation_threshold: f64,
    /// The gRPC error returned instead of a value, if any.
    pub error: Option<ErrorView>,
}

/// An error returned to KEDA.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ErrorView {
    pub code: String,
    pub message: String,
}

/// Latest explanation per (namespace, name).
#[derive(Clone, Default)]
pub struct Decisions {
    inner: Arc<Mutex<BTreeMap<(String, String), Explanation>>>,
}

impl Decisions {
    /// Stores the latest explanation for its ScaledObject.
    pub fn record(&self, e: Explanation) {
        let key = (e.namespace.clone(), e.name.clone());
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, e);
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
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
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
