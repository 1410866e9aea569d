//! Where vLLM metrics come from: a Prometheus server ([`prometheus`]) or a direct scrape of the
//! vLLM pods' `/metrics` ([`scrape`], pods found by [`discovery`]).
//!
//! Both produce the same thing: for each [`Signal`](crate::core::demand::Signal)'s metric
//! family, a [`FamilyIndex`] of per-pod values already aggregated per (namespace, model). Fetches
//! are shared between every ScaledObject that reads the same upstream ([`cache`]), so upstream load
//! does not grow with their number. This module owns no demand logic: it only measures. Which
//! upstreams a ScaledObject may make it call is [`policy`]'s decision.

pub mod cache;
pub mod discovery;
pub mod exposition;
pub mod history;
pub mod idle;
pub mod metrics;
pub mod policy;
pub mod prometheus;
pub mod rates;
pub mod scrape;
pub mod target;

use std::{collections::HashMap, fmt, time::Duration};

/// Which model's series a ScaledObject reads.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Selection {
    /// Kubernetes namespace of the vLLM pods; `None` matches every namespace.
    pub namespace: Option<String>,
    /// vLLM `model_name` label; `None` sums every model.
    pub model: Option<String>,
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "namespace={} model={}",
            self.namespace.as_deref().unwrap_or("*"),
            self.model.as_deref().unwrap_or("*")
        )
    }
}

/// The identity of a model's series: (namespace, model_name).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelKey {
    pub namespace: String,
    pub model: String,
}

/// A family's value summed over pods, and how many pods contributed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Aggregate {
    pub total: f64,
    pub pods: usize,
}

/// One family's readings, summed per (namespace, model) from per-pod values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FamilyIndex {
    /// Namespace, then model: a selection of both (the common case) is looked up with the
    /// trigger's own strings, without building a key at every evaluation.
    by_namespace: HashMap<String, HashMap<String, Aggregate>>,
}

impl FamilyIndex {
    /// Builds the index from one value per pod (a pod serving two models appears twice).
    pub fn from_pod_values(values: impl IntoIterator<Item = (ModelKey, f64)>) -> Self {
        let mut by_namespace: HashMap<String, HashMap<String, Aggregate>> = HashMap::new();
        for (key, value) in values {
            let agg = by_namespace
                .entry(key.namespace)
                .or_default()
                .entry(key.model)
                .or_default();
            agg.total += value;
            agg.pods += 1;
        }
        Self { by_namespace }
    }

    /// The aggregate for a selection, or `None` when no series matched (an empty result).
    pub fn select(&self, selection: &Selection) -> Option<Aggregate> {
        let in_namespace = |models: &HashMap<String, Aggregate>| match &selection.model {
            Some(model) => models.get(model).copied(),
            None => sum(models.values().copied()),
        };
        match &selection.namespace {
            Some(namespace) => self.by_namespace.get(namespace).and_then(in_namespace),
            None => sum(self.by_namespace.values().filter_map(in_namespace)),
        }
    }

    /// Number of (namespace, model) entries.
    pub fn len(&self) -> usize {
        self.by_namespace.values().map(HashMap::len).sum()
    }

    /// Whether no series were found at all.
    pub fn is_empty(&self) -> bool {
        self.by_namespace.is_empty()
    }
}

/// The sum of `aggregates`, or `None` when there are none.
fn sum(aggregates: impl Iterator<Item = Aggregate>) -> Option<Aggregate> {
    aggregates.reduce(|a, b| Aggregate {
        total: a.total + b.total,
        pods: a.pods + b.pods,
    })
}

/// Why a source could not produce a reading. Cloneable because one fetch's outcome is shared
/// by every caller waiting for it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SourceError {
    /// The upstream could not be reached or answered with a server error.
    #[error("{upstream} is unavailable: {detail}")]
    Unavailable { upstream: String, detail: String },
    /// The upstream did not answer in time.
    #[error("{upstream} did not answer within {after:?}")]
    Timeout { upstream: String, after: Duration },
    /// The upstream answered with something that is not usable metrics.
    #[error("{upstream} returned unusable data: {detail}")]
    Garbage { upstream: String, detail: String },
    /// Prometheus refused the query (e.g. a syntax error in a raw `query`).
    #[error("{upstream} rejected the query {query:?}: {detail}")]
    Rejected {
        upstream: String,
        query: String,
        detail: String,
    },
    /// The source cannot work in this deployment (e.g. service discovery without a cluster).
    #[error("{0}")]
    NotConfigured(String),
    /// The source policy refuses an address the upstream named (e.g. an EndpointSlice's).
    #[error(transparent)]
    Denied(#[from] policy::Denied),
}

/// Longest upstream-provided text (a Prometheus error message) kept in an error: enough for
/// a PromQL parse error's position and reason, too little to carry a response body out.
const MAX_UPSTREAM_TEXT: usize = 200;

/// Upstream-provided text as it may appear in an error: control characters replaced, cut at
/// [`MAX_UPSTREAM_TEXT`] characters.
pub fn bounded(text: &str) -> String {
    let mut out: String = text
        .chars()
        .take(MAX_UPSTREAM_TEXT)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().nth(MAX_UPSTREAM_TEXT).is_some() {
        out.push('…');
    }
    out
}

impl SourceError {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            SourceError::Unavailable { .. } => "unavailable",
            SourceError::Timeout { .. } => "timeout",
            SourceError::Garbage { .. } => "garbage",
            SourceError::Rejected { .. } => "rejected",
            SourceError::NotConfigured(_) => "not_configured",
            SourceError::Denied(_) => "denied",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, model: &str) -> ModelKey {
        ModelKey {
            namespace: ns.into(),
            model: model.into(),
        }
    }

    #[test]
    fn upstream_text_is_bounded_and_single_line() {
        assert_eq!(bounded("parse error\nat 3"), "parse error at 3");
        let long = "x".repeat(10_000);
        let cut = bounded(&long);
        assert_eq!(cut.chars().count(), MAX_UPSTREAM_TEXT + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(bounded(""), "");
    }

    #[test]
    fn index_sums_pods_per_model_and_counts_them() {
        let index = FamilyIndex::from_pod_values([
            (key("a", "llama"), 2.0),
            (key("a", "llama"), 3.0),
            (key("a", "qwen"), 7.0),
            (key("b", "llama"), 11.0),
        ]);
        let sel = |ns: Option<&str>, m: Option<&str>| Selection {
            namespace: ns.map(Into::into),
            model: m.map(Into::into),
        };
        assert_eq!(
            index.select(&sel(Some("a"), Some("llama"))),
            Some(Aggregate {
                total: 5.0,
                pods: 2
            })
        );
        assert_eq!(
            index.select(&sel(Some("a"), None)),
            Some(Aggregate {
                total: 12.0,
                pods: 3
            })
        );
        assert_eq!(
            index.select(&sel(None, Some("llama"))).map(|a| a.total),
            Some(16.0)
        );
        assert_eq!(index.select(&sel(Some("c"), Some("llama"))), None);
        assert_eq!(index.select(&sel(Some("c"), None)), None);
    }
}
