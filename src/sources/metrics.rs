//! Upstream request metrics shared by the sources: one latency histogram labelled by source
//! kind, metric family and outcome (its `_count` is the number of upstream requests).

use std::time::Duration;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, histogram::Histogram},
    registry::Registry,
};

use super::SourceError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    source: &'static str,
    family: &'static str,
    outcome: &'static str,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~16 s: a local scrape takes milliseconds, a loaded Prometheus seconds, and the
    // longest bound anyone should configure is well under KEDA's 30 s polling interval.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 2.0, 15,
    ))
}

/// Handle to the upstream metrics; cheap to clone.
#[derive(Clone)]
pub struct SourceMetrics {
    latency: Family<UpstreamLabels, Histogram, fn() -> Histogram>,
}

impl Default for SourceMetrics {
    fn default() -> Self {
        Self {
            latency: Family::new_with_constructor(latency_histogram),
        }
    }
}

impl SourceMetrics {
    /// Registers the metrics (names get the registry's prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "scaler_upstream_request_duration_seconds",
            "Time taken by requests to metric sources (Prometheus queries, pod scrapes), by source, family and outcome",
            self.latency.clone(),
        );
    }

    /// Records one upstream request.
    pub fn observe(
        &self,
        source: &'static str,
        family: &'static str,
        error: Option<&SourceError>,
        elapsed: Duration,
    ) {
        let outcome = error.map_or("ok", SourceError::kind);
        self.latency
            .get_or_create(&UpstreamLabels {
                source,
                family,
                outcome,
            })
            .observe(elapsed.as_secs_f64());
    }
}
