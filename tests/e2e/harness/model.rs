//! The cluster's GPU nodes as the simulator's scheduler model (`nightshift::sim::scheduler`)
//! weighs them, read from the API server: each node's allocatable GPUs, and every pod bound to
//! it with its GPU requests, `spec.priority` and `status.startTime`. The scenarios compute the
//! model's decision on this view and compare it with the real kube-scheduler's.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use nightshift::sim::scheduler::{self, Bound, Decision, Incoming};

use crate::harness::cluster::GPU_RESOURCE;
use crate::harness::objects::{gpus_of, node_of};

/// Some nodes of the cluster, in the order given, as the model takes them.
#[derive(Debug)]
pub struct View {
    pub names: Vec<String>,
    pub nodes: Vec<scheduler::Node<String>>,
    /// Start times of the pods (by `namespace/name`), for the scenarios' reports.
    pub started: BTreeMap<String, jiff::Timestamp>,
}

/// A decision of the model on a [`View`], with the node named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    Bind(String),
    /// Victims by `namespace/name`, sorted.
    Preempt {
        node: String,
        victims: Vec<String>,
    },
    Unschedulable,
}

/// `namespace/name` of a pod: the ids of the view.
pub fn id_of(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Reads `nodes` (by name) and the pods bound to them in any namespace. Pods that have ended
/// (phase `Succeeded` or `Failed`) hold nothing, as for the scheduler; pods being deleted still
/// hold their GPUs until they are gone, as for the scheduler. No PodDisruptionBudget is read:
/// the scenarios that use the view create none.
pub async fn read(client: &kube::Client, nodes: &[&str]) -> Result<View> {
    let node_api: Api<Node> = Api::all(client.clone());
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing pods")?;
    let mut view = View {
        names: Vec::new(),
        nodes: Vec::new(),
        started: BTreeMap::new(),
    };
    for &name in nodes {
        let node = node_api
            .get(name)
            .await
            .with_context(|| format!("reading node {name}"))?;
        let allocatable = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(GPU_RESOURCE))
            .and_then(|q| q.0.parse::<u32>().ok())
            .with_context(|| format!("node {name} has no readable {GPU_RESOURCE} allocatable"))?;
        let mut bound = Vec::new();
        for p in pods.items.iter().filter(|p| node_of(p) == Some(name)) {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Succeeded" | "Failed")) {
                continue;
            }
            let id = id_of(p);
            let priority = p
                .spec
                .as_ref()
                .and_then(|s| s.priority)
                .with_context(|| format!("{id} has no spec.priority"))?;
            // A pod bound but not started yet counts as started now, as for the scheduler.
            let started = p
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .map_or_else(jiff::Timestamp::now, |t| t.0);
            view.started.insert(id.clone(), started);
            bound.push(Bound {
                id,
                gpus: gpus_of(p),
                priority,
                started: started.as_millisecond() as f64 / 1000.0,
                guarded: false,
            });
        }
        let used: u32 = bound.iter().map(|b| b.gpus).sum();
        view.names.push(name.to_string());
        view.nodes.push(scheduler::Node {
            free: i64::from(allocatable) - i64::from(used),
            pods: bound,
        });
    }
    Ok(view)
}

impl View {
    /// The model's decision for a pod of `gpus` GPUs at `priority`.
    pub fn schedule(&self, gpus: u32, priority: i32) -> Choice {
        match scheduler::schedule(&self.nodes, Incoming { gpus, priority }) {
            Decision::Bind(n) => Choice::Bind(self.names[n].clone()),
            Decision::Preempt { node, mut victims } => {
                victims.sort();
                Choice::Preempt {
                    node: self.names[node].clone(),
                    victims,
                }
            }
            Decision::Unschedulable => Choice::Unschedulable,
        }
    }

    /// The earliest start of the view's pods (now, when it has none): an origin for
    /// [`View::describe`].
    pub fn earliest(&self) -> jiff::Timestamp {
        self.started
            .values()
            .min()
            .copied()
            .unwrap_or_else(jiff::Timestamp::now)
    }

    /// The nodes on one line: each one's free GPUs and its pods in start order (name, GPUs,
    /// priority, start in seconds after `origin`).
    pub fn describe(&self, origin: jiff::Timestamp) -> String {
        let mut out = Vec::new();
        for (name, node) in self.names.iter().zip(&self.nodes) {
            let mut by_start: Vec<_> = node.pods.iter().collect();
            by_start.sort_by(|a, b| a.started.total_cmp(&b.started));
            let pods: Vec<String> = by_start
                .into_iter()
                .map(|p| {
                    let short = p.id.rsplit('/').next().unwrap_or(&p.id);
                    let at = self
                        .started
                        .get(&p.id)
                        .map_or(0, |t| t.as_second() - origin.as_second());
                    format!("{short} {}gpu prio {} +{at}s", p.gpus, p.priority)
                })
                .collect();
            out.push(format!("{name} (free {}): {}", node.free, pods.join(", ")));
        }
        out.join("; ")
    }
}
