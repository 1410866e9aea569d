//! The spare-mark controller's state machine: applies watch events to the [`Ledger`], decides the
//! marks, tracks disruptions of research pods and keeps the metrics.
//!
//! No I/O here: [`Controller`] takes watch events and the time, and returns the label patches to
//! make. The transport (watch streams, the Lease, the API calls) lives in [`super::run`], so this
//! part is tested against fake stores and recorded events.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::atomic::AtomicU64,
};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::{
    accounting::{DisruptionRecord, Ledger, NodeFacts, PodFacts, node_facts, pod_facts},
    history::{History, Sample},
    marks::{self, LabelPatch, Plan, Verdict},
    notices::{Digests, OwnerNotice, PodNotice},
    pending::{self, Repeats},
    reclaim::{Action, Change, Reclaim, ServiceDemand},
    status::{NamespaceStatus, NodeStatus, ResearchPod, StatusReport},
    windows::Windows,
};
use crate::core::vocabulary::Vocabulary;

/// How many recent disruptions `/status` shows: enough for a researcher to find theirs without
/// the list growing without bound.
pub const RECENT_DISRUPTIONS: usize = 100;

/// What the controller needs to decide.
#[derive(Clone, Debug)]
pub struct LendingPolicy {
    /// The names shared with the webhook: what is research, what is a GPU, which labels mark.
    pub vocabulary: Vocabulary,
    pub headroom: u64,
    pub windows: Windows,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespaceLabel {
    namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NoticedLabel {
    noticed: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// The pool's metrics (registered under `nightshift_pool_*`).
#[derive(Clone, Debug)]
pub struct Metrics {
    gpus: Family<StateLabel, Gauge>,
    spare_nodes: Gauge,
    spare_gpus: Gauge,
    headroom_gpus: Gauge,
    preemptions: Family<ReasonLabel, Counter>,
    disrupted_runtime: Histogram,
    lent_gpu_seconds: Counter<f64, AtomicU64>,
    namespace_lent_gpu_seconds: Family<NamespaceLabel, Counter<f64, AtomicU64>>,
    namespace_preemptions: Family<NamespaceLabel, Counter>,
    lost_gpu_seconds: Family<NamespaceLabel, Counter>,
    leader: Gauge,
    lending_open: Gauge,
    label_patches: Family<ResultLabel, Counter>,
    last_reconcile: Gauge,
    notices: Family<OutcomeLabel, Counter>,
    notices_out: Gauge,
    notice_lead: Histogram,
    preempted_noticed: Family<NoticedLabel, Counter>,
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

/// Research accounting of one namespace, since this replica started.
#[derive(Clone, Debug, Default)]
struct NamespaceTotals {
    /// GPUs its research pods hold now.
    lent_gpus: u64,
    lent_gpu_seconds: f64,
    preemptions: u64,
    lost_gpu_seconds: u64,
}

/// The controller's state. Shared behind a mutex with the `/status` handler; never held across
/// an `.await`.
#[derive(Debug)]
pub struct Controller {
    pub policy: LendingPolicy,
    ledger: Ledger,
    plan: Plan,
    lending_open: bool,
    leader: bool,
    nodes_synced: bool,
    pods_synced: bool,
    /// Nodes that left the pool while marked: their marks are removed.
    orphans: BTreeSet<String>,
    recent: VecDeque<DisruptionRecord>,
    /// Lent GPUs at the last integration (in all, and per namespace), and when that was.
    lent_since: Option<(u64, BTreeMap<String, u64>, tokio::time::Instant)>,
    /// Research accounting per namespace since this replica started, for `/status`.
    namespaces: BTreeMap<String, NamespaceTotals>,
    node_relist: Option<Vec<NodeFacts>>,
    metrics: Metrics,
    /// GPUs by use, one sample a minute, for the researchers' view.
    history: History,
    /// Events for research pods, to publish (leader only), oldest first.
    notices: Vec<PodNotice>,
    /// The reason last told to each waiting research pod, and when.
    waiting: Repeats,
    /// The pods' Events gathered for their Jobs and Workflows.
    owners: Digests,
    /// Events for the owners of research pods, to publish (leader only).
    owner_notices: Vec<OwnerNotice>,
    /// Reclaim notices: what each service's demand foretells, and who was told.
    reclaim: Reclaim,
}

/// Most notices kept for publishing: the publisher drains them every reconcile pass, so this
/// bounds memory only while the API server is unreachable (a burst of preemptions is 64 pods or
/// so; a thousand covers many of them). Owners' notices are bounded the same way.
pub const MAX_NOTICES: usize = 1000;

/// Queues a pod's notice (unless [`MAX_NOTICES`] wait already) and adds it to its owner's next
/// Event. A free function so that the controller can queue while it reads its ledger.
fn queue(notices: &mut Vec<PodNotice>, owners: &mut Digests, n: PodNotice, now: i64) {
    if notices.len() >= MAX_NOTICES {
        return;
    }
    owners.add(&n, now);
    notices.push(n);
}

impl Controller {
    pub fn new(policy: LendingPolicy, metrics: Metrics) -> Self {
        Self {
            policy,
            ledger: Ledger::new(),
            plan: Plan::default(),
            lending_open: true,
            leader: false,
            nodes_synced: false,
            pods_synced: false,
            orphans: BTreeSet::new(),
            recent: VecDeque::new(),
            lent_since: None,
            namespaces: BTreeMap::new(),
            node_relist: None,
            metrics,
            history: History::new(),
            notices: Vec::new(),
            waiting: Repeats::default(),
            owners: Digests::default(),
            owner_notices: Vec::new(),
            reclaim: Reclaim::default(),
        }
    }

    /// Sets when reclaim notices are given and withdrawn.
    pub fn set_notice_policy(&mut self, policy: crate::core::notice::NoticePolicy) {
        self.reclaim = Reclaim::new(policy);
    }

    /// One reclaim-notice pass over the services' demand at `now` (leader only, once synced):
    /// the notices to give and withdraw, each also queued as Events on the pod and its owner.
    /// The nodes the next replicas are expected on stop being lent at the next reconcile.
    pub fn notice_pass(&mut self, services: &[ServiceDemand], now: Timestamp) -> Vec<Change> {
        if !self.leader || !self.synced() {
            return Vec::new();
        }
        let changes = self.reclaim.pass(&self.ledger, services, now);
        for c in &changes {
            let outcome = match c.action {
                Action::Give { .. } => "given",
                Action::Withdraw => "withdrawn",
            };
            tracing::info!(pod = %c.pod.id(), outcome, "reclaim notice");
            self.metrics
                .notices
                .get_or_create(&OutcomeLabel { outcome })
                .inc();
            let n = PodNotice::reclaim(c);
            queue(&mut self.notices, &mut self.owners, n, now.as_second());
        }
        self.metrics
            .notices_out
            .set(i64::try_from(self.reclaim.given()).unwrap_or(i64::MAX));
        changes
    }

    /// A notice could not be delivered (the annotation patch failed): it is given again at the
    /// next pass.
    pub fn notice_undelivered(&mut self, key: &str) {
        self.reclaim.undelivered(key);
        self.metrics
            .notices
            .get_or_create(&OutcomeLabel {
                outcome: "undelivered",
            })
            .inc();
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// GPUs by use over the last week.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Takes the events waiting to be published on pods.
    pub fn take_notices(&mut self) -> Vec<PodNotice> {
        std::mem::take(&mut self.notices)
    }

    /// Takes the events waiting to be published on the pods' Jobs and Workflows.
    pub fn take_owner_notices(&mut self) -> Vec<OwnerNotice> {
        std::mem::take(&mut self.owner_notices)
    }

    /// Whether both watches have listed everything once.
    pub fn synced(&self) -> bool {
        self.nodes_synced && self.pods_synced
    }

    /// Applies one event of the pool-node watch.
    pub fn on_node_event(&mut self, event: watcher::Event<Node>) {
        let resource = &self.policy.vocabulary;
        match event {
            watcher::Event::Apply(node) => {
                let facts = node_facts(&node, resource);
                self.orphans.remove(&facts.name);
                self.ledger.apply_node(facts);
            }
            watcher::Event::Delete(node) => {
                let facts = node_facts(&node, resource);
                self.forget_node(&facts);
            }
            watcher::Event::Init => self.node_relist = Some(Vec::new()),
            watcher::Event::InitApply(node) => {
                let facts = node_facts(&node, resource);
                match self.node_relist.as_mut() {
                    Some(buf) => buf.push(facts),
                    None => self.ledger.apply_node(facts),
                }
            }
            watcher::Event::InitDone => {
                if let Some(buf) = self.node_relist.take() {
                    let kept: BTreeSet<&str> = buf.iter().map(|n| n.name.as_str()).collect();
                    let gone: Vec<NodeFacts> = self
                        .ledger
                        .nodes()
                        .filter(|n| !kept.contains(n.name.as_str()))
                        .cloned()
                        .collect();
                    for n in &gone {
                        self.forget_node(n);
                    }
                    for n in &buf {
                        self.orphans.remove(&n.name);
                    }
                    self.ledger.replace_nodes(buf);
                }
                self.nodes_synced = true;
            }
        }
    }

    fn forget_node(&mut self, facts: &NodeFacts) {
        // A node whose pool label was removed still carries our marks; take them off. A node
        // that was deleted makes that patch a harmless 404.
        let marked = self
            .ledger
            .node(&facts.name)
            .is_some_and(|n| n.spare_label.is_some() || n.spare_gpus_label.is_some())
            || facts.spare_label.is_some()
            || facts.spare_gpus_label.is_some();
        if marked {
            self.orphans.insert(facts.name.clone());
        }
        self.ledger.delete_node(&facts.name);
    }

    /// Applies one event of the pod watch.
    pub fn on_pod_event(&mut self, event: watcher::Event<Pod>, now: Timestamp) {
        let resource = &self.policy.vocabulary;
        let records: Vec<DisruptionRecord> = match event {
            watcher::Event::Apply(pod) => {
                let facts = pod_facts(&pod, resource);
                if let Some(n) = self.newly_lent(&facts) {
                    queue(&mut self.notices, &mut self.owners, n, now.as_second());
                }
                self.ledger.apply_pod(facts, now).into_iter().collect()
            }
            watcher::Event::InitApply(pod) => self
                .ledger
                .apply_pod(pod_facts(&pod, resource), now)
                .into_iter()
                .collect(),
            watcher::Event::Delete(pod) => self
                .ledger
                .delete_pod(&pod_facts(&pod, resource), now)
                .into_iter()
                .collect(),
            watcher::Event::Init => {
                self.ledger.begin_pod_relist();
                Vec::new()
            }
            watcher::Event::InitDone => {
                self.pods_synced = true;
                self.ledger.finish_pod_relist(now)
            }
        };
        for r in records {
            self.record_disruption(r, now);
        }
    }

    /// Applies a pod's facts directly (benchmarks and tests).
    #[cfg(any(test, feature = "test-support"))]
    pub fn apply_pod_facts(&mut self, pod: super::accounting::PodFacts, now: Timestamp) {
        if let Some(r) = self.ledger.apply_pod(pod, now) {
            self.record_disruption(r, now);
        }
    }

    /// The `Lent` notice when a research pod is newly seen bound to GPUs of a pool node (by the
    /// leader, once synced: a re-list does not repeat it).
    fn newly_lent(&self, pod: &PodFacts) -> Option<PodNotice> {
        if !self.leader || !self.synced() || !pod.research || pod.terminal {
            return None;
        }
        if self.notices.len() >= MAX_NOTICES {
            return None;
        }
        let node = pod.node.as_deref()?;
        let gpus = pod.gpus.filter(|g| *g > 0)?;
        self.ledger.node(node)?;
        let was_bound = self
            .ledger
            .pod(&pod.key)
            .is_some_and(|old| old.node.is_some());
        (!was_bound).then(|| PodNotice::lent(pod, node, gpus))
    }

    fn record_disruption(&mut self, r: DisruptionRecord, now: Timestamp) {
        tracing::info!(
            namespace = %r.namespace,
            pod = %r.name,
            node = r.node.as_deref().unwrap_or(""),
            reason = %r.reason,
            ran_seconds = r.ran_seconds,
            gpus = r.gpus,
            "research pod disrupted"
        );
        self.metrics
            .preemptions
            .get_or_create(&ReasonLabel {
                reason: r.reason.clone(),
            })
            .inc();
        if let Some(s) = r.ran_seconds {
            self.metrics.disrupted_runtime.observe(s as f64);
        }
        if r.reason == "PreemptionByScheduler" {
            let noticed = if r.noticed.is_some() { "true" } else { "false" };
            self.metrics
                .preempted_noticed
                .get_or_create(&NoticedLabel { noticed })
                .inc();
            if let Some(at) = r.noticed {
                let lead = r.at.duration_since(at).as_secs_f64();
                self.metrics.notice_lead.observe(lead.max(0.0));
            }
        }
        let label = NamespaceLabel {
            namespace: r.namespace.clone(),
        };
        self.metrics
            .namespace_preemptions
            .get_or_create(&label)
            .inc();
        let lost = r.lost_gpu_seconds.unwrap_or(0);
        self.metrics
            .lost_gpu_seconds
            .get_or_create(&label)
            .inc_by(lost);
        let ns = self.namespaces.entry(r.namespace.clone()).or_default();
        ns.preemptions += 1;
        ns.lost_gpu_seconds += lost;
        // One replica tells the pod's owners; a standby that takes over later does not repeat
        // what the old leader published.
        if self.leader {
            let n = PodNotice::disrupted(&r);
            queue(&mut self.notices, &mut self.owners, n, now.as_second());
        }
        if self.recent.len() == RECENT_DISRUPTIONS {
            self.recent.pop_front();
        }
        self.recent.push_back(r);
    }

    /// Sets whether this replica leads (writes marks).
    pub fn set_leader(&mut self, leader: bool) {
        if !leader {
            // What was gathered for owners is the new leader's to tell, not ours; so are the
            // notices (the annotations stay, and the next leader adopts or withdraws them).
            self.owners.clear();
            self.reclaim.clear();
        }
        self.leader = leader;
        self.metrics.leader.set(i64::from(leader));
    }

    pub fn is_leader(&self) -> bool {
        self.leader
    }

    /// Recomputes the plan and the metrics at `now`; returns the label patches to make (none
    /// unless leader and synced: half a cache would unmark healthy nodes).
    pub fn reconcile(&mut self, now: Timestamp, instant: tokio::time::Instant) -> Vec<LabelPatch> {
        self.lending_open = self.policy.windows.open(now);
        self.plan = marks::plan(&self.ledger, self.policy.headroom, self.lending_open);
        let paused = !crate::core::notice::may_lend(self.reclaim.given());
        let reclaiming = self.reclaim.reclaiming();
        self.plan
            .hold_back(|node| paused || reclaiming.contains(node));
        let totals = self.ledger.totals();
        self.integrate_lent(totals.lent, self.ledger.lent_by_namespace(), instant);
        let set = |state: &'static str, v: u64| {
            self.metrics
                .gpus
                .get_or_create(&StateLabel { state })
                .set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        set("protected", totals.protected);
        set("lent", totals.lent);
        set("free", totals.free);
        self.metrics
            .spare_nodes
            .set(i64::try_from(self.plan.spare_nodes()).unwrap_or(i64::MAX));
        self.metrics
            .spare_gpus
            .set(i64::try_from(self.plan.spare_gpus()).unwrap_or(i64::MAX));
        self.metrics
            .headroom_gpus
            .set(i64::try_from(self.plan.reserved_gpus).unwrap_or(i64::MAX));
        self.metrics.lending_open.set(i64::from(self.lending_open));
        if self.synced() {
            self.history.record(self.sample(now));
        }
        if !self.leader || !self.synced() {
            return Vec::new();
        }
        self.tell_waiting(now);
        for n in self.owners.due(now.as_second()) {
            if self.owner_notices.len() < MAX_NOTICES {
                self.owner_notices.push(n);
            }
        }
        let mut patches = marks::diff(&self.ledger, &self.plan);
        patches.extend(self.orphans.iter().map(|n| LabelPatch {
            node: n.clone(),
            spare_gpus: None,
        }));
        if patches.is_empty() {
            self.metrics.last_reconcile.set(now.as_second());
        }
        patches
    }

    /// Queues a notice for each research pod waiting for spare GPUs whose reason is due to be
    /// told (see [`Repeats`]), from this pass's plan; forgets pods that no longer wait.
    fn tell_waiting(&mut self, now: Timestamp) {
        let snapshot = pending::Snapshot::of(
            &self.plan,
            self.lending_open,
            &self.policy.windows,
            self.policy.headroom,
            now,
        );
        let mut still_waiting = BTreeSet::new();
        for pod in self.ledger.pods() {
            let Some(why) = pending::reason(&snapshot, pod) else {
                continue;
            };
            still_waiting.insert(pod.key.as_str());
            if self.notices.len() < MAX_NOTICES
                && self.waiting.tell(&pod.key, &why, now.as_second())
            {
                let n = PodNotice::waiting(pod, &why);
                queue(&mut self.notices, &mut self.owners, n, now.as_second());
            }
        }
        self.waiting.retain(|k| still_waiting.contains(k));
    }

    /// GPUs by use now, from the last plan: free GPUs of headroom nodes are held back.
    pub fn sample(&self, now: Timestamp) -> Sample {
        let mut s = Sample {
            at: now.as_second(),
            ..Sample::default()
        };
        let n = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        for p in &self.plan.nodes {
            s.inference = s.inference.saturating_add(n(p.gpus.protected));
            s.research = s.research.saturating_add(n(p.gpus.lent));
            if p.verdict == Verdict::Headroom {
                s.headroom = s.headroom.saturating_add(n(p.gpus.free));
            } else {
                s.free = s.free.saturating_add(n(p.gpus.free));
            }
        }
        s
    }

    /// Adds samples from before the oldest one kept (a history rebuilt after a restart).
    pub fn backfill_history(&mut self, older: &[Sample]) -> usize {
        self.history.backfill(older)
    }

    /// Records a sample directly (tests and benchmarks fill a week without waiting for it).
    #[cfg(any(test, feature = "test-support"))]
    pub fn record_sample(&mut self, sample: Sample) {
        self.history.record(sample);
    }

    /// Adds the GPU-seconds lent since the last call, in all and per namespace (lent GPUs change
    /// only on events, and reconcile runs after every batch of events and at least every second
    /// or so).
    fn integrate_lent(
        &mut self,
        lent_now: u64,
        by_namespace: BTreeMap<String, u64>,
        instant: tokio::time::Instant,
    ) {
        if let Some((lent, by_ns, since)) = &self.lent_since {
            let dt = instant.saturating_duration_since(*since).as_secs_f64();
            if *lent > 0 && dt > 0.0 {
                self.metrics.lent_gpu_seconds.inc_by(*lent as f64 * dt);
            }
            for (namespace, gpus) in by_ns.iter().filter(|(_, g)| **g > 0) {
                let seconds = *gpus as f64 * dt;
                if seconds > 0.0 {
                    self.metrics
                        .namespace_lent_gpu_seconds
                        .get_or_create(&NamespaceLabel {
                            namespace: namespace.clone(),
                        })
                        .inc_by(seconds);
                    let ns = self.namespaces.entry(namespace.clone()).or_default();
                    ns.lent_gpu_seconds += seconds;
                }
            }
        }
        for (namespace, gpus) in &by_namespace {
            self.namespaces
                .entry(namespace.clone())
                .or_default()
                .lent_gpus = *gpus;
        }
        for (namespace, ns) in &mut self.namespaces {
            if !by_namespace.contains_key(namespace) {
                ns.lent_gpus = 0;
            }
        }
        self.lent_since = Some((lent_now, by_namespace, instant));
    }

    /// Records that a patch succeeded, so that the same patch is not sent again before the node
    /// watch reports the new labels.
    pub fn patched(&mut self, patch: &LabelPatch) {
        self.metrics.patched(true);
        if self.orphans.remove(&patch.node) {
            return;
        }
        if let Some(node) = self.ledger.node(&patch.node) {
            let mut node = node.clone();
            node.spare_label = patch.spare_gpus.map(|_| marks::SPARE_VALUE.to_string());
            node.spare_gpus_label = patch.spare_gpus.map(|n| n.to_string());
            self.ledger.apply_node(node);
        }
    }

    /// The status report at `now`.
    pub fn status(&self, now: Timestamp) -> StatusReport {
        let nodes = self
            .plan
            .nodes
            .iter()
            .map(|p| {
                let facts = self.ledger.node(&p.name);
                NodeStatus {
                    name: p.name.clone(),
                    allocatable: p.gpus.allocatable,
                    protected: p.gpus.protected,
                    lent: p.gpus.lent,
                    free: p.gpus.free,
                    state: p.verdict,
                    spare_gpus: p.spare_gpus,
                    marked_spare_gpus: facts.and_then(|f| {
                        (f.spare_label.as_deref() == Some(marks::SPARE_VALUE))
                            .then(|| f.spare_gpus_label.clone())
                            .flatten()
                    }),
                }
            })
            .collect();
        let mut research_pods: Vec<ResearchPod> = self
            .ledger
            .pods()
            .filter(|p| p.research)
            .map(|p| ResearchPod::from_facts(p, now))
            .collect();
        research_pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        StatusReport {
            generated_at: now,
            leader: Some(self.leader),
            synced: self.synced(),
            lending_open: self.lending_open,
            lending_windows: self.policy.windows.to_string(),
            headroom: self.policy.headroom,
            totals: self.ledger.totals(),
            spare_nodes: self.plan.spare_nodes(),
            nodes,
            research_pods,
            namespaces: self
                .namespaces
                .iter()
                .map(|(namespace, t)| NamespaceStatus {
                    namespace: namespace.clone(),
                    lent_gpus: t.lent_gpus,
                    lent_gpu_seconds: t.lent_gpu_seconds.round() as u64,
                    preemptions: t.preemptions,
                    lost_gpu_seconds: t.lost_gpu_seconds,
                })
                .collect(),
            recent_disruptions: self.recent.iter().rev().cloned().collect(),
        }
    }
}

/// Applies the current contents of reflector stores to a controller as one full list each:
/// the bridge between `kube::runtime::reflector` stores and the controller, for tests.
#[cfg(any(test, feature = "test-support"))]
pub fn load_stores(
    controller: &mut Controller,
    nodes: &kube::runtime::reflector::Store<Node>,
    pods: &kube::runtime::reflector::Store<Pod>,
    now: Timestamp,
) {
    controller.on_node_event(watcher::Event::Init);
    for n in nodes.state() {
        controller.on_node_event(watcher::Event::InitApply((*n).clone()));
    }
    controller.on_node_event(watcher::Event::InitDone);
    controller.on_pod_event(watcher::Event::Init, now);
    for p in pods.state() {
        controller.on_pod_event(watcher::Event::InitApply((*p).clone()), now);
    }
    controller.on_pod_event(watcher::Event::InitDone, now);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::vocabulary::CHECKPOINTED_AT_ANNOTATION;
    use crate::pool::{marks::Verdict, notices};
    use crate::test_support::fixtures::{node, pod};
    use kube::runtime::reflector::store;
    use std::time::Duration;

    fn policy(headroom: u64) -> LendingPolicy {
        LendingPolicy {
            vocabulary: Vocabulary::default(),
            headroom,
            windows: Windows::default(),
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(2_000_000_000).expect("ts")
    }

    /// A controller loaded from reflector stores holding `nodes` and `pods`.
    fn loaded(headroom: u64, nodes: Vec<Node>, pods: Vec<Pod>) -> Controller {
        let (node_store, mut node_writer) = store::<Node>();
        let (pod_store, mut pod_writer) = store::<Pod>();
        node_writer.apply_watcher_event(&watcher::Event::Init);
        for n in nodes {
            node_writer.apply_watcher_event(&watcher::Event::InitApply(n));
        }
        node_writer.apply_watcher_event(&watcher::Event::InitDone);
        pod_writer.apply_watcher_event(&watcher::Event::Init);
        for p in pods {
            pod_writer.apply_watcher_event(&watcher::Event::InitApply(p));
        }
        pod_writer.apply_watcher_event(&watcher::Event::InitDone);
        let mut c = Controller::new(policy(headroom), Metrics::default());
        load_stores(&mut c, &node_store, &pod_store, now());
        c
    }

    fn encode(m: &Metrics) -> String {
        let mut r = Registry::with_prefix("nightshift");
        m.register(&mut r);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).expect("encode");
        out
    }

    #[test]
    fn a_standby_computes_marks_but_never_patches() {
        let mut c = loaded(0, vec![node("a", 8).build()], vec![]);
        assert!(c.synced());
        assert!(c.reconcile(now(), tokio::time::Instant::now()).is_empty());
        assert_eq!(c.plan().spare_nodes(), 1);
    }

    #[test]
    fn the_leader_patches_once_per_change() {
        let mut c = loaded(
            0,
            vec![node("a", 8).build(), node("b", 8).marked(Some(8)).build()],
            vec![],
        );
        c.set_leader(true);
        let t = tokio::time::Instant::now();
        let patches = c.reconcile(now(), t);
        assert_eq!(
            patches,
            vec![LabelPatch {
                node: "a".into(),
                spare_gpus: Some(8)
            }]
        );
        c.patched(&patches[0]);
        assert!(
            c.reconcile(now(), t).is_empty(),
            "no repeat before the watch reports it"
        );
        // A research pod lands on b: its count changes.
        c.on_pod_event(
            watcher::Event::Apply(pod("r", "x").on("b").gpus(3).research().build()),
            now(),
        );
        assert_eq!(
            c.reconcile(now(), t),
            vec![LabelPatch {
                node: "b".into(),
                spare_gpus: Some(5)
            }]
        );
    }

    #[test]
    fn a_reclaim_notice_is_told_lending_stops_where_the_replica_lands_and_the_preemption_counts() {
        use crate::core::vocabulary::RECLAIM_NOTICE_ANNOTATION;
        use crate::pool::reclaim::{Action, ServiceDemand};
        let start = now() - jiff::SignedDuration::from_hours(1);
        let mut c = loaded(
            0,
            vec![node("a", 8).build(), node("b", 8).build()],
            vec![
                pod("llm", "vllm-0").on("a").gpus(8).started(start).build(),
                pod("res", "train")
                    .on("b")
                    .gpus(4)
                    .research()
                    .started(start)
                    .build(),
            ],
        );
        let service = |demand| ServiceDemand {
            namespace: "llm".into(),
            name: "vllm".into(),
            demand: Some(demand),
            replicas: 1,
            gpus_per_replica: 8,
        };
        assert!(
            c.notice_pass(&[service(0.9)], now()).is_empty(),
            "a standby tells nothing"
        );
        c.set_leader(true);
        let changes = c.notice_pass(&[service(0.9)], now());
        assert!(
            matches!(&changes[..], [c] if c.pod.name == "train" && matches!(c.action, Action::Give { .. })),
            "{changes:?}"
        );
        let told: Vec<&str> = c.take_notices().iter().map(|n| n.reason).collect();
        assert_eq!(told, ["ReclaimNotice"]);
        // b has 4 free GPUs but the next replica lands there, and c's 8 would make a newer
        // research pod the scheduler's first victim instead of the warned one: nothing is lent
        // while the notice is out.
        c.on_node_event(watcher::Event::Apply(node("c", 8).build()));
        c.reconcile(now(), tokio::time::Instant::now());
        for name in ["b", "c"] {
            let n = c
                .plan()
                .nodes
                .iter()
                .find(|n| n.name == name)
                .expect("node");
            assert_eq!(
                (n.verdict, n.spare_gpus),
                (Verdict::Reclaiming, None),
                "{name}"
            );
        }
        // The scheduler preempts it 90 s after the notice: counted as noticed, with its lead.
        let at = now() + jiff::SignedDuration::from_secs(90);
        let preempted = pod("res", "train")
            .on("b")
            .gpus(4)
            .research()
            .started(start)
            .annotation(RECLAIM_NOTICE_ANNOTATION, &now().to_string())
            .disrupted("PreemptionByScheduler", at)
            .build();
        c.on_pod_event(watcher::Event::Apply(preempted), at);
        let text = encode(c.metrics());
        assert!(
            text.contains("nightshift_pool_preempted_research_pods_total{noticed=\"true\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("nightshift_pool_reclaim_notice_lead_seconds_sum 90.0"),
            "{text}"
        );
        assert!(
            text.contains("nightshift_pool_reclaim_notices_total{outcome=\"given\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn nothing_is_patched_before_both_caches_are_synced() {
        let mut c = Controller::new(policy(0), Metrics::default());
        c.set_leader(true);
        c.on_node_event(watcher::Event::Init);
        c.on_node_event(watcher::Event::InitApply(node("a", 8).build()));
        c.on_node_event(watcher::Event::InitDone);
        assert!(!c.synced());
        assert!(c.reconcile(now(), tokio::time::Instant::now()).is_empty());
    }

    #[test]
    fn a_node_leaving_the_pool_gets_its_marks_removed() {
        let mut c = loaded(0, vec![node("a", 8).marked(Some(8)).build()], vec![]);
        c.set_leader(true);
        c.on_node_event(watcher::Event::Delete(node("a", 8).marked(Some(8)).build()));
        let patches = c.reconcile(now(), tokio::time::Instant::now());
        assert_eq!(
            patches,
            vec![LabelPatch {
                node: "a".into(),
                spare_gpus: None
            }]
        );
        c.patched(&patches[0]);
        assert!(c.reconcile(now(), tokio::time::Instant::now()).is_empty());
    }

    #[test]
    fn a_node_gone_from_a_relist_gets_its_marks_removed() {
        let mut c = loaded(
            0,
            vec![
                node("a", 8).marked(Some(8)).build(),
                node("b", 8).marked(Some(8)).build(),
            ],
            vec![],
        );
        c.set_leader(true);
        c.on_node_event(watcher::Event::Init);
        c.on_node_event(watcher::Event::InitApply(
            node("b", 8).marked(Some(8)).build(),
        ));
        c.on_node_event(watcher::Event::InitDone);
        let patches = c.reconcile(now(), tokio::time::Instant::now());
        assert_eq!(
            patches,
            vec![LabelPatch {
                node: "a".into(),
                spare_gpus: None
            }]
        );
    }

    #[test]
    fn cordoning_a_spare_node_unmarks_it() {
        let mut c = loaded(0, vec![node("a", 8).marked(Some(8)).build()], vec![]);
        c.set_leader(true);
        c.on_node_event(watcher::Event::Apply(
            node("a", 8).marked(Some(8)).cordoned().build(),
        ));
        assert_eq!(
            c.reconcile(now(), tokio::time::Instant::now()),
            vec![LabelPatch {
                node: "a".into(),
                spare_gpus: None
            }]
        );
    }

    #[test]
    fn a_closed_lending_window_unmarks_every_node() {
        let mut c = loaded(0, vec![node("a", 8).marked(Some(8)).build()], vec![]);
        c.policy.windows = "20:00-08:00@UTC".parse().expect("windows");
        c.set_leader(true);
        let noon: Timestamp = "2026-03-02T12:00:00Z".parse().expect("ts");
        let patches = c.reconcile(noon, tokio::time::Instant::now());
        assert_eq!(patches.len(), 1);
        assert_eq!(patches[0].spare_gpus, None);
        let night: Timestamp = "2026-03-02T22:00:00Z".parse().expect("ts");
        assert!(c.reconcile(night, tokio::time::Instant::now()).is_empty());
    }

    #[test]
    fn preemptions_are_counted_by_reason_and_listed_newest_first() {
        let mut c = loaded(0, vec![node("a", 8).build()], vec![]);
        let start = Timestamp::from_second(1_999_996_400).expect("ts");
        for (name, reason) in [
            ("j1", "PreemptionByScheduler"),
            ("j2", "EvictionByEvictionAPI"),
        ] {
            let p = pod("res", name).on("a").gpus(2).research().started(start);
            c.on_pod_event(watcher::Event::Apply(p.clone().build()), now());
            c.on_pod_event(
                watcher::Event::Apply(p.disrupted(reason, now()).build()),
                now(),
            );
        }
        let text = encode(c.metrics());
        assert!(
            text.contains(r#"nightshift_pool_preemptions_total{reason="PreemptionByScheduler"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"reason="EvictionByEvictionAPI"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("nightshift_pool_disrupted_pod_runtime_seconds_count 2"),
            "{text}"
        );
        let s = c.status(now());
        assert_eq!(s.recent_disruptions.len(), 2);
        assert_eq!(s.recent_disruptions[0].name, "j2");
        assert_eq!(s.recent_disruptions[0].ran_seconds, Some(3600));
    }

    #[test]
    fn research_is_accounted_per_namespace_with_the_work_lost_since_the_checkpoint() {
        let mut c = loaded(
            0,
            vec![node("a", 8).build()],
            vec![
                pod("team-a", "x").on("a").gpus(3).research().build(),
                pod("team-b", "y").on("a").gpus(1).research().build(),
                pod("serving", "vllm").on("a").gpus(4).build(),
            ],
        );
        let t0 = tokio::time::Instant::now();
        c.reconcile(now(), t0);
        c.reconcile(now(), t0 + Duration::from_secs(100));
        // team-a's pod ran an hour, checkpointed 10 minutes before it was preempted: 3 GPUs ×
        // 600 s lost. team-b's pod never reported a checkpoint: 1 GPU × its whole hour.
        let start = now()
            .checked_sub(jiff::SignedDuration::from_secs(3600))
            .expect("ts");
        let checkpoint = now()
            .checked_sub(jiff::SignedDuration::from_secs(600))
            .expect("ts");
        let a = pod("team-a", "x")
            .on("a")
            .gpus(3)
            .research()
            .started(start)
            .annotation(CHECKPOINTED_AT_ANNOTATION, &checkpoint.to_string());
        let b = pod("team-b", "y").on("a").gpus(1).research().started(start);
        for p in [a, b] {
            c.on_pod_event(watcher::Event::Apply(p.clone().build()), now());
            c.on_pod_event(
                watcher::Event::Apply(p.disrupted("PreemptionByScheduler", now()).build()),
                now(),
            );
        }
        let text = encode(c.metrics());
        for line in [
            r#"nightshift_pool_namespace_lent_gpu_seconds_total{namespace="team-a"} 300"#,
            r#"nightshift_pool_namespace_lent_gpu_seconds_total{namespace="team-b"} 100"#,
            r#"nightshift_pool_namespace_preemptions_total{namespace="team-a"} 1"#,
            r#"nightshift_pool_lost_gpu_seconds_total{namespace="team-a"} 1800"#,
            r#"nightshift_pool_lost_gpu_seconds_total{namespace="team-b"} 3600"#,
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
        assert!(!text.contains(r#"namespace="serving""#), "{text}");
        let status = c.status(now());
        let team_a = status
            .namespaces
            .iter()
            .find(|n| n.namespace == "team-a")
            .expect("team-a");
        assert_eq!(
            (
                team_a.lent_gpu_seconds,
                team_a.preemptions,
                team_a.lost_gpu_seconds
            ),
            (300, 1, 1800)
        );
        assert_eq!(status.recent_disruptions[0].lost_gpu_seconds, Some(3600));
        let rendered = status.render();
        assert!(rendered.contains("Research by namespace"), "{rendered}");
        assert!(rendered.contains("LOST GPU-H"), "{rendered}");
    }

    #[test]
    fn the_leader_stamps_each_pass_that_leaves_the_marks_matching() {
        let mut c = loaded(0, vec![node("a", 8).build()], vec![]);
        c.set_leader(true);
        let t0 = tokio::time::Instant::now();
        let patches = c.reconcile(now(), t0);
        assert_eq!(patches.len(), 1, "the node needs its marks first");
        assert!(
            encode(c.metrics()).contains("nightshift_pool_last_reconcile_timestamp_seconds 0"),
            "not stamped while a patch is due"
        );
        c.patched(&patches[0]);
        assert!(c.reconcile(now(), t0).is_empty());
        let stamped = format!(
            "nightshift_pool_last_reconcile_timestamp_seconds {}",
            now().as_second()
        );
        assert!(
            encode(c.metrics()).contains(&stamped),
            "{}",
            encode(c.metrics())
        );
    }

    #[test]
    fn the_leader_alone_notices_preempted_research_pods() {
        let mut c = loaded(0, vec![node("a", 8).build()], vec![]);
        let start = now()
            .checked_sub(jiff::SignedDuration::from_secs(5400))
            .expect("ts");
        let p = pod("team-a", "sft")
            .on("a")
            .gpus(2)
            .research()
            .started(start);
        c.on_pod_event(watcher::Event::Apply(p.clone().build()), now());
        c.on_pod_event(
            watcher::Event::Apply(p.clone().disrupted("PreemptionByScheduler", now()).build()),
            now(),
        );
        assert!(c.take_notices().is_empty(), "a standby publishes nothing");
        c.set_leader(true);
        let q = pod("team-a", "eval")
            .on("a")
            .gpus(2)
            .research()
            .started(start);
        c.on_pod_event(watcher::Event::Apply(q.clone().build()), now());
        let lent: Vec<&str> = c.take_notices().iter().map(|n| n.reason).collect();
        assert_eq!(lent, ["Lent"]);
        c.on_pod_event(
            watcher::Event::Apply(q.disrupted("PreemptionByScheduler", now()).build()),
            now(),
        );
        let notices = c.take_notices();
        assert_eq!(notices.len(), 1);
        let n = &notices[0];
        assert_eq!((n.namespace.as_str(), n.name.as_str()), ("team-a", "eval"));
        assert_eq!((n.reason, n.action), ("Preempted", "Preempt"));
        assert!(n.uid.is_some(), "the fixture pod has a UID");
        assert_eq!(
            n.note,
            "Preempted by the scheduler for inference (PreemptionByScheduler) on node a after \
             running 1h30m, holding 2 GPUs; about 180 GPU-minutes of work lost since its last \
             checkpoint or start"
        );
        assert!(c.take_notices().is_empty(), "taken once");
    }

    #[test]
    fn the_leader_tells_a_jobs_events_on_the_job_once_per_burst() {
        let mut c = loaded(0, vec![node("a", 8).build()], vec![]);
        let t0 = now();
        let i0 = tokio::time::Instant::now();
        let member = |name: &str| {
            pod("team-a", name)
                .on("a")
                .gpus(1)
                .research()
                .started(t0)
                .owned_by("batch/v1", "Job", "sft")
        };
        c.on_pod_event(watcher::Event::Apply(member("sft-0").build()), t0);
        c.reconcile(t0 + jiff::SignedDuration::from_secs(notices::GATHER), i0);
        assert!(
            c.take_owner_notices().is_empty(),
            "a standby tells no owner"
        );
        c.set_leader(true);
        for i in 1..4 {
            c.on_pod_event(
                watcher::Event::Apply(member(&format!("sft-{i}")).build()),
                t0,
            );
        }
        c.on_pod_event(
            watcher::Event::Apply(pod("team-a", "alone").on("a").gpus(1).research().build()),
            t0,
        );
        assert_eq!(c.take_notices().len(), 4, "each pod is told at once");
        c.reconcile(t0, i0);
        assert!(c.take_owner_notices().is_empty(), "gathering the burst");
        c.reconcile(t0 + jiff::SignedDuration::from_secs(notices::GATHER), i0);
        let told = c.take_owner_notices();
        assert_eq!(
            told.len(),
            1,
            "one Event for the Job, none for the lone pod"
        );
        let n = &told[0];
        assert_eq!((n.owner.name.as_str(), n.reason), ("sft", "Lent"));
        assert!(
            n.note.starts_with("3 pods of this Job bound to spare GPUs")
                && n.note.contains("sft-1 (1 GPU of a)"),
            "{}",
            n.note
        );
        // The scheduler preempts two of them: one more Event on the Job, naming both.
        let later = t0 + jiff::SignedDuration::from_secs(60);
        for name in ["sft-1", "sft-2"] {
            c.on_pod_event(
                watcher::Event::Apply(
                    member(name)
                        .disrupted("PreemptionByScheduler", later)
                        .build(),
                ),
                later,
            );
        }
        c.reconcile(later + jiff::SignedDuration::from_secs(notices::GATHER), i0);
        let told = c.take_owner_notices();
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!((told[0].reason, told[0].warning), ("Preempted", true));
        assert!(
            told[0]
                .note
                .starts_with("2 pods of this Job preempted by the scheduler"),
            "{}",
            told[0].note
        );
        c.set_leader(false);
        c.on_pod_event(watcher::Event::Apply(member("sft-9").build()), later);
        c.reconcile(later + jiff::SignedDuration::from_secs(3600), i0);
        assert!(
            c.take_owner_notices().is_empty(),
            "a former leader tells nothing"
        );
    }

    #[test]
    fn the_leader_notices_research_pods_bound_to_pool_gpus_once() {
        let mut c = loaded(0, vec![node("a", 8).build()], vec![]);
        c.set_leader(true);
        let queued = pod("team-a", "sft").unbound().gpus(2).research();
        c.on_pod_event(watcher::Event::Apply(queued.build()), now());
        assert!(c.take_notices().is_empty(), "not bound yet");
        let bound = pod("team-a", "sft").on("a").gpus(2).research();
        c.on_pod_event(watcher::Event::Apply(bound.clone().build()), now());
        let notices = c.take_notices();
        assert_eq!(notices.len(), 1);
        assert_eq!((notices[0].reason, notices[0].warning), ("Lent", false));
        assert!(
            notices[0]
                .note
                .starts_with("Bound to 2 spare GPUs of inference node a"),
            "{}",
            notices[0].note
        );
        c.on_pod_event(watcher::Event::Apply(bound.build()), now());
        assert!(
            c.take_notices().is_empty(),
            "an update of a bound pod is not news"
        );
        for p in [
            pod("inf", "vllm").on("a").gpus(2),
            pod("team-a", "cpu-only").on("a").research(),
            pod("team-a", "elsewhere").on("cpu-node").gpus(1).research(),
        ] {
            c.on_pod_event(watcher::Event::Apply(p.build()), now());
        }
        assert!(
            c.take_notices().is_empty(),
            "inference, GPU-less and off-pool pods are not lent GPUs"
        );
    }

    #[test]
    fn the_leader_tells_a_waiting_research_pod_why_once_per_reason() {
        let full = pod("inf", "vllm").on("a").gpus(8);
        let queued = pod("team-a", "sft").unbound().gpus(2).research();
        let mut c = loaded(
            0,
            vec![node("a", 8).build()],
            vec![full.clone().build(), queued.build()],
        );
        let t0 = now();
        let i0 = tokio::time::Instant::now();
        c.reconcile(t0, i0);
        assert!(c.take_notices().is_empty(), "a standby tells nothing");
        c.set_leader(true);
        c.reconcile(t0, i0);
        let notices = c.take_notices();
        assert_eq!(notices.len(), 1, "{notices:?}");
        let n = &notices[0];
        assert_eq!(
            (n.name.as_str(), n.reason, n.action),
            ("sft", "NoSpareGPUs", "Wait")
        );
        assert!(
            n.note
                .contains("every lendable GPU is in use (8 by inference"),
            "{}",
            n.note
        );
        assert_eq!(n.uid.as_deref(), Some("uid-team-a-sft"));
        for s in 1..10 {
            c.reconcile(
                t0 + jiff::SignedDuration::from_secs(s),
                i0 + Duration::from_secs(s as u64),
            );
        }
        assert!(c.take_notices().is_empty(), "not one event per pass");
        // Inference scales down: the pod fits, nothing to tell; the scheduler places it.
        c.on_pod_event(watcher::Event::Delete(full.build()), t0);
        c.reconcile(t0 + jiff::SignedDuration::from_secs(60), i0);
        assert!(c.take_notices().is_empty());
    }

    #[test]
    fn usage_is_sampled_once_a_minute_with_headroom_apart() {
        let mut c = loaded(
            8,
            vec![node("a", 8).build(), node("b", 8).build()],
            vec![
                pod("inf", "v").on("b").gpus(1).build(),
                pod("res", "r").on("b").gpus(2).research().build(),
            ],
        );
        let t = tokio::time::Instant::now();
        c.reconcile(now(), t);
        c.reconcile(now(), t);
        assert_eq!(c.history().len(), 1);
        let s = c.sample(now());
        assert_eq!((s.inference, s.research, s.free, s.headroom), (1, 2, 5, 8));
        let later = now()
            .checked_add(jiff::SignedDuration::from_secs(60))
            .expect("ts");
        c.reconcile(later, t);
        assert_eq!(c.history().len(), 2);
    }

    #[test]
    fn the_list_of_recent_disruptions_is_bounded() {
        let mut c = loaded(0, vec![node("a", 8).build()], vec![]);
        for i in 0..(RECENT_DISRUPTIONS + 5) {
            let p = pod("res", &format!("j{i}")).on("a").research();
            c.on_pod_event(watcher::Event::Apply(p.clone().build()), now());
            c.on_pod_event(
                watcher::Event::Apply(p.disrupted("PreemptionByScheduler", now()).build()),
                now(),
            );
        }
        assert_eq!(c.status(now()).recent_disruptions.len(), RECENT_DISRUPTIONS);
    }

    #[test]
    fn lent_gpu_seconds_accumulate_between_passes() {
        let mut c = loaded(
            0,
            vec![node("a", 8).build()],
            vec![pod("r", "x").on("a").gpus(3).research().build()],
        );
        let t0 = tokio::time::Instant::now();
        c.reconcile(now(), t0);
        c.reconcile(now(), t0 + Duration::from_secs(10));
        let text = encode(c.metrics());
        assert!(
            text.contains("nightshift_pool_lent_gpu_seconds_total 30"),
            "{text}"
        );
        assert!(
            text.contains(r#"nightshift_pool_gpus{state="lent"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"nightshift_pool_gpus{state="free"} 5"#),
            "{text}"
        );
        assert!(text.contains("nightshift_pool_spare_nodes 1"), "{text}");
    }

    #[test]
    fn status_lists_nodes_research_pods_and_marks() {
        let created = Timestamp::from_second(1_999_999_000).expect("ts");
        let mut c = loaded(
            8,
            vec![node("a", 8).build(), node("b", 8).marked(Some(6)).build()],
            vec![
                pod("inf", "v").on("b").gpus(1).build(),
                pod("res", "sft")
                    .on("b")
                    .gpus(1)
                    .research()
                    .created(created)
                    .build(),
                pod("res", "queued")
                    .unbound()
                    .research()
                    .created(created)
                    .build(),
            ],
        );
        c.reconcile(now(), tokio::time::Instant::now());
        let s = c.status(now());
        assert_eq!(s.nodes.len(), 2);
        assert_eq!(s.nodes[0].state, Verdict::Headroom);
        assert_eq!(s.nodes[1].spare_gpus, Some(6));
        assert_eq!(s.nodes[1].marked_spare_gpus.as_deref(), Some("6"));
        assert_eq!(s.research_pods.len(), 2);
        assert_eq!(s.research_pods[0].name, "queued");
        assert_eq!(s.research_pods[1].age_seconds, Some(1000));
        let text = s.render();
        assert!(
            text.contains("GPU pool: 2 nodes, 16 GPUs: 1 protected, 1 lent, 14 free"),
            "{text}"
        );
        assert!(text.contains("headroom"), "{text}");
        assert!(text.contains("sft"), "{text}");
        let json = serde_json::to_string(&s).expect("json");
        let back: crate::pool::status::StatusReport = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, s);
    }

    #[test]
    fn status_counts_pods_by_the_names_in_use() {
        let mut c = Controller::new(
            LendingPolicy {
                vocabulary: Vocabulary {
                    lent_label: Some("example.com/borrowed".into()),
                    research_priority_class: Some("scavenger".into()),
                    ..Vocabulary::default()
                },
                ..policy(0)
            },
            Metrics::default(),
        );
        let (node_store, _) = store::<Node>();
        let (pod_store, _) = store::<Pod>();
        load_stores(&mut c, &node_store, &pod_store, now());
        c.on_node_event(watcher::Event::Apply(node("a", 8).build()));
        for p in [
            pod("inf", "vllm").on("a").gpus(1),
            pod("res", "sft")
                .on("a")
                .gpus(2)
                .priority_class("scavenger"),
            pod("res", "rl")
                .on("a")
                .gpus(3)
                .label("example.com/borrowed", "true"),
            // Default names mean nothing once renamed: this pod is inference.
            pod("inf", "old-style").on("a").gpus(1).research(),
        ] {
            c.on_pod_event(watcher::Event::Apply(p.build()), now());
        }
        c.reconcile(now(), tokio::time::Instant::now());
        let s = c.status(now());
        assert_eq!(
            (s.totals.protected, s.totals.lent, s.totals.free),
            (2, 5, 1)
        );
        let research: Vec<&str> = s.research_pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(research, ["rl", "sft"]);
        assert!(
            s.render()
                .contains("GPU pool: 1 nodes, 8 GPUs: 2 protected, 5 lent, 1 free"),
            "{}",
            s.render()
        );
    }
}
