//! The reconcile pass: the plan of spare marks at a time (lending windows, headroom, nodes held
//! back while reclaim notices are out), the label patches that bring the nodes to it (leader only,
//! once synced), and what each pass records: GPUs by state, a usage sample, lent GPU-seconds.
//! Also what a patch that succeeded changes in the ledger.
//!
//! It must not send the patches: [`crate::pool::run`] does, and reports back through
//! [`Controller::patched`].

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::{
    Controller, MAX_NOTICES,
    metrics::{NamespaceLabel, StateLabel},
};
use crate::pool::{
    history::Sample,
    marks::{self, LabelPatch, Verdict},
};

impl Controller {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::controller::Metrics;
    use crate::pool::controller::tests::{encode, loaded, now, policy};
    use crate::test_support::fixtures::{node, pod};
    use kube::runtime::watcher;
    use std::time::Duration;

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
}
