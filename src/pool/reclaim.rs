//! Reclaim notices on the live pool: which research pods to warn that inference will take their
//! GPUs back, from each inference service's demand and the pool's ledger, and what changed since
//! the last pass (notices to give, notices to withdraw).
//!
//! Pure: the decisions are [`crate::core::notice`]'s (when a service needs its next replicas, whom
//! the scheduler preempts for them), the same code the simulator runs. This module feeds them the
//! live ledger and keeps what was told, so a notice is given once and withdrawn once;
//! [`super::run`] reads the demand and delivers the changes.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;

use super::{
    accounting::{Hook, Ledger, PodFacts},
    owner::Owner,
};
use crate::core::notice::{self, Candidate, NodeRoom, NoticePolicy, Watch};

/// One inference service (a ScaledObject and its scale target) as a pass sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceDemand {
    /// The ScaledObject's namespace and name.
    pub namespace: String,
    pub name: String,
    /// Demand in replicas (fractional), `None` when it could not be read this pass: the notices
    /// then stand as they are, neither given nor withdrawn on a failed reading.
    pub demand: Option<f64>,
    /// Replicas the scale target has (asked for).
    pub replicas: u32,
    /// GPUs one replica requests.
    pub gpus_per_replica: u32,
}

impl ServiceDemand {
    fn key(&self) -> (String, String) {
        (self.namespace.clone(), self.name.clone())
    }

    /// `namespace/name`, as notices name the service.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The research pod a change is for, as the ledger knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct NoticedPod {
    /// The ledger's key (the UID, else `namespace/name`).
    pub key: String,
    pub namespace: String,
    pub name: String,
    /// The UID, when the API server gave one (Events name the pod by it).
    pub uid: Option<String>,
    /// Its Job or Workflow, told too.
    pub owner: Option<Owner>,
}

impl NoticedPod {
    fn of(pod: &PodFacts) -> Self {
        Self {
            key: pod.key.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: (!pod.key.contains('/')).then(|| pod.key.clone()),
            owner: pod.owner.clone(),
        }
    }

    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What to tell a pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Warn the pod: annotation, condition, Events, and its checkpoint endpoint if it has one.
    Give {
        /// The notice's time (the annotation's value).
        at: Timestamp,
        /// The service whose next replicas need the pod's GPUs (`namespace/name`).
        service: String,
        hook: Option<Hook>,
    },
    /// The demand fell back: remove the annotation, set the condition to `False`.
    Withdraw,
}

/// A change to deliver to one research pod.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub pod: NoticedPod,
    pub action: Action,
}

/// What the controller told, and the per-service notice state.
#[derive(Debug, Default)]
pub struct Reclaim {
    pub policy: NoticePolicy,
    watches: BTreeMap<(String, String), Watch>,
    /// Pods warned (by key), with the service they were warned for.
    given: BTreeMap<String, String>,
    /// Pods whose notice was withdrawn and whose annotation the watch still shows.
    withdrawn: BTreeSet<String>,
    /// Pool nodes the next replicas are expected to land on: not lent meanwhile.
    reclaiming: BTreeSet<String>,
}

impl Reclaim {
    pub fn new(policy: NoticePolicy) -> Self {
        Self {
            policy,
            ..Self::default()
        }
    }

    /// Nodes where the next replicas are expected: the spare marks stay off them.
    pub fn reclaiming(&self) -> &BTreeSet<String> {
        &self.reclaiming
    }

    /// Pods currently under notice.
    pub fn given(&self) -> usize {
        self.given.len()
    }

    /// One pass at `now`: updates each service's notice state, predicts the scheduler's
    /// victims for the replicas the notices cover, and returns the notices to give and withdraw.
    pub fn pass(
        &mut self,
        ledger: &Ledger,
        services: &[ServiceDemand],
        now: Timestamp,
    ) -> Vec<Change> {
        let wanted = self.replicas_wanted(services, now);
        let victims = self.predict(ledger, &wanted, now);
        self.changes(ledger, &victims, now)
    }

    /// Phase 1: how many replicas beyond its own each service's notices cover.
    fn replicas_wanted(
        &mut self,
        services: &[ServiceDemand],
        now: Timestamp,
    ) -> Vec<(String, u32, u32)> {
        let seen: BTreeSet<(String, String)> = services.iter().map(ServiceDemand::key).collect();
        self.watches.retain(|k, _| seen.contains(k));
        let t = now.as_millisecond() as f64 / 1000.0;
        let mut wanted = Vec::new();
        for s in services {
            let watch = self.watches.entry(s.key()).or_default();
            let extra = match s.demand {
                Some(d) => self.policy.update(watch, t, d, s.replicas),
                None => watch.covered().saturating_sub(s.replicas),
            };
            if extra > 0 && s.gpus_per_replica > 0 {
                wanted.push((s.id(), extra, s.gpus_per_replica));
            }
        }
        wanted
    }

    /// Phase 2: the pods the scheduler would preempt for those replicas, by pod key, with the
    /// service each is warned for; notes the nodes the replicas land on.
    fn predict(
        &mut self,
        ledger: &Ledger,
        wanted: &[(String, u32, u32)],
        now: Timestamp,
    ) -> BTreeMap<String, String> {
        self.reclaiming.clear();
        let mut victims = BTreeMap::new();
        if wanted.is_empty() {
            return victims;
        }
        let (names, mut rooms) = rooms(ledger, now);
        for (service, extra, gpus) in wanted {
            for _ in 0..*extra {
                let Some(placed) = notice::place(&mut rooms, *gpus) else {
                    break;
                };
                self.reclaiming.insert(names[placed.node].clone());
                for key in placed.victims {
                    victims.insert(key, service.clone());
                }
            }
        }
        victims
    }

    /// Phase 3: the difference between the predicted victims and what was told.
    fn changes(
        &mut self,
        ledger: &Ledger,
        victims: &BTreeMap<String, String>,
        now: Timestamp,
    ) -> Vec<Change> {
        let mut changes = Vec::new();
        for pod in ledger.pods() {
            if pod.noticed.is_none() {
                self.withdrawn.remove(&pod.key);
            }
            match victims.get(&pod.key) {
                Some(service) if !self.given.contains_key(&pod.key) => {
                    self.given.insert(pod.key.clone(), service.clone());
                    self.withdrawn.remove(&pod.key);
                    // A notice given by a previous leader (or before a restart) stands.
                    if pod.noticed.is_none() {
                        changes.push(Change {
                            pod: NoticedPod::of(pod),
                            action: Action::Give {
                                at: now,
                                service: service.clone(),
                                hook: pod.hook.clone(),
                            },
                        });
                    }
                }
                Some(_) => {}
                None => {
                    let told = self.given.remove(&pod.key).is_some();
                    let stale = pod.noticed.is_some() && !self.withdrawn.contains(&pod.key);
                    if (told || stale) && !pod.terminal && pod.disruption.is_none() {
                        self.withdrawn.insert(pod.key.clone());
                        changes.push(Change {
                            pod: NoticedPod::of(pod),
                            action: Action::Withdraw,
                        });
                    }
                }
            }
        }
        // Pods gone from the ledger are forgotten.
        self.given.retain(|k, _| ledger.pod(k).is_some());
        self.withdrawn.retain(|k| ledger.pod(k).is_some());
        changes
    }

    /// A notice could not be delivered: forget it, so the next pass gives it again.
    pub fn undelivered(&mut self, key: &str) {
        self.given.remove(key);
    }

    /// Forgets every notice and service state (leadership lost: the next leader decides).
    pub fn clear(&mut self) {
        let policy = self.policy;
        *self = Self::new(policy);
    }
}

/// The pool as the scheduler's preemption sees it: per schedulable, ready, readable node, the
/// GPUs free and the research pods running there (the potential victims). Returns the node
/// names beside the rooms, in the ledger's order.
fn rooms(ledger: &Ledger, now: Timestamp) -> (Vec<String>, Vec<NodeRoom<String>>) {
    let mut by_node: BTreeMap<&str, Vec<Candidate<String>>> = BTreeMap::new();
    for pod in ledger.pods() {
        if let Some(c) = candidate(pod, now) {
            let node = pod.node.as_deref().unwrap_or_default();
            by_node.entry(node).or_default().push(c);
        }
    }
    let mut names = Vec::new();
    let mut rooms = Vec::new();
    for node in ledger.nodes() {
        let Some(gpus) = ledger.gpus(&node.name) else {
            continue;
        };
        if !(node.schedulable && node.ready && gpus.trusted) {
            continue;
        }
        names.push(node.name.clone());
        rooms.push(NodeRoom {
            free: u32::try_from(gpus.free).unwrap_or(u32::MAX),
            research: by_node.remove(node.name.as_str()).unwrap_or_default(),
        });
    }
    (names, rooms)
}

/// A research pod the scheduler may preempt: bound, holding GPUs, not ending. One not started
/// yet counts as started now (the latest: first to go).
fn candidate(pod: &PodFacts, now: Timestamp) -> Option<Candidate<String>> {
    if !pod.research || pod.terminal || pod.disruption.is_some() {
        return None;
    }
    pod.node.as_ref()?;
    let gpus = u32::try_from(pod.gpus.filter(|g| *g > 0)?).ok()?;
    let started = pod.started.unwrap_or(now);
    Some(Candidate {
        id: pod.key.clone(),
        gpus,
        priority: pod.priority,
        started: started.as_millisecond() as f64 / 1000.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::vocabulary::{RECLAIM_NOTICE_ANNOTATION, Vocabulary};
    use crate::pool::accounting::pod_facts;
    use crate::test_support::fixtures::{node, pod};

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("time")
    }

    /// Two 8-GPU nodes: n1 with one inference replica (4 GPUs) and two research pods of 2 GPUs
    /// (r-old started at 0, r-new at 100); n2 with one 8-GPU research pod started at 50.
    fn ledger(extra: &[(&str, &str)]) -> Ledger {
        let names = Vocabulary::default();
        let mut l = Ledger::new();
        l.replace_nodes([
            crate::pool::accounting::node_facts(&node("n1", 8).build(), &names),
            crate::pool::accounting::node_facts(&node("n2", 8).build(), &names),
        ]);
        let research = |name: &str, node: &str, gpus: u64, started: i64| {
            let p = pod("res", name)
                .on(node)
                .gpus(gpus)
                .research()
                .started(t(started));
            match extra.iter().find(|(n, _)| *n == name) {
                Some((_, at)) => p.annotation(RECLAIM_NOTICE_ANNOTATION, at),
                None => p,
            }
        };
        let pods = [
            pod("llm", "vllm-0").on("n1").gpus(4).started(t(0)),
            research("r-old", "n1", 2, 0),
            research("r-new", "n1", 2, 100),
            research("r-big", "n2", 8, 50),
        ];
        l.replace_pods(pods.into_iter().map(|p| pod_facts(&p.build(), &names)));
        l
    }

    fn service(demand: Option<f64>, replicas: u32) -> ServiceDemand {
        ServiceDemand {
            namespace: "llm".into(),
            name: "vllm".into(),
            demand,
            replicas,
            gpus_per_replica: 4,
        }
    }

    fn policy() -> NoticePolicy {
        NoticePolicy {
            window_s: 0.0,
            margin: 0.3,
            hysteresis: 0.2,
        }
    }

    fn names(changes: &[Change]) -> Vec<String> {
        changes
            .iter()
            .map(|c| match c.action {
                Action::Give { .. } => format!("give {}", c.pod.id()),
                Action::Withdraw => format!("withdraw {}", c.pod.id()),
            })
            .collect()
    }

    #[test]
    fn demand_far_from_the_next_replica_warns_nobody() {
        let mut r = Reclaim::new(policy());
        let changes = r.pass(&ledger(&[]), &[service(Some(0.5), 1)], t(200));
        assert!(changes.is_empty());
        assert!(r.reclaiming().is_empty());
    }

    #[test]
    fn the_scheduler_s_victims_are_warned_once_then_withdrawn_once() {
        let l = ledger(&[]);
        let mut r = Reclaim::new(policy());
        // 0.8 is within 0.3 of the second replica. Its 4 GPUs could come from n1 (two 2-GPU
        // victims) or n2 (one 8-GPU victim): the fewest victims win, so n2's pod is warned.
        let changes = r.pass(&l, &[service(Some(0.8), 1)], t(200));
        assert_eq!(names(&changes), ["give res/r-big"]);
        assert_eq!(r.reclaiming().iter().collect::<Vec<_>>(), ["n2"]);
        // The same demand again: nothing new.
        assert!(r.pass(&l, &[service(Some(0.8), 1)], t(201)).is_empty());
        // Within the hysteresis: kept.
        assert!(r.pass(&l, &[service(Some(0.6), 1)], t(202)).is_empty());
        // Further back: withdrawn, once.
        let changes = r.pass(&l, &[service(Some(0.3), 1)], t(203));
        assert_eq!(names(&changes), ["withdraw res/r-big"]);
        assert!(r.reclaiming().is_empty());
        assert!(r.pass(&l, &[service(Some(0.3), 1)], t(204)).is_empty());
    }

    #[test]
    fn victims_on_one_node_are_the_latest_started_and_the_rest_reprieved() {
        let names_ = Vocabulary::default();
        let mut l = ledger(&[]);
        // n2 now full of inference: only n1 can make room for a 2-GPU replica: r-new (the latest
        // started) goes, r-old is reprieved.
        l.apply_pod(
            pod_facts(
                &pod("res", "r-big")
                    .on("n2")
                    .gpus(8)
                    .research()
                    .phase("Succeeded")
                    .build(),
                &names_,
            ),
            t(150),
        );
        l.apply_pod(
            pod_facts(&pod("llm", "vllm-1").on("n2").gpus(8).build(), &names_),
            t(150),
        );
        let mut r = Reclaim::new(policy());
        let small = ServiceDemand {
            gpus_per_replica: 2,
            ..service(Some(0.8), 1)
        };
        let mut changes = r.pass(&l, &[small], t(200));
        changes.retain(|c| matches!(c.action, Action::Give { .. }));
        assert_eq!(names(&changes), ["give res/r-new"]);
    }

    #[test]
    fn a_failed_reading_neither_gives_nor_withdraws() {
        let l = ledger(&[]);
        let mut r = Reclaim::new(policy());
        assert_eq!(r.pass(&l, &[service(Some(0.8), 1)], t(200)).len(), 1);
        assert!(r.pass(&l, &[service(None, 1)], t(201)).is_empty());
        assert_eq!(r.given(), 1);
        let fresh = Reclaim::new(policy()).pass(&l, &[service(None, 1)], t(201));
        assert!(fresh.is_empty(), "no reading, no notice");
    }

    #[test]
    fn a_notice_left_by_a_previous_leader_stands_or_is_withdrawn() {
        let at = t(150).to_string();
        let l = ledger(&[("r-big", at.as_str()), ("r-old", at.as_str())]);
        let mut r = Reclaim::new(policy());
        // r-big is still a victim: adopted silently; r-old is not: withdrawn.
        let changes = r.pass(&l, &[service(Some(0.8), 1)], t(200));
        assert_eq!(names(&changes), ["withdraw res/r-old"]);
        // Until the watch shows the annotation gone, it is not withdrawn again.
        let changes = r.pass(&l, &[service(Some(0.8), 1)], t(201));
        assert!(changes.is_empty(), "{changes:?}");
    }

    #[test]
    fn an_undelivered_notice_is_given_again() {
        let l = ledger(&[]);
        let mut r = Reclaim::new(policy());
        assert_eq!(r.pass(&l, &[service(Some(0.8), 1)], t(200)).len(), 1);
        r.undelivered(&l.pods().find(|p| p.name == "r-big").expect("pod").key);
        assert_eq!(
            names(&r.pass(&l, &[service(Some(0.8), 1)], t(201))),
            ["give res/r-big"]
        );
    }

    #[test]
    fn free_gpus_are_taken_before_anyone_is_warned_and_the_node_is_kept_from_lending() {
        let names_ = Vocabulary::default();
        let mut l = ledger(&[]);
        l.apply_node(crate::pool::accounting::node_facts(
            &node("n3", 4).build(),
            &names_,
        ));
        let mut r = Reclaim::new(policy());
        assert!(r.pass(&l, &[service(Some(0.8), 1)], t(200)).is_empty());
        assert_eq!(r.reclaiming().iter().collect::<Vec<_>>(), ["n3"]);
    }
}
