//! Why a research pod waits: the words of the `Pending` Events on research pods that no spare
//! GPU can take, from the pool controller's own decision (its [`Plan`] and the lending windows).
//!
//! Pure: [`Snapshot::of`] condenses a plan once per pass, [`reason`] answers for one pod in
//! constant time, and [`Repeats`] decides when an answer becomes an Event (on a change, and again
//! now and then while it holds, so that the Event stays one series that stays fresh). The
//! controller owns the state; [`super::run`] publishes.

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::{
    accounting::PodFacts,
    marks::{Plan, Verdict},
    windows::Windows,
};

/// Why a research pod gets no spare GPU now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Outside every lending window; `opens` is the next opening, as `HH:MM` in the window's
    /// zone and that zone's name.
    WindowClosed { opens: Option<(String, String)> },
    /// No healthy pool node has as many GPUs as the pod asks for (or the pool has no healthy
    /// node at all: `largest` is 0).
    NoNodeFits { wanted: u64, largest: u64 },
    /// GPUs that could hold the pod are free, but held back for inference bursts.
    HeadroomKept { wanted: u64, target: u64 },
    /// Every lendable GPU is in use (`most_free` 0), or no spare node has enough free at once.
    NoSpareGpus {
        wanted: u64,
        most_free: u64,
        inference: u64,
        research: u64,
    },
}

impl Reason {
    /// The Event's reason (`kubectl get events --field-selector reason=...`). A different
    /// reason starts a different Event.
    pub fn event_reason(&self) -> &'static str {
        match self {
            Reason::WindowClosed { .. } => "LendingClosed",
            Reason::NoNodeFits { .. } => "NoPoolNodeFits",
            Reason::HeadroomKept { .. } => "HeadroomKept",
            Reason::NoSpareGpus { .. } => "NoSpareGPUs",
        }
    }

    /// A warning when waiting cannot end by itself (the pod asks for more than any node has);
    /// a normal event otherwise (waiting is how lending works).
    pub fn warning(&self) -> bool {
        matches!(self, Reason::NoNodeFits { .. })
    }

    /// The sentence a researcher reads in `kubectl describe pod`.
    pub fn note(&self) -> String {
        match self {
            Reason::WindowClosed {
                opens: Some((at, zone)),
            } => format!(
                "Waiting for spare GPUs: lending is closed until {at} ({zone}), when the next \
                 lending window opens"
            ),
            Reason::WindowClosed { opens: None } => {
                "Waiting for spare GPUs: lending is closed (outside every lending window)".into()
            }
            Reason::NoNodeFits { wanted, largest: 0 } => format!(
                "Cannot be lent GPUs: no node of the GPU pool is ready to take research ({} \
                 asked)",
                gpus(*wanted)
            ),
            Reason::NoNodeFits { wanted, largest } => format!(
                "Cannot be lent GPUs: the pod asks for {} but the largest node of the GPU pool \
                 has {}; ask for at most {largest} per pod",
                gpus(*wanted),
                gpus(*largest)
            ),
            Reason::HeadroomKept { wanted, target } => format!(
                "Waiting for spare GPUs: the free GPUs that could take {} are kept as headroom \
                 for inference bursts ({} kept free); the pod starts when more become free",
                gpus(*wanted),
                gpus(*target)
            ),
            Reason::NoSpareGpus {
                wanted: _,
                most_free: 0,
                inference,
                research,
            } => format!(
                "Waiting for spare GPUs: every lendable GPU is in use ({inference} by \
                 inference, {research} by research); the pod starts when inference scales down \
                 or research pods finish"
            ),
            Reason::NoSpareGpus {
                wanted,
                most_free,
                inference,
                research,
            } => format!(
                "Waiting for spare GPUs: no spare node has {} free at once (at most {most_free} \
                 on one node; {inference} in use by inference, {research} by research)",
                gpus(*wanted)
            ),
        }
    }
}

fn gpus(n: u64) -> String {
    format!("{n} GPU{}", if n == 1 { "" } else { "s" })
}

/// What [`reason`] needs from one pass of the controller: the pool condensed so that each
/// waiting pod is answered without walking the nodes again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Inside a lending window (or no window configured).
    pub lending_open: bool,
    /// The next window start, formatted (`HH:MM`, zone), when lending is closed.
    pub opens: Option<(String, String)>,
    /// Most allocatable GPUs on one healthy node (ready, schedulable, readable).
    pub largest_node: u64,
    /// Most spare GPUs on one node marked spare.
    pub most_spare: u64,
    /// Most free GPUs on one headroom node.
    pub most_headroom: u64,
    /// GPUs the pool keeps free for inference.
    pub headroom_target: u64,
    pub inference: u64,
    pub research: u64,
}

impl Snapshot {
    /// Condenses the controller's `plan` at `now`.
    pub fn of(
        plan: &Plan,
        lending_open: bool,
        windows: &Windows,
        headroom: u64,
        now: Timestamp,
    ) -> Self {
        let opens = if lending_open {
            None
        } else {
            windows.next_opening(now).map(|(at, w)| {
                let local = at.to_zoned(w.zone().clone());
                let zone = w.zone().iana_name().unwrap_or("UTC").to_string();
                (local.strftime("%H:%M").to_string(), zone)
            })
        };
        let mut s = Snapshot {
            lending_open,
            opens,
            headroom_target: headroom,
            ..Snapshot::default()
        };
        for n in &plan.nodes {
            s.inference += n.gpus.protected;
            s.research += n.gpus.lent;
            let healthy = !matches!(
                n.verdict,
                Verdict::Cordoned | Verdict::NotReady | Verdict::Untrusted
            );
            if !healthy {
                continue;
            }
            s.largest_node = s.largest_node.max(n.gpus.allocatable);
            match n.verdict {
                Verdict::Headroom => s.most_headroom = s.most_headroom.max(n.gpus.free),
                Verdict::Spare => s.most_spare = s.most_spare.max(n.spare_gpus.unwrap_or(0)),
                _ => {}
            }
        }
        s
    }
}

/// Why `pod` waits for spare GPUs, or `None` when it does not: not a research pod waiting for
/// a node (bound, finished, no GPU asked, a quantity unreadable), or a spare node can take it
/// now (the scheduler is about to place it).
///
/// In order: a closed window explains everything; then a pod no node can ever hold; then a
/// spare node with room (no reason); then headroom that could hold it; then no spare GPUs.
pub fn reason(snapshot: &Snapshot, pod: &PodFacts) -> Option<Reason> {
    if !pod.research || pod.terminal || pod.node.is_some() || pod.phase != "Pending" {
        return None;
    }
    let wanted = pod.gpus.filter(|g| *g > 0)?;
    if !snapshot.lending_open {
        return Some(Reason::WindowClosed {
            opens: snapshot.opens.clone(),
        });
    }
    if snapshot.largest_node < wanted {
        return Some(Reason::NoNodeFits {
            wanted,
            largest: snapshot.largest_node,
        });
    }
    if snapshot.most_spare >= wanted {
        return None;
    }
    if snapshot.most_headroom >= wanted {
        return Some(Reason::HeadroomKept {
            wanted,
            target: snapshot.headroom_target,
        });
    }
    Some(Reason::NoSpareGpus {
        wanted,
        most_free: snapshot.most_spare,
        inference: snapshot.inference,
        research: snapshot.research,
    })
}

/// How often an unchanged reason is told again: under the 6 minutes during which kube's event
/// recorder keeps adding repeats to the same series, so a pod waiting for hours shows one Event
/// with a growing count and a recent "last seen", not a new Event every pass.
pub const REPEAT_AFTER: i64 = 5 * 60;
/// Least time between two Events of different reasons on one pod: free GPUs that come and go
/// within a pass or two must not make a pod's Events flicker between reasons.
pub const CHANGE_AFTER: i64 = 30;

/// The last reason told per waiting pod (by pod key), and when.
#[derive(Clone, Debug, Default)]
pub struct Repeats {
    told: BTreeMap<String, (&'static str, i64)>,
}

impl Repeats {
    /// Whether to tell `reason` about pod `key` at `now` (Unix seconds): the first reason at
    /// once, a different one after [`CHANGE_AFTER`], the same one again after [`REPEAT_AFTER`].
    /// Records it when yes.
    pub fn tell(&mut self, key: &str, reason: &Reason, now: i64) -> bool {
        let event_reason = reason.event_reason();
        let due = match self.told.get(key) {
            None => true,
            Some((last, at)) if *last == event_reason => now - at >= REPEAT_AFTER,
            Some((_, at)) => now - at >= CHANGE_AFTER,
        };
        if due {
            self.told.insert(key.to_string(), (event_reason, now));
        }
        due
    }

    /// Forgets pods that no longer wait (bound, gone, or waiting for no reason of ours), so that
    /// memory follows the pods waiting now and a pod that waits again is told at once.
    pub fn retain(&mut self, mut waiting: impl FnMut(&str) -> bool) {
        self.told.retain(|k, _| waiting(k));
    }

    pub fn len(&self) -> usize {
        self.told.len()
    }

    pub fn is_empty(&self) -> bool {
        self.told.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::vocabulary::Vocabulary;
    use crate::pool::{
        accounting::{Ledger, node_facts, pod_facts},
        marks,
    };
    use crate::test_support::fixtures::{NodeBuilder, PodBuilder, node, pod};
    use proptest::prelude::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    /// The snapshot the controller would take of these nodes and pods.
    fn snapshot(
        nodes: Vec<NodeBuilder>,
        pods: Vec<PodBuilder>,
        headroom: u64,
        windows: &str,
        now: Timestamp,
    ) -> Snapshot {
        let names = Vocabulary::default();
        let mut l = Ledger::new();
        l.replace_nodes(nodes.into_iter().map(|n| node_facts(&n.build(), &names)));
        l.replace_pods(pods.into_iter().map(|p| pod_facts(&p.build(), &names)));
        let windows: Windows = windows.parse().expect("windows");
        let open = windows.open(now);
        let plan = marks::plan(&l, headroom, open);
        Snapshot::of(&plan, open, &windows, headroom, now)
    }

    fn waiting(gpus: u64) -> PodFacts {
        let p = pod("team-a", "sft-0")
            .research()
            .unbound()
            .phase("Pending")
            .gpus(gpus)
            .build();
        pod_facts(&p, &Vocabulary::default())
    }

    fn noon() -> Timestamp {
        at("2026-03-02T12:00:00Z")
    }

    #[test]
    fn a_pod_that_fits_a_spare_node_has_no_reason_to_wait() {
        let s = snapshot(vec![node("gpu-a", 8)], vec![], 0, "", noon());
        assert_eq!(reason(&s, &waiting(8)), None);
    }

    #[test]
    fn every_lendable_gpu_in_use_says_who_holds_them() {
        let s = snapshot(
            vec![node("gpu-a", 8), node("gpu-b", 8)],
            vec![
                pod("inf", "llama").on("gpu-a").gpus(8),
                pod("team-b", "eval").research().on("gpu-b").gpus(8),
            ],
            0,
            "",
            noon(),
        );
        let r = reason(&s, &waiting(1)).expect("waits");
        assert_eq!(r.event_reason(), "NoSpareGPUs");
        assert_eq!(
            r.note(),
            "Waiting for spare GPUs: every lendable GPU is in use (8 by inference, 8 by \
             research); the pod starts when inference scales down or research pods finish"
        );
        assert!(!r.warning());
    }

    #[test]
    fn scattered_free_gpus_are_not_enough_for_a_larger_pod() {
        let s = snapshot(
            vec![node("gpu-a", 8), node("gpu-b", 8)],
            vec![
                pod("inf", "a").on("gpu-a").gpus(6),
                pod("inf", "b").on("gpu-b").gpus(5),
            ],
            0,
            "",
            noon(),
        );
        let r = reason(&s, &waiting(4)).expect("waits");
        assert!(
            matches!(r, Reason::NoSpareGpus { most_free: 3, .. }),
            "{r:?}"
        );
        assert!(
            r.note()
                .contains("no spare node has 4 GPUs free at once (at most 3")
        );
        assert_eq!(reason(&s, &waiting(3)), None, "3 fit on gpu-b");
    }

    #[test]
    fn free_gpus_held_as_headroom_are_named_as_such() {
        let s = snapshot(
            vec![node("gpu-a", 8), node("gpu-b", 8)],
            vec![pod("inf", "a").on("gpu-b").gpus(7)],
            4,
            "",
            noon(),
        );
        // gpu-a (8 free) is held back; gpu-b has 1 spare.
        let r = reason(&s, &waiting(2)).expect("waits");
        assert_eq!(r.event_reason(), "HeadroomKept");
        assert!(
            r.note()
                .contains("kept as headroom for inference bursts (4 GPUs kept free)")
        );
        assert_eq!(reason(&s, &waiting(1)), None);
    }

    #[test]
    fn a_closed_window_says_when_it_opens_in_the_windows_zone() {
        // 12:00 UTC is 21:00 in Seoul: outside 01:00-07:00 KST, which opens at 01:00 KST.
        let s = snapshot(
            vec![node("gpu-a", 8)],
            vec![],
            0,
            "01:00-07:00@Asia/Seoul",
            noon(),
        );
        let r = reason(&s, &waiting(1)).expect("waits");
        assert_eq!(r.event_reason(), "LendingClosed");
        assert_eq!(
            r.note(),
            "Waiting for spare GPUs: lending is closed until 01:00 (Asia/Seoul), when the next \
             lending window opens"
        );
    }

    #[test]
    fn a_pod_larger_than_every_node_is_a_warning_with_the_largest_size() {
        let s = snapshot(
            vec![node("gpu-a", 4), node("gpu-b", 8).cordoned()],
            vec![],
            0,
            "",
            noon(),
        );
        let r = reason(&s, &waiting(8)).expect("waits");
        assert_eq!(
            r,
            Reason::NoNodeFits {
                wanted: 8,
                largest: 4
            }
        );
        assert!(r.warning());
        assert!(
            r.note().contains("ask for at most 4 per pod"),
            "{}",
            r.note()
        );
        let empty = snapshot(vec![], vec![], 0, "", noon());
        let r = reason(&empty, &waiting(1)).expect("waits");
        assert!(
            r.note().contains("no node of the GPU pool is ready"),
            "{}",
            r.note()
        );
    }

    #[test]
    fn only_research_pods_waiting_for_a_node_with_gpus_get_a_reason() {
        let s = snapshot(vec![], vec![], 0, "", noon());
        let names = Vocabulary::default();
        let facts = |p: PodBuilder| pod_facts(&p.build(), &names);
        let not_research = facts(pod("inf", "x").unbound().phase("Pending").gpus(1));
        let bound = facts(
            pod("t", "x")
                .research()
                .on("gpu-a")
                .phase("Pending")
                .gpus(1),
        );
        let no_gpu = facts(pod("t", "x").research().unbound().phase("Pending"));
        let failed = facts(pod("t", "x").research().unbound().phase("Failed").gpus(1));
        let unreadable = facts(
            pod("t", "x")
                .research()
                .unbound()
                .phase("Pending")
                .gpu_quantity("half"),
        );
        for p in [not_research, bound, no_gpu, failed, unreadable] {
            assert_eq!(reason(&s, &p), None, "{p:?}");
        }
        assert!(reason(&s, &waiting(1)).is_some());
    }

    #[test]
    fn a_reason_is_told_once_then_repeated_slowly_and_changed_after_a_pause() {
        let mut r = Repeats::default();
        let full = Reason::NoSpareGpus {
            wanted: 1,
            most_free: 0,
            inference: 8,
            research: 0,
        };
        let head = Reason::HeadroomKept {
            wanted: 1,
            target: 8,
        };
        assert!(r.tell("p", &full, 0));
        assert!(!r.tell("p", &full, 1), "not every pass");
        assert!(!r.tell("p", &head, CHANGE_AFTER - 1), "no flicker");
        assert!(
            r.tell("p", &head, CHANGE_AFTER),
            "a changed reason is a new event"
        );
        assert!(!r.tell("p", &head, CHANGE_AFTER + REPEAT_AFTER - 1));
        assert!(
            r.tell("p", &head, CHANGE_AFTER + REPEAT_AFTER),
            "kept fresh"
        );
        assert!(r.tell("q", &full, 1), "per pod");
        r.retain(|k| k == "q");
        assert_eq!(r.len(), 1);
        assert!(
            r.tell("p", &head, CHANGE_AFTER + REPEAT_AFTER + 1),
            "waits again"
        );
    }

    fn any_snapshot() -> impl Strategy<Value = Snapshot> {
        (
            any::<bool>(),
            0u64..16,
            0u64..16,
            0u64..16,
            0u64..16,
            0u64..64,
        )
            .prop_map(|(open, largest, spare, headroom, target, used)| Snapshot {
                lending_open: open,
                opens: (!open).then(|| ("20:00".to_string(), "UTC".to_string())),
                largest_node: largest,
                most_spare: spare.min(largest),
                most_headroom: headroom.min(largest),
                headroom_target: target,
                inference: used,
                research: used / 2,
            })
    }

    proptest! {
        /// The reason agrees with the snapshot it comes from: no reason exactly when lending is
        /// open and a spare node has room; a closed window always explains itself; "no node
        /// fits" only when none is large enough; headroom only when it could hold the pod.
        #[test]
        fn reasons_follow_the_snapshot(s in any_snapshot(), wanted in 1u64..20) {
            let r = reason(&s, &waiting(wanted));
            let fits_now = s.lending_open && s.largest_node >= wanted && s.most_spare >= wanted;
            prop_assert_eq!(r.is_none(), fits_now);
            match r {
                None => {}
                Some(Reason::WindowClosed { .. }) => prop_assert!(!s.lending_open),
                Some(Reason::NoNodeFits { largest, .. }) => {
                    prop_assert!(s.lending_open && largest < wanted);
                }
                Some(Reason::HeadroomKept { .. }) => {
                    prop_assert!(s.most_spare < wanted && s.most_headroom >= wanted);
                }
                Some(Reason::NoSpareGpus { most_free, .. }) => {
                    prop_assert!(most_free < wanted && s.most_headroom < wanted);
                }
            }
        }

        /// However often a pass runs, a pod gets at most one Event per reason change (after
        /// the pause) and one repeat per period.
        #[test]
        fn events_are_rate_limited(passes in proptest::collection::vec((0i64..3, any::<bool>()), 1..200)) {
            let mut r = Repeats::default();
            let a = Reason::WindowClosed { opens: None };
            let b = Reason::HeadroomKept { wanted: 1, target: 1 };
            let mut now = 0;
            let mut told: Vec<i64> = Vec::new();
            for (step, which) in passes {
                now += step;
                if r.tell("p", if which { &a } else { &b }, now) {
                    told.push(now);
                }
            }
            for pair in told.windows(2) {
                prop_assert!(pair[1] - pair[0] >= CHANGE_AFTER, "{:?}", told);
            }
        }
    }
}
