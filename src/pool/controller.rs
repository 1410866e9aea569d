//! The spare-mark controller's state machine: applies watch events to the [`Ledger`], decides the
//! marks, tracks disruptions of research pods and keeps the metrics.
//!
//! No I/O here: [`Controller`] takes watch events and the time, and returns the label patches to
//! make. The transport (watch streams, the Lease, the API calls) lives in [`super::run`], so this
//! part is tested against fake stores and recorded events.
//!
//! This file owns the controller's state, its policy and what it reports (`/status`); the jobs
//! on that state each have a file of their own:
//!
//! - `watch`: watch events into the ledger, and disruptions of research pods recorded.
//! - `reconcile`: each pass's plan and label patches, usage samples and lent GPU-seconds.
//! - `notify`: reclaim-notice passes and the Events queued for research pods and their owners.
//! - `metrics`: the pool's metric families and their registration.

mod metrics;
mod notify;
mod reconcile;
mod watch;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use jiff::Timestamp;

use super::{
    accounting::{DisruptionRecord, Ledger, NodeFacts},
    history::History,
    marks::{self, Plan},
    notices::{Digests, OwnerNotice, PodNotice},
    pending::Repeats,
    reclaim::Reclaim,
    status::{NamespaceStatus, NodeStatus, ResearchPod, StatusReport},
    windows::Windows,
};
use crate::core::vocabulary::Vocabulary;

pub use metrics::Metrics;
pub use notify::MAX_NOTICES;
#[cfg(any(test, feature = "test-support"))]
pub use watch::load_stores;

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

    /// Whether both watches have listed everything once.
    pub fn synced(&self) -> bool {
        self.nodes_synced && self.pods_synced
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::marks::Verdict;
    use crate::test_support::fixtures::{node, pod};
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::runtime::{reflector::store, watcher};
    use prometheus_client::registry::Registry;

    pub(super) fn policy(headroom: u64) -> LendingPolicy {
        LendingPolicy {
            vocabulary: Vocabulary::default(),
            headroom,
            windows: Windows::default(),
        }
    }

    pub(super) fn now() -> Timestamp {
        Timestamp::from_second(2_000_000_000).expect("ts")
    }

    /// A controller loaded from reflector stores holding `nodes` and `pods`.
    pub(super) fn loaded(headroom: u64, nodes: Vec<Node>, pods: Vec<Pod>) -> Controller {
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

    pub(super) fn encode(m: &Metrics) -> String {
        let mut r = Registry::with_prefix("nightshift");
        m.register(&mut r);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).expect("encode");
        out
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
