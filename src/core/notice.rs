//! Reclaim notice: the pure decisions behind warning research before inference takes its GPUs
//! back. It imports nothing of the crate; the simulator (and the live controller) build on it.
//!
//! Two questions, answered the way the rest of the system will act:
//! - **When** does a service need more replicas soon? [`NoticePolicy::update`] compares the
//!   scaler's demand (in replicas, as the HPA reads it) with the replicas the service has. Demand
//!   is bursty: the HPA scales on a burst, and a burst crossing the next replica rarely announces
//!   itself by the demand of the moment. What announces it is the recent peaks coming close, so
//!   the notice looks at the highest demand of the last `window_s`: once that comes within
//!   `margin` of the next replica, the notice covers that replica. It is withdrawn only when the
//!   peak falls `hysteresis` further back, so a queue that flaps around the threshold does not
//!   flap the notices.
//! - **Whom** will the scheduler preempt for those replicas? [`predict_victims`] follows
//!   kube-scheduler's default preemption: an inference pod goes where it fits without
//!   preemption; otherwise, on each node, every research pod is a potential victim and the most
//!   important ones (the higher PriorityClass, then the earliest started) are reprieved as long
//!   as the pod still fits; the node chosen is the one whose most important victim has the
//!   lowest priority, then the smallest sum of victim priorities, then the fewest victims, then
//!   the one whose most important victims started last. PodDisruptionBudgets, which the
//!   scheduler weighs first, are not read: a research pod under one may be warned in place of
//!   another. The simulator measures this prediction against a scheduler model of its own.
//! - **Lend more?** Not while a notice is out ([`may_lend`]).

/// How often the pool controller decides notices: the scaler's demand moves within seconds,
/// while KEDA polls every 30 s and the HPA syncs every 15 s by default, so a 5 s pass leaves the
/// notice well ahead of the scale-up it foretells at a small cost (one list, one read per
/// service).
pub const NOTICE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// When to give and withdraw notices. Margin and hysteresis in replicas of demand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NoticePolicy {
    /// Seconds of demand history whose peak is compared (0: the latest demand alone).
    pub window_s: f64,
    /// How close demand must come to the next replica for a notice (e.g. 0.3: a service at
    /// 3 replicas warns for its 4th once demand reaches 2.7).
    pub margin: f64,
    /// How much further demand must fall before a notice is withdrawn.
    pub hysteresis: f64,
}

impl Default for NoticePolicy {
    /// The settings the live controller and the simulator start from (tuned on the simulator's
    /// default scenario, see docs/simulator.md, "Reclaim notice"): a ten-minute window of demand
    /// peaks, a notice once the peak is 0.8 replica short of the next one (0.5 warned too late
    /// and a window of 20 minutes or a margin of 1 and more held back more lending than it
    /// saved), withdrawn a quarter replica further back.
    fn default() -> Self {
        Self {
            window_s: 600.0,
            margin: 0.8,
            hysteresis: 0.25,
        }
    }
}

/// A service's notice state: recent demand, and the replica count its notices cover (0: none
/// given yet).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Watch {
    /// (time, demand) within the window, oldest first; bounded by the window's length over the
    /// caller's update period.
    recent: std::collections::VecDeque<(f64, f64)>,
    covered: u32,
}

impl Watch {
    /// The replica count the notices cover (0: none given).
    pub fn covered(&self) -> u32 {
        self.covered
    }
}

impl NoticePolicy {
    /// Updates `watch` with the demand at `now` (seconds; replicas, fractional) and the replicas
    /// the service has, and returns how many replicas beyond those the notices cover now.
    /// Demand that is not a finite number ≥ 0 (a failed reading) is not recorded.
    pub fn update(&self, watch: &mut Watch, now: f64, demand: f64, replicas: u32) -> u32 {
        if demand.is_finite() && demand >= 0.0 {
            watch.recent.push_back((now, demand));
        }
        // Readings older than the window leave; with no window only the latest stays.
        while watch.recent.len() > 1
            && watch
                .recent
                .front()
                .is_some_and(|&(t, _)| t < now - self.window_s || self.window_s <= 0.0)
        {
            watch.recent.pop_front();
        }
        if watch.recent.is_empty() {
            // No reading yet: nothing to warn about (a service at zero replicas and no demand
            // is not about to need its first).
            watch.covered = 0;
            return 0;
        }
        let peak = watch.recent.iter().map(|&(_, d)| d).fold(0.0, f64::max);
        // Raised once the peak is within `margin` of the next replica; kept while it stays
        // within `margin + hysteresis`.
        let raise = next_replicas(peak + self.margin);
        let keep = next_replicas(peak + self.margin + self.hysteresis);
        if raise > watch.covered {
            watch.covered = raise;
        } else if keep < watch.covered {
            watch.covered = keep;
        }
        watch.covered.saturating_sub(replicas)
    }
}

/// Replicas a service needs once its demand passes `level`: the smallest whole number above it
/// (demand of exactly 3.0 is already served by 3 replicas only up to the HPA's rounding; the
/// notice errs on the side of warning).
fn next_replicas(level: f64) -> u32 {
    if !level.is_finite() || level < 0.0 {
        return 0;
    }
    // Saturates for absurd demand; a pool has far fewer replicas than u32::MAX.
    (level.floor() + 1.0).min(f64::from(u32::MAX)) as u32
}

/// Whether the controller may lend more GPUs to research while `warned` research pods hold a
/// notice: only when none does. A pod started now would be the newest, hence the scheduler's
/// first victim in place of a warned one, and it would lose its work without notice.
pub fn may_lend(warned: usize) -> bool {
    warned == 0
}

/// A research pod as the scheduler weighs it when choosing victims.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate<Id> {
    pub id: Id,
    pub gpus: u32,
    /// `spec.priority`: the lowest go first.
    pub priority: i32,
    /// Start time (any clock, larger = later): within a priority, the most recently started go
    /// first.
    pub started: f64,
}

/// One node: GPUs an inference pod could take without preemption, and its research pods.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeRoom<Id> {
    pub free: u32,
    pub research: Vec<Candidate<Id>>,
}

/// Where the scheduler puts one inference pod, and whom it preempts for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Placed<Id> {
    pub node: usize,
    /// Empty when the pod fits without preemption.
    pub victims: Vec<Id>,
}

/// Places one inference pod of `gpus` GPUs on `nodes` as the scheduler would, updating `nodes`
/// (GPUs taken, victims gone); `None` when it fits nowhere, even with every research pod gone.
/// Without preemption it takes the first node with room (the scheduler's scoring of extended
/// resources does not prefer one).
pub fn place<Id>(nodes: &mut [NodeRoom<Id>], gpus: u32) -> Option<Placed<Id>> {
    if let Some(n) = nodes.iter().position(|n| n.free >= gpus) {
        nodes[n].free -= gpus;
        return Some(Placed {
            node: n,
            victims: Vec::new(),
        });
    }
    let (n, mut chosen) = pick_node(nodes, gpus)?;
    let node = &mut nodes[n];
    // Removed in descending index order, so that earlier removals do not shift later ones.
    chosen.sort_unstable_by(|a, b| b.cmp(a));
    let mut freed = 0;
    let mut victims = Vec::with_capacity(chosen.len());
    for i in chosen {
        let c = node.research.remove(i);
        freed += c.gpus;
        victims.push(c.id);
    }
    node.free = node.free + freed - gpus;
    Some(Placed { node: n, victims })
}

/// The research pods the scheduler will preempt to place `pods` inference pods of `gpus` GPUs
/// each on `nodes` ([`place`] one after the other). Pods that fit nowhere are left out (they
/// stay pending; no victims).
pub fn predict_victims<Id>(nodes: &mut [NodeRoom<Id>], pods: u32, gpus: u32) -> Vec<Id> {
    let mut victims = Vec::new();
    for _ in 0..pods {
        if let Some(placed) = place(nodes, gpus) {
            victims.extend(placed.victims);
        }
    }
    victims
}

/// The node the scheduler preempts on, with the indices of its victims; `None` when no node can
/// make room.
fn pick_node<Id>(nodes: &[NodeRoom<Id>], gpus: u32) -> Option<(usize, Vec<usize>)> {
    let mut best: Option<(usize, Vec<usize>, Rank)> = None;
    for (n, node) in nodes.iter().enumerate() {
        let Some(victims) = victims_on_node(node, gpus) else {
            continue;
        };
        let rank = Rank::of(node, &victims);
        if best.as_ref().is_none_or(|(_, _, r)| rank.better_than(r)) {
            best = Some((n, victims, rank));
        }
    }
    best.map(|(n, v, _)| (n, v))
}

/// How the scheduler ranks a node's victims: the lower the better, field by field.
#[derive(Clone, Copy, Debug)]
struct Rank {
    /// Priority of the most important victim.
    highest: i32,
    /// Sum of the victims' priorities, each shifted by 2³¹ so that every term is positive.
    sum: i64,
    victims: usize,
    /// The earliest start among the victims of the highest priority (later is better).
    earliest: f64,
}

impl Rank {
    fn of<Id>(node: &NodeRoom<Id>, victims: &[usize]) -> Rank {
        let pods = victims.iter().map(|&i| &node.research[i]);
        let highest = pods.clone().map(|c| c.priority).max().unwrap_or(i32::MIN);
        Rank {
            highest,
            sum: pods
                .clone()
                .map(|c| i64::from(c.priority) + (1 << 31))
                .sum(),
            victims: victims.len(),
            earliest: pods
                .filter(|c| c.priority == highest)
                .map(|c| c.started)
                .fold(f64::INFINITY, f64::min),
        }
    }

    fn better_than(&self, other: &Rank) -> bool {
        (self.highest, self.sum, self.victims) < (other.highest, other.sum, other.victims)
            || ((self.highest, self.sum, self.victims) == (other.highest, other.sum, other.victims)
                && self.earliest > other.earliest)
    }
}

/// The scheduler's victims on one node: all research pods are candidates; the most important
/// (highest priority, then earliest started) are reprieved first, as long as the pod still fits.
fn victims_on_node<Id>(node: &NodeRoom<Id>, gpus: u32) -> Option<Vec<usize>> {
    let all: u32 = node.research.iter().map(|c| c.gpus).sum();
    let mut room = node.free + all;
    if room < gpus {
        return None;
    }
    let mut by_importance: Vec<usize> = (0..node.research.len()).collect();
    by_importance.sort_by(|&a, &b| {
        let (a, b) = (&node.research[a], &node.research[b]);
        b.priority
            .cmp(&a.priority)
            .then(a.started.total_cmp(&b.started))
    });
    let mut victims = Vec::new();
    for i in by_importance {
        let g = node.research[i].gpus;
        if room - g >= gpus {
            room -= g; // reprieved: it stays
        } else {
            victims.push(i);
        }
    }
    Some(victims)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> NoticePolicy {
        NoticePolicy {
            window_s: 0.0,
            margin: 0.3,
            hysteresis: 0.2,
        }
    }

    #[test]
    fn notice_once_demand_nears_the_next_replica() {
        let p = policy();
        let mut w = Watch::default();
        assert_eq!(p.update(&mut w, 0.0, 2.5, 3), 0);
        assert_eq!(p.update(&mut w, 0.0, 2.7, 3), 1);
        assert_eq!(p.update(&mut w, 0.0, 3.8, 3), 2);
    }

    #[test]
    fn hysteresis_keeps_a_notice_until_demand_falls_further() {
        let p = policy();
        let mut w = Watch::default();
        assert_eq!(p.update(&mut w, 0.0, 2.75, 3), 1);
        // Back under the margin, not under margin + hysteresis: kept.
        assert_eq!(p.update(&mut w, 0.0, 2.6, 3), 1);
        assert_eq!(p.update(&mut w, 0.0, 2.55, 3), 1);
        // Further back: withdrawn.
        assert_eq!(p.update(&mut w, 0.0, 2.45, 3), 0);
        // And raised again only at the margin.
        assert_eq!(p.update(&mut w, 0.0, 2.65, 3), 0);
        assert_eq!(p.update(&mut w, 0.0, 2.7, 3), 1);
    }

    #[test]
    fn a_notice_comes_true_when_the_replica_arrives() {
        let p = policy();
        let mut w = Watch::default();
        assert_eq!(p.update(&mut w, 0.0, 2.8, 3), 1);
        assert_eq!(p.update(&mut w, 0.0, 3.1, 4), 0);
    }

    #[test]
    fn the_window_remembers_recent_peaks() {
        let p = NoticePolicy {
            window_s: 600.0,
            ..policy()
        };
        let mut w = Watch::default();
        assert_eq!(
            p.update(&mut w, 0.0, 2.8, 3),
            1,
            "a burst near the next replica"
        );
        assert_eq!(
            p.update(&mut w, 300.0, 1.5, 3),
            1,
            "still within the window"
        );
        assert_eq!(
            p.update(&mut w, 700.0, 1.5, 3),
            0,
            "the burst left the window"
        );
    }

    #[test]
    fn bad_demand_covers_nothing() {
        let p = policy();
        let mut w = Watch::default();
        assert_eq!(p.update(&mut w, 0.0, f64::NAN, 3), 0);
        assert_eq!(p.update(&mut w, 0.0, -5.0, 0), 0);
    }

    #[test]
    fn nothing_more_is_lent_while_a_notice_is_out() {
        assert!(may_lend(0));
        assert!(!may_lend(1));
    }

    fn pod(id: u32, gpus: u32, started: f64) -> Candidate<u32> {
        Candidate {
            id,
            gpus,
            priority: -1000,
            started,
        }
    }

    #[test]
    fn free_gpus_are_taken_before_anyone_is_preempted() {
        let mut nodes = vec![
            NodeRoom {
                free: 0,
                research: vec![pod(1, 4, 0.0)],
            },
            NodeRoom {
                free: 4,
                research: vec![],
            },
        ];
        assert!(predict_victims(&mut nodes, 1, 4).is_empty());
        assert_eq!(nodes[1].free, 0);
        assert_eq!(predict_victims(&mut nodes, 1, 4), vec![1]);
    }

    #[test]
    fn the_node_with_fewest_victims_then_the_latest_started() {
        let mut nodes = vec![
            // Two victims needed.
            NodeRoom {
                free: 0,
                research: vec![pod(1, 2, 10.0), pod(2, 2, 20.0)],
            },
            // One victim, started at 5.
            NodeRoom {
                free: 0,
                research: vec![pod(3, 4, 5.0)],
            },
            // One victim, started at 30: preferred.
            NodeRoom {
                free: 0,
                research: vec![pod(4, 4, 30.0)],
            },
        ];
        assert_eq!(predict_victims(&mut nodes, 1, 4), vec![4]);
        assert_eq!(predict_victims(&mut nodes, 1, 4), vec![3]);
        let mut two = predict_victims(&mut nodes, 1, 4);
        two.sort_unstable();
        assert_eq!(two, vec![1, 2]);
        assert!(predict_victims(&mut nodes, 1, 4).is_empty(), "nothing left");
    }

    #[test]
    fn a_lower_class_goes_before_a_later_start() {
        let low = |id, started| Candidate {
            priority: -2000,
            ..pod(id, 4, started)
        };
        let mut nodes = vec![
            NodeRoom {
                free: 0,
                research: vec![pod(1, 4, 900.0)],
            },
            NodeRoom {
                free: 0,
                research: vec![pod(2, 4, 500.0), low(3, 10.0)],
            },
        ];
        // Node 1's lower-class pod, although node 0's started last.
        assert_eq!(predict_victims(&mut nodes, 1, 4), vec![3]);
        // Then, one class left: the latest started.
        assert_eq!(predict_victims(&mut nodes, 1, 4), vec![1]);
    }

    #[test]
    fn the_most_recently_started_leave_and_the_earliest_are_reprieved() {
        let mut nodes = vec![NodeRoom {
            free: 1,
            research: vec![
                pod(1, 1, 100.0),
                pod(2, 1, 50.0),
                pod(3, 1, 200.0),
                pod(4, 1, 10.0),
            ],
        }];
        // Needs 3: 1 free + two victims, the two latest started (3 at 200, 1 at 100).
        let mut v = predict_victims(&mut nodes, 1, 3);
        v.sort_unstable();
        assert_eq!(v, vec![1, 3]);
        assert_eq!(nodes[0].free, 0);
        assert_eq!(nodes[0].research.len(), 2);
    }

    proptest::proptest! {
        #[test]
        fn victims_free_exactly_what_is_needed_and_never_more_than_exist(
            free in proptest::collection::vec(0u32..8, 1..6),
            jobs in proptest::collection::vec((0usize..6, 1u32..5, 0.0f64..1e4), 0..30),
            pods in 0u32..6,
            gpus in 1u32..9,
        ) {
            let mut nodes: Vec<NodeRoom<usize>> = free
                .iter()
                .map(|&f| NodeRoom { free: f, research: Vec::new() })
                .collect();
            let n = nodes.len();
            for (i, (node, g, started)) in jobs.iter().enumerate() {
                nodes[node % n].research.push(pod_usize(i, *g, *started));
            }
            let before: u32 = nodes.iter().map(|n| n.free + n.research.iter().map(|c| c.gpus).sum::<u32>()).sum();
            let victims = predict_victims(&mut nodes, pods, gpus);
            let after: u32 = nodes.iter().map(|n| n.free + n.research.iter().map(|c| c.gpus).sum::<u32>()).sum();
            let mut unique = victims.clone();
            unique.sort_unstable();
            unique.dedup();
            proptest::prop_assert_eq!(unique.len(), victims.len(), "a pod preempted twice");
            // What was placed took exactly `gpus` each out of the pool.
            proptest::prop_assert_eq!((before - after) % gpus, 0);
            proptest::prop_assert!((before - after) / gpus <= pods);
        }
    }

    fn pod_usize(id: usize, gpus: u32, started: f64) -> Candidate<usize> {
        Candidate {
            id,
            gpus,
            priority: -1000,
            started,
        }
    }
}
