//! Watch events into the controller's state: pool nodes and pods applied to the ledger (full
//! re-lists included), nodes that left the pool while marked remembered for unmarking, and
//! disruptions of research pods recorded (metrics, totals per namespace, the recent list, the
//! Events for the pods and their owners).
//!
//! It must not decide marks or send anything: the next reconcile pass plans from what it
//! applied, and the Events it queues are published by [`crate::pool::run`].

use std::collections::BTreeSet;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher;

use super::{
    Controller, RECENT_DISRUPTIONS,
    metrics::{NamespaceLabel, NoticedLabel, ReasonLabel},
    notify::queue,
};
use crate::pool::{
    accounting::{DisruptionRecord, NodeFacts, node_facts, pod_facts},
    notices::PodNotice,
};

impl Controller {
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
    pub fn apply_pod_facts(&mut self, pod: crate::pool::accounting::PodFacts, now: Timestamp) {
        if let Some(r) = self.ledger.apply_pod(pod, now) {
            self.record_disruption(r, now);
        }
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
    use crate::pool::controller::tests::{encode, loaded, now};
    use crate::pool::marks::LabelPatch;
    use crate::test_support::fixtures::{node, pod};
    use std::time::Duration;

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
        assert!(rendered.contains("TAKEN BY"), "{rendered}");
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
}
