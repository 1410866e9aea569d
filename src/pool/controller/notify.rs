//! What the controller tells research pods and their owners: reclaim-notice passes (given,
//! withdrawn, undelivered), the Events queued for pods (lent GPUs, why a pod waits, disruptions;
//! at most [`MAX_NOTICES`]) and their digests for the pods' Jobs and Workflows.
//!
//! It only decides and queues: the notices are delivered by [`crate::pool::deliver`] and the
//! Events published by [`crate::pool::run`].

use std::collections::BTreeSet;

use jiff::Timestamp;

use super::{Controller, metrics::OutcomeLabel};
use crate::pool::{
    accounting::PodFacts,
    notices::{Digests, OwnerNotice, PodNotice},
    pending,
    reclaim::{Action, Change, Reclaim, ServiceDemand},
};

/// Most notices kept for publishing: the publisher drains them every reconcile pass, so this
/// bounds memory only while the API server is unreachable (a burst of preemptions is 64 pods or
/// so; a thousand covers many of them). Owners' notices are bounded the same way.
pub const MAX_NOTICES: usize = 1000;

/// Queues a pod's notice (unless [`MAX_NOTICES`] wait already) and adds it to its owner's next
/// Event. A free function so that the controller can queue while it reads its ledger.
pub(super) fn queue(notices: &mut Vec<PodNotice>, owners: &mut Digests, n: PodNotice, now: i64) {
    if notices.len() >= MAX_NOTICES {
        return;
    }
    owners.add(&n, now);
    notices.push(n);
}

impl Controller {
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

    /// Takes the events waiting to be published on pods.
    pub fn take_notices(&mut self) -> Vec<PodNotice> {
        std::mem::take(&mut self.notices)
    }

    /// Takes the events waiting to be published on the pods' Jobs and Workflows.
    pub fn take_owner_notices(&mut self) -> Vec<OwnerNotice> {
        std::mem::take(&mut self.owner_notices)
    }

    /// The `Lent` notice when a research pod is newly seen bound to GPUs of a pool node (by the
    /// leader, once synced: a re-list does not repeat it).
    pub(super) fn newly_lent(&self, pod: &PodFacts) -> Option<PodNotice> {
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

    /// Queues a notice for each research pod waiting for spare GPUs whose reason is due to be
    /// told (see [`pending::Repeats`]), from this pass's plan; forgets pods that no longer wait.
    pub(super) fn tell_waiting(&mut self, now: Timestamp) {
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
}

#[cfg(test)]
mod tests {
    use crate::pool::controller::tests::{encode, loaded, now};
    use crate::pool::{marks::Verdict, notices};
    use crate::test_support::fixtures::{node, pod};
    use kube::runtime::watcher;
    use std::time::Duration;

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
}
