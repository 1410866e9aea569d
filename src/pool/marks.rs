//! Which pool nodes are marked spare, and the label patches that bring nodes to that state.
//!
//! Pure: from a [`Ledger`] and the policy (headroom, whether lending is open) to a [`Plan`], and
//! from a plan and the labels nodes carry now to the minimal list of [`LabelPatch`]es.
//!
//! Headroom: `headroom` GPUs are kept free of research work, cluster-wide, so that inference can
//! scale up without waiting for preemption grace periods. Nodes are reserved for inference whole,
//! preferring nodes with no research pods and the most free GPUs (an idle 8-GPU node takes a
//! 4-GPU vLLM replica at once; scattered single GPUs do not). Every other eligible node with free
//! GPUs is spare. Cordoned, NotReady and untrusted nodes are never spare.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::accounting::{Ledger, NodeFacts, NodeGpus};
use crate::core::vocabulary::{TRUE, Vocabulary};

/// Value of the spare label on spare nodes. Non-spare nodes carry neither mark.
pub const SPARE_VALUE: &str = TRUE;

/// Why a node is or is not spare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Research pods may be sent here.
    Spare,
    /// Kept free for inference bursts (headroom).
    Headroom,
    /// No free GPU.
    Full,
    /// Cordoned (`spec.unschedulable`).
    Cordoned,
    /// The `Ready` condition is not `True`.
    NotReady,
    /// A quantity on the node or one of its pods could not be read.
    Untrusted,
    /// Outside every lending window.
    WindowClosed,
    /// Inference is expected to need the node's GPUs soon (a reclaim notice is out).
    Reclaiming,
}

/// The decision for one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePlan {
    pub name: String,
    pub gpus: NodeGpus,
    pub verdict: Verdict,
    /// Spare GPUs to advertise (`Some` only when spare).
    pub spare_gpus: Option<u64>,
}

/// The decision for the whole pool, nodes sorted by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub nodes: Vec<NodePlan>,
    /// Free GPUs held back on headroom nodes.
    pub reserved_gpus: u64,
}

impl Plan {
    pub fn spare_nodes(&self) -> usize {
        self.nodes.iter().filter(|n| n.spare_gpus.is_some()).count()
    }

    pub fn spare_gpus(&self) -> u64 {
        self.nodes.iter().filter_map(|n| n.spare_gpus).sum()
    }

    /// Stops lending on the nodes `held` names (where inference's next replicas are expected,
    /// or all while a reclaim notice is out): spare nodes among them lose their marks, so no new
    /// research lands on GPUs about to be taken back.
    pub fn hold_back(&mut self, held: impl Fn(&str) -> bool) {
        for n in &mut self.nodes {
            if n.verdict == Verdict::Spare && held(&n.name) {
                n.verdict = Verdict::Reclaiming;
                n.spare_gpus = None;
            }
        }
    }
}

/// Decides which pool nodes are spare.
pub fn plan(ledger: &Ledger, headroom: u64, lending_open: bool) -> Plan {
    let mut nodes: Vec<NodePlan> = ledger
        .nodes()
        .filter_map(|n| {
            let gpus = ledger.gpus(&n.name)?;
            let verdict = if !n.schedulable {
                Verdict::Cordoned
            } else if !n.ready {
                Verdict::NotReady
            } else if !gpus.trusted {
                Verdict::Untrusted
            } else if gpus.free == 0 {
                Verdict::Full
            } else if !lending_open {
                Verdict::WindowClosed
            } else {
                Verdict::Spare
            };
            Some(NodePlan {
                name: n.name.clone(),
                gpus,
                verdict,
                spare_gpus: None,
            })
        })
        .collect();
    nodes.sort_unstable_by(|a, b| a.name.cmp(&b.name));

    // Reserve whole nodes for inference: those without research pods first, then most free GPUs
    // first, then by name so that the choice is stable between passes.
    let mut candidates: Vec<usize> = (0..nodes.len())
        .filter(|&i| nodes[i].verdict == Verdict::Spare)
        .collect();
    candidates.sort_by(|&a, &b| {
        let (na, nb) = (&nodes[a], &nodes[b]);
        (na.gpus.lent > 0)
            .cmp(&(nb.gpus.lent > 0))
            .then(nb.gpus.free.cmp(&na.gpus.free))
            .then(na.name.cmp(&nb.name))
    });
    let mut reserved = 0u64;
    for i in candidates {
        let node = &mut nodes[i];
        if reserved < headroom {
            reserved += node.gpus.free;
            node.verdict = Verdict::Headroom;
        } else {
            node.spare_gpus = Some(node.gpus.free);
        }
    }
    Plan {
        nodes,
        reserved_gpus: reserved,
    }
}

/// A change to one node's spare marks: `Some(n)` sets the spare label to `true` and the
/// spare-GPUs label to `n`; `None` removes both labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelPatch {
    pub node: String,
    pub spare_gpus: Option<u64>,
}

impl LabelPatch {
    /// The JSON merge patch for this change with the label names of `names` (`null` removes
    /// a label).
    pub fn merge_patch(&self, names: &Vocabulary) -> serde_json::Value {
        let (spare, spare_gpus) = match self.spare_gpus {
            Some(n) => (
                serde_json::Value::from(SPARE_VALUE),
                serde_json::Value::from(n.to_string()),
            ),
            None => (serde_json::Value::Null, serde_json::Value::Null),
        };
        let mut labels = BTreeMap::new();
        if let Some(key) = names.spare_label.as_deref() {
            labels.insert(key, spare);
        }
        labels.insert(names.spare_gpus_label.as_str(), spare_gpus);
        serde_json::json!({ "metadata": { "labels": labels } })
    }
}

/// Whether a node's current labels already say `spare_gpus`.
pub fn marks_match(node: &NodeFacts, spare_gpus: Option<u64>) -> bool {
    match spare_gpus {
        Some(n) => {
            node.spare_label.as_deref() == Some(SPARE_VALUE)
                && node.spare_gpus_label.as_deref() == Some(n.to_string().as_str())
        }
        None => node.spare_label.is_none() && node.spare_gpus_label.is_none(),
    }
}

/// The patches needed to bring the pool's labels to `plan`, sorted by node name. Nodes whose
/// labels already match get none.
pub fn diff(ledger: &Ledger, plan: &Plan) -> Vec<LabelPatch> {
    plan.nodes
        .iter()
        .filter_map(|p| {
            let node = ledger.node(&p.name)?;
            (!marks_match(node, p.spare_gpus)).then(|| LabelPatch {
                node: p.name.clone(),
                spare_gpus: p.spare_gpus,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::accounting::{node_facts, pod_facts};
    use crate::test_support::fixtures::{NodeBuilder, PodBuilder, node, pod};

    fn ledger(nodes: Vec<NodeBuilder>, pods: Vec<PodBuilder>) -> Ledger {
        let names = Vocabulary::default();
        let mut l = Ledger::new();
        l.replace_nodes(nodes.into_iter().map(|n| node_facts(&n.build(), &names)));
        l.replace_pods(pods.into_iter().map(|p| pod_facts(&p.build(), &names)));
        l
    }

    fn verdicts(p: &Plan) -> Vec<(&str, Verdict, Option<u64>)> {
        p.nodes
            .iter()
            .map(|n| (n.name.as_str(), n.verdict, n.spare_gpus))
            .collect()
    }

    #[test]
    fn without_headroom_every_node_with_free_gpus_is_spare() {
        let l = ledger(
            vec![node("a", 8), node("b", 8)],
            vec![pod("i", "v").on("a").gpus(8), pod("i", "w").on("b").gpus(3)],
        );
        let p = plan(&l, 0, true);
        assert_eq!(
            verdicts(&p),
            vec![("a", Verdict::Full, None), ("b", Verdict::Spare, Some(5))]
        );
        assert_eq!((p.spare_nodes(), p.spare_gpus()), (1, 5));
    }

    #[test]
    fn headroom_prefers_a_whole_idle_node() {
        // a: 2 free with research on it; b: idle 8; c: 4 free, no research.
        let l = ledger(
            vec![node("a", 8), node("b", 8), node("c", 8)],
            vec![
                pod("r", "x").on("a").gpus(6).research(),
                pod("i", "v").on("c").gpus(4),
            ],
        );
        let p = plan(&l, 4, true);
        assert_eq!(
            verdicts(&p),
            vec![
                ("a", Verdict::Spare, Some(2)),
                ("b", Verdict::Headroom, None),
                ("c", Verdict::Spare, Some(4)),
            ]
        );
        assert_eq!(p.reserved_gpus, 8);
    }

    #[test]
    fn headroom_reserves_nodes_until_enough_gpus_are_held_back() {
        let l = ledger(
            vec![node("a", 8), node("b", 8), node("c", 8)],
            vec![
                pod("i", "1").on("a").gpus(4),
                pod("i", "2").on("b").gpus(4),
                pod("i", "3").on("c").gpus(4),
            ],
        );
        let p = plan(&l, 6, true);
        // Two nodes of 4 free are needed for 6; ties broken by name.
        assert_eq!(
            verdicts(&p),
            vec![
                ("a", Verdict::Headroom, None),
                ("b", Verdict::Headroom, None),
                ("c", Verdict::Spare, Some(4)),
            ]
        );
    }

    #[test]
    fn nodes_without_research_are_reserved_before_nodes_with_research() {
        let l = ledger(
            vec![node("a", 8), node("b", 8)],
            vec![
                pod("r", "x").on("a").gpus(1).research(),
                pod("i", "v").on("b").gpus(4),
            ],
        );
        // a has more free (7) but hosts research; b (4 free) is left to inference.
        let p = plan(&l, 2, true);
        assert_eq!(
            verdicts(&p),
            vec![
                ("a", Verdict::Spare, Some(7)),
                ("b", Verdict::Headroom, None)
            ]
        );
    }

    #[test]
    fn when_free_gpus_are_below_headroom_nothing_is_spare() {
        let l = ledger(vec![node("a", 8)], vec![pod("i", "v").on("a").gpus(6)]);
        let p = plan(&l, 4, true);
        assert_eq!(p.spare_nodes(), 0);
        assert_eq!(verdicts(&p), vec![("a", Verdict::Headroom, None)]);
    }

    #[test]
    fn cordoned_not_ready_and_untrusted_nodes_are_never_spare_nor_headroom() {
        let l = ledger(
            vec![
                node("c", 8).cordoned(),
                node("n", 8).not_ready(),
                node("u", 8).gpu_quantity("bogus"),
                node("z", 8).without_gpu_resource(),
            ],
            vec![],
        );
        let p = plan(&l, 0, true);
        assert_eq!(
            verdicts(&p),
            vec![
                ("c", Verdict::Cordoned, None),
                ("n", Verdict::NotReady, None),
                ("u", Verdict::Untrusted, None),
                ("z", Verdict::Full, None),
            ]
        );
        assert_eq!(plan(&l, 8, true).reserved_gpus, 0);
    }

    #[test]
    fn outside_lending_windows_no_node_is_spare() {
        let l = ledger(vec![node("a", 8)], vec![]);
        let p = plan(&l, 0, false);
        assert_eq!(verdicts(&p), vec![("a", Verdict::WindowClosed, None)]);
    }

    #[test]
    fn patches_are_made_only_where_labels_differ() {
        let l = ledger(
            vec![
                node("ok", 8).marked(Some(8)),
                node("stale", 8).marked(Some(3)),
                node("unmarked", 8),
                node("wrongly", 8).marked(Some(2)).cordoned(),
                node("clean", 8).cordoned(),
            ],
            vec![],
        );
        let p = plan(&l, 0, true);
        assert_eq!(
            diff(&l, &p),
            vec![
                LabelPatch {
                    node: "stale".into(),
                    spare_gpus: Some(8)
                },
                LabelPatch {
                    node: "unmarked".into(),
                    spare_gpus: Some(8)
                },
                LabelPatch {
                    node: "wrongly".into(),
                    spare_gpus: None
                },
            ]
        );
    }

    #[test]
    fn a_half_marked_node_is_repaired() {
        let mut n = node_facts(&node("a", 8).build(), &Vocabulary::default());
        n.spare_label = Some("true".into());
        assert!(!marks_match(&n, Some(8)));
        assert!(!marks_match(&n, None));
    }

    #[test]
    fn merge_patches_set_or_remove_both_labels() {
        let set = LabelPatch {
            node: "a".into(),
            spare_gpus: Some(3),
        };
        let names = Vocabulary::default();
        assert_eq!(
            set.merge_patch(&names),
            serde_json::json!({"metadata": {"labels": {
                "nightshift.io/spare": "true", "nightshift.io/spare-gpus": "3"}}})
        );
        let unset = LabelPatch {
            node: "a".into(),
            spare_gpus: None,
        };
        assert_eq!(
            unset.merge_patch(&names),
            serde_json::json!({"metadata": {"labels": {
                "nightshift.io/spare": null, "nightshift.io/spare-gpus": null}}})
        );
    }

    #[test]
    fn merge_patches_use_the_label_names_in_use() {
        let names = Vocabulary {
            spare_label: Some("example.com/idle".into()),
            spare_gpus_label: "example.com/idle-gpus".into(),
            ..Vocabulary::default()
        };
        let set = LabelPatch {
            node: "a".into(),
            spare_gpus: Some(2),
        };
        assert_eq!(
            set.merge_patch(&names),
            serde_json::json!({"metadata": {"labels": {
                "example.com/idle": "true", "example.com/idle-gpus": "2"}}})
        );
    }
}
