//! The pool's metrics (`nightshift_pool_*`): the families, their labels and buckets, and their
//! registration.
//!
//! It owns the definitions only: the controller updates the values as it goes. It must not
//! decide or hold anything else.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StateLabel {
    pub(super) state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabel {
    pub(super) reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NamespaceLabel {
    pub(super) namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabel {
    pub(super) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NoticedLabel {
    pub(super) noticed: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabel {
    result: &'static str,
}

/// The pool's metrics (registered under `nightshift_pool_*`).
#[derive(Clone, Debug)]
pub struct Metrics {
    pub(super) gpus: Family<StateLabel, Gauge>,
    pub(super) spare_nodes: Gauge,
    pub(super) spare_gpus: Gauge,
    pub(super) headroom_gpus: Gauge,
    pub(super) preemptions: Family<ReasonLabel, Counter>,
    pub(super) disrupted_runtime: Histogram,
    pub(super) lent_gpu_seconds: Counter<f64, AtomicU64>,
    pub(super) namespace_lent_gpu_seconds: Family<NamespaceLabel, Counter<f64, AtomicU64>>,
    pub(super) namespace_preemptions: Family<NamespaceLabel, Counter>,
    pub(super) lost_gpu_seconds: Family<NamespaceLabel, Counter>,
    pub(super) leader: Gauge,
    pub(super) lending_open: Gauge,
    pub(super) label_patches: Family<ResultLabel, Counter>,
    pub(super) last_reconcile: Gauge,
    pub(super) notices: Family<OutcomeLabel, Counter>,
    pub(super) notices_out: Gauge,
    pub(super) notice_lead: Histogram,
    pub(super) preempted_noticed: Family<NoticedLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            gpus: Family::default(),
            spare_nodes: Gauge::default(),
            spare_gpus: Gauge::default(),
            headroom_gpus: Gauge::default(),
            preemptions: Family::default(),
            // Research steps run minutes to days: 1 min … ~11 days, ×4 per bucket.
            disrupted_runtime: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(60.0, 4.0, 10),
            ),
            lent_gpu_seconds: Counter::default(),
            namespace_lent_gpu_seconds: Family::default(),
            namespace_preemptions: Family::default(),
            lost_gpu_seconds: Family::default(),
            leader: Gauge::default(),
            lending_open: Gauge::default(),
            label_patches: Family::default(),
            last_reconcile: Gauge::default(),
            notices: Family::default(),
            notices_out: Gauge::default(),
            // From seconds (a burst) to hours (a slow evening ramp): 5 s … ~3.6 h, ×3 per bucket.
            notice_lead: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(5.0, 3.0, 8),
            ),
            preempted_noticed: Family::default(),
        }
    }
}

impl Metrics {
    /// Registers every pool metric into `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "pool_gpus",
            "GPUs of the pool by state: protected (non-research pods), lent (research pods), free",
            self.gpus.clone(),
        );
        registry.register(
            "pool_spare_nodes",
            "Pool nodes currently marked spare",
            self.spare_nodes.clone(),
        );
        registry.register(
            "pool_spare_gpus",
            "Free GPUs on nodes marked spare",
            self.spare_gpus.clone(),
        );
        registry.register(
            "pool_headroom_gpus",
            "Free GPUs held back for inference bursts on headroom nodes (part of the free GPUs)",
            self.headroom_gpus.clone(),
        );
        registry.register(
            "pool_preemptions",
            "Research pods disrupted (preempted or evicted), by DisruptionTarget reason",
            self.preemptions.clone(),
        );
        registry.register(
            "pool_disrupted_pod_runtime_seconds",
            "How long research pods had run when they were disrupted",
            self.disrupted_runtime.clone(),
        );
        registry.register(
            "pool_lent_gpu_seconds",
            "GPU-seconds requested by research pods on pool nodes (harvested GPU time)",
            self.lent_gpu_seconds.clone(),
        );
        registry.register(
            "pool_namespace_lent_gpu_seconds",
            "GPU-seconds lent to research pods, by the research pods' namespace",
            self.namespace_lent_gpu_seconds.clone(),
        );
        registry.register(
            "pool_namespace_preemptions",
            "Research pods disrupted (preempted or evicted), by namespace",
            self.namespace_preemptions.clone(),
        );
        registry.register(
            "pool_lost_gpu_seconds",
            "Research GPU-seconds lost to disruptions (since the pod's last reported checkpoint, \
             else since its start), by namespace",
            self.lost_gpu_seconds.clone(),
        );
        registry.register(
            "pool_last_reconcile_timestamp_seconds",
            "Unix time of the last pass after which the node marks matched the plan (leader only)",
            self.last_reconcile.clone(),
        );
        registry.register(
            "pool_leader",
            "1 when this replica holds the pool controller lease and writes node marks",
            self.leader.clone(),
        );
        registry.register(
            "pool_lending_open",
            "1 when inside a lending window (or lending is continuous)",
            self.lending_open.clone(),
        );
        registry.register(
            "pool_reclaim_notices",
            "Reclaim notices to research pods, by outcome: given, withdrawn (demand fell back), \
             undelivered (the pod could not be annotated)",
            self.notices.clone(),
        );
        registry.register(
            "pool_reclaim_notices_out",
            "Research pods under a reclaim notice now",
            self.notices_out.clone(),
        );
        registry.register(
            "pool_reclaim_notice_lead_seconds",
            "Time from a research pod's reclaim notice to its preemption",
            self.notice_lead.clone(),
        );
        registry.register(
            "pool_preempted_research_pods",
            "Research pods preempted by the scheduler, by whether they had a reclaim notice first",
            self.preempted_noticed.clone(),
        );
        registry.register(
            "pool_label_patches",
            "Spare-mark label patches sent to the API server, by result",
            self.label_patches.clone(),
        );
    }

    /// Counts a patch outcome.
    pub fn patched(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.label_patches
            .get_or_create(&ResultLabel { result })
            .inc();
    }
}
