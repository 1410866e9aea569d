//! The simulated kube-scheduler: where a pod that needs GPUs goes, and whom it preempts.
//!
//! Written from the scheduler's documented behaviour (the `DefaultPreemption` plugin,
//! "Pod Priority and Preemption" in the Kubernetes documentation), independently of the reclaim
//! notice's predictor ([`crate::core::notice`]): the simulator places and preempts with this
//! module and *measures* the predictor against it, so a wrong prediction shows as a preemption
//! without notice instead of coming true by construction. The end-to-end suite checks this
//! model against the real kube-scheduler (`tests/e2e/scenarios/preemption.rs`).
//!
//! The rules, for a pod that fits on no node as things stand:
//! 1. On each node, every pod of lower priority than the incoming one is removed; a node where
//!    the pod still does not fit is no candidate.
//! 2. The removed pods are put back one by one, most important first (higher priority, then
//!    the earlier start), those whose PodDisruptionBudget would be violated first; a pod that
//!    can be put back with the incoming pod still fitting is reprieved, the others are victims.
//! 3. Among the candidate nodes: fewest PodDisruptionBudget violations; then the lowest
//!    priority of the most important victim; then the smallest sum of victim priorities; then
//!    the fewest victims; then the node whose highest-priority victims started latest (their
//!    earliest start); then the first node.
//!
//! Pods already terminating still hold their GPUs and count as pods of the node (the scheduler
//! sees them until they are gone); choosing one as a victim again preempts nothing new.
//! Owns the placement decision only: the pool keeps the GPUs and the jobs.

/// A pod bound to a node, as preemption weighs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Bound<Id> {
    pub id: Id,
    pub gpus: u32,
    /// `spec.priority`, from the pod's PriorityClass.
    pub priority: i32,
    /// `status.startTime` (any clock; larger = later).
    pub started: f64,
    /// Evicting it would violate a PodDisruptionBudget.
    pub guarded: bool,
}

/// A node: GPUs no pod (bound, or nominated to it with at least the incoming pod's priority)
/// holds, and its bound pods.
#[derive(Clone, Debug, PartialEq)]
pub struct Node<Id> {
    /// Allocatable GPUs less those of its bound pods and of the pods nominated to it: negative
    /// while nominated pods wait for GPUs bound pods still hold.
    pub free: i64,
    pub pods: Vec<Bound<Id>>,
}

/// The pod being scheduled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Incoming {
    pub gpus: u32,
    pub priority: i32,
}

/// The scheduler's decision for one pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision<Id> {
    /// Binds to the node: it fits as things stand.
    Bind(usize),
    /// Nominated to the node once its victims are deleted.
    Preempt { node: usize, victims: Vec<Id> },
    /// Fits nowhere, even with every lower-priority pod gone.
    Unschedulable,
}

/// Decides where `pod` goes on `nodes`. When several nodes fit without preemption the first is
/// taken (the scheduler's scores for CPU and memory do not separate GPU nodes in this model).
pub fn schedule<Id: Clone>(nodes: &[Node<Id>], pod: Incoming) -> Decision<Id> {
    let need = i64::from(pod.gpus);
    if let Some(n) = nodes.iter().position(|node| node.free >= need) {
        return Decision::Bind(n);
    }
    let best = nodes
        .iter()
        .enumerate()
        .filter_map(|(n, node)| victims_on(node, pod).map(|v| (n, v)))
        .min_by(|(na, a), (nb, b)| better(a, b).then(na.cmp(nb)));
    match best {
        Some((node, chosen)) => Decision::Preempt {
            node,
            victims: chosen.pods.into_iter().map(|p| p.id).collect(),
        },
        None => Decision::Unschedulable,
    }
}

/// The victims on one node, most important first, with their PDB violations.
#[derive(Clone, Debug)]
struct Victims<Id> {
    pods: Vec<Bound<Id>>,
    violations: usize,
}

/// Rules 1 and 2 on one node; `None` when the pod does not fit even with every lower-priority
/// pod removed.
fn victims_on<Id: Clone>(node: &Node<Id>, pod: Incoming) -> Option<Victims<Id>> {
    let mut lower: Vec<&Bound<Id>> = node
        .pods
        .iter()
        .filter(|p| p.priority < pod.priority)
        .collect();
    let need = i64::from(pod.gpus);
    let mut room = node.free + lower.iter().map(|p| i64::from(p.gpus)).sum::<i64>();
    if room < need {
        return None;
    }
    lower.sort_by(|a, b| more_important(a, b));
    // PDB-guarded pods are offered back first, so that they are the last to be evicted.
    let (guarded, unguarded): (Vec<_>, Vec<_>) = lower.into_iter().partition(|p| p.guarded);
    let mut victims = Victims {
        pods: Vec::new(),
        violations: 0,
    };
    for p in guarded.into_iter().chain(unguarded) {
        if room - i64::from(p.gpus) >= need {
            room -= i64::from(p.gpus);
        } else {
            victims.violations += usize::from(p.guarded);
            victims.pods.push(p.clone());
        }
    }
    victims.pods.sort_by(|a, b| more_important(a, b));
    Some(victims)
}

/// Orders the more important pod first: the higher priority, then the earlier start.
fn more_important<Id>(a: &Bound<Id>, b: &Bound<Id>) -> std::cmp::Ordering {
    b.priority
        .cmp(&a.priority)
        .then(a.started.total_cmp(&b.started))
}

/// Rule 3: `Less` when the node with victims `a` is preferred over the one with `b`.
fn better<Id>(a: &Victims<Id>, b: &Victims<Id>) -> std::cmp::Ordering {
    let highest = |v: &Victims<Id>| v.pods.first().map_or(i32::MIN, |p| p.priority);
    // Priorities shifted to be non-negative before summing, as the scheduler does, so that a
    // negative priority does not make more victims look cheaper.
    let sum = |v: &Victims<Id>| {
        v.pods
            .iter()
            .map(|p| i64::from(p.priority) - i64::from(i32::MIN))
            .sum::<i64>()
    };
    // The earliest start among the victims of the highest priority.
    let earliest = |v: &Victims<Id>| {
        let top = highest(v);
        v.pods
            .iter()
            .filter(|p| p.priority == top)
            .map(|p| p.started)
            .fold(f64::INFINITY, f64::min)
    };
    a.violations
        .cmp(&b.violations)
        .then(highest(a).cmp(&highest(b)))
        .then(sum(a).cmp(&sum(b)))
        .then(a.pods.len().cmp(&b.pods.len()))
        // Later is better.
        .then(earliest(b).total_cmp(&earliest(a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(id: u32, gpus: u32, priority: i32, started: f64) -> Bound<u32> {
        Bound {
            id,
            gpus,
            priority,
            started,
            guarded: false,
        }
    }

    fn node(free: i64, pods: Vec<Bound<u32>>) -> Node<u32> {
        Node { free, pods }
    }

    const INFERENCE: Incoming = Incoming {
        gpus: 4,
        priority: 1_000_000,
    };

    fn victims(d: Decision<u32>) -> (usize, Vec<u32>) {
        match d {
            Decision::Preempt { node, mut victims } => {
                victims.sort_unstable();
                (node, victims)
            }
            other => panic!("expected a preemption, got {other:?}"),
        }
    }

    #[test]
    fn a_pod_that_fits_binds_and_preempts_nobody() {
        let nodes = vec![node(0, vec![pod(1, 8, -1000, 0.0)]), node(4, vec![])];
        assert_eq!(schedule(&nodes, INFERENCE), Decision::Bind(1));
    }

    #[test]
    fn only_lower_priority_pods_are_victims() {
        let nodes = vec![node(
            0,
            vec![pod(1, 4, 1_000_000, 0.0), pod(2, 4, 2_000_000, 0.0)],
        )];
        assert_eq!(schedule(&nodes, INFERENCE), Decision::Unschedulable);
    }

    #[test]
    fn the_lowest_class_goes_first_whatever_its_start() {
        // Node 0: a research pod started last; node 1: an older pod of a lower class.
        let nodes = vec![
            node(0, vec![pod(1, 4, -1000, 900.0)]),
            node(0, vec![pod(2, 4, -2000, 10.0)]),
        ];
        assert_eq!(victims(schedule(&nodes, INFERENCE)), (1, vec![2]));
    }

    #[test]
    fn within_a_node_the_least_important_leave_and_the_rest_are_reprieved() {
        let nodes = vec![node(
            1,
            vec![
                pod(1, 1, -1000, 100.0),
                pod(2, 1, -1000, 50.0),
                pod(3, 1, -2000, 10.0),
                pod(4, 1, -1000, 200.0),
            ],
        )];
        // 3 GPUs needed: 1 free + 2 victims: the lower class (3), then the latest start (4).
        let need = Incoming {
            gpus: 3,
            ..INFERENCE
        };
        assert_eq!(victims(schedule(&nodes, need)), (0, vec![3, 4]));
    }

    #[test]
    fn fewer_pdb_violations_win_over_everything_else() {
        let guarded = Bound {
            guarded: true,
            ..pod(1, 4, -2000, 0.0)
        };
        let nodes = vec![
            node(0, vec![guarded]),
            node(0, vec![pod(2, 2, -1000, 0.0), pod(3, 2, -1000, 0.0)]),
        ];
        assert_eq!(victims(schedule(&nodes, INFERENCE)), (1, vec![2, 3]));
    }

    #[test]
    fn a_guarded_pod_is_reprieved_before_an_unguarded_one() {
        let guarded = Bound {
            guarded: true,
            ..pod(1, 4, -2000, 500.0)
        };
        let nodes = vec![node(0, vec![guarded, pod(2, 4, -1000, 0.0)])];
        assert_eq!(victims(schedule(&nodes, INFERENCE)), (0, vec![2]));
    }

    #[test]
    fn then_the_smallest_sum_of_priorities_then_the_fewest_victims() {
        // Same highest victim priority (-1000) on both; node 0 needs one -1000 and one -2000,
        // node 1 two of -1000: node 0's sum is smaller.
        let nodes = vec![
            node(0, vec![pod(1, 2, -1000, 0.0), pod(2, 2, -2000, 0.0)]),
            node(0, vec![pod(3, 2, -1000, 0.0), pod(4, 2, -1000, 0.0)]),
        ];
        assert_eq!(victims(schedule(&nodes, INFERENCE)), (0, vec![1, 2]));
        // Same class: one victim beats two.
        let nodes = vec![
            node(0, vec![pod(1, 2, -1000, 0.0), pod(2, 2, -1000, 0.0)]),
            node(0, vec![pod(3, 4, -1000, 0.0)]),
        ];
        assert_eq!(victims(schedule(&nodes, INFERENCE)), (1, vec![3]));
    }

    #[test]
    fn then_the_node_whose_most_important_victims_started_latest() {
        let nodes = vec![
            node(0, vec![pod(1, 4, -1000, 100.0)]),
            node(0, vec![pod(2, 4, -1000, 300.0)]),
            node(0, vec![pod(3, 4, -1000, 200.0)]),
        ];
        assert_eq!(victims(schedule(&nodes, INFERENCE)), (1, vec![2]));
        // A tie in every rule: the first node.
        let nodes = vec![
            node(0, vec![pod(1, 4, -1000, 100.0)]),
            node(0, vec![pod(2, 4, -1000, 100.0)]),
        ];
        assert_eq!(victims(schedule(&nodes, INFERENCE)), (0, vec![1]));
    }

    proptest::proptest! {
        #[test]
        fn victims_are_lower_priority_and_leave_exactly_enough(
            free in proptest::collection::vec(-4i64..8, 1..5),
            pods in proptest::collection::vec(
                (0usize..5, 1u32..5, -3i32..2, 0.0f64..100.0, proptest::bool::ANY), 0..20),
            gpus in 1u32..9,
        ) {
            let mut nodes: Vec<Node<usize>> =
                free.iter().map(|&f| Node { free: f, pods: Vec::new() }).collect();
            let n = nodes.len();
            for (i, (at, g, prio, started, guarded)) in pods.into_iter().enumerate() {
                nodes[at % n].pods.push(Bound { id: i, gpus: g, priority: prio * 1000, started, guarded });
            }
            let incoming = Incoming { gpus, priority: 0 };
            let gpus = i64::from(gpus);
            match schedule(&nodes, incoming) {
                Decision::Bind(at) => proptest::prop_assert!(nodes[at].free >= gpus),
                Decision::Unschedulable => {
                    for node in &nodes {
                        let lower: i64 = node.pods.iter().filter(|p| p.priority < 0).map(|p| i64::from(p.gpus)).sum();
                        proptest::prop_assert!(node.free + lower < gpus);
                    }
                }
                Decision::Preempt { node, victims } => {
                    let at = &nodes[node];
                    proptest::prop_assert!(at.free < gpus);
                    let freed: i64 = at.pods.iter().filter(|p| victims.contains(&p.id)).map(|p| i64::from(p.gpus)).sum();
                    proptest::prop_assert!(at.free + freed >= gpus, "not enough room made");
                    for p in at.pods.iter().filter(|p| victims.contains(&p.id)) {
                        proptest::prop_assert!(p.priority < 0, "a victim of equal or higher priority");
                        // Minimal: sparing any one victim would leave too little room.
                        proptest::prop_assert!(at.free + freed - i64::from(p.gpus) < gpus, "a victim could have stayed");
                    }
                }
            }
        }
    }
}
