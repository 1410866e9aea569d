//! The simulator's model of kube-scheduler's preemption (`nightshift::sim::scheduler`) against
//! the real kube-scheduler: for each layout of research pods in two classes (`nightshift-research`,
//! −1000, and `research-scavenger`, −2000, both `preemptionPolicy: Never`) on two kwok GPU nodes,
//! the model's decision for an inference pod (`nightshift-inference`) that must preempt, computed
//! on the cluster's own state (allocatable GPUs, requests, `spec.priority`, `status.startTime`),
//! is exactly the real scheduler's: the node the pod is nominated to and bound on, and the pods
//! it preempts (`DisruptionTarget`/`PreemptionByScheduler`), no more and no fewer.
//!
//! Each layout makes one rule of the model decide, so that a model without that rule, or with
//! another in its place, would pick other victims or another node; the layout says which wrong
//! rule it would catch, and its expected decision is asserted on the model first, so a layout
//! that stopped discriminating fails instead of passing vacuously. Pods start one after another
//! (each waits until the previous one runs and the clock has left its start second), since the
//! scheduler ranks pods of one priority by their start.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

use crate::harness::cluster::Cluster;
use crate::harness::model::{self, Choice};
use crate::harness::objects::{
    self, INFERENCE_CLASS, INFERENCE_VALUE, RESEARCH_CLASS, SCAVENGER_CLASS, is_running, node_of,
};
use crate::harness::research::{create_pod, create_started, get_pod};
use crate::harness::victims::VictimWatch;
use crate::harness::wait::{self, Check};

const NS: &str = "e2e-preemption";
/// The inference pod each layout schedules.
const PREEMPTOR: &str = "serve";
/// Deadline of each step; far above the seconds each takes, for a loaded 2-core machine.
const STEP: Duration = Duration::from_secs(120);

/// A pod's PriorityClass in a layout.
#[derive(Clone, Copy, Debug)]
enum Class {
    Research,
    Scavenger,
    /// Inference already running: holds GPUs, never a victim of another inference pod.
    Inference,
}

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::Research => RESEARCH_CLASS,
            Class::Scavenger => SCAVENGER_CLASS,
            Class::Inference => INFERENCE_CLASS,
        }
    }

    /// The `role` label: the victim watch counts `research` victims apart from any other.
    fn role(self) -> &'static str {
        match self {
            Class::Research | Class::Scavenger => "research",
            Class::Inference => "inference",
        }
    }
}

/// One pod of a layout.
struct Placed {
    name: &'static str,
    node: &'static str,
    gpus: u32,
    class: Class,
}

const fn placed(name: &'static str, node: &'static str, gpus: u32, class: Class) -> Placed {
    Placed {
        name,
        node,
        gpus,
        class,
    }
}

/// A layout: pods created in this order (so they start in it), then an inference pod of `need`
/// GPUs that only `nodes` may take; the decision the rule under test makes.
struct Layout {
    name: &'static str,
    /// The rule that decides.
    rule: &'static str,
    /// What a model with a wrong rule would decide instead.
    catches: &'static str,
    nodes: &'static [&'static str],
    pods: &'static [Placed],
    need: u32,
    node: &'static str,
    victims: &'static [&'static str],
}

use Class::{Inference, Research, Scavenger};

const LAYOUTS: &[Layout] = &[
    Layout {
        name: "class-before-start",
        rule: "across nodes, the node whose most important victim has the lowest class wins, \
               whatever the start times",
        catches: "taking the latest-started pod of the pool (a-research-3 on gpu-0), or the \
                  latest-started within a node before the class (a-research-1 on gpu-1)",
        nodes: &["gpu-0", "gpu-1"],
        pods: &[
            placed("a-scavenger", "gpu-1", 4, Scavenger),
            placed("a-research-1", "gpu-1", 4, Research),
            placed("a-research-2", "gpu-0", 4, Research),
            placed("a-research-3", "gpu-0", 4, Research),
        ],
        need: 4,
        node: "gpu-1",
        victims: &["a-scavenger"],
    },
    Layout {
        name: "reprieve",
        rule: "within a node every lower pod is removed, then put back most important first \
               (class, then start) while the pod still fits: the 4-GPU research pod goes, the \
               scavenger after it is reprieved",
        catches: "evicting the least important first until the pod fits, without putting any \
                  back (b-scavenger and b-research-big), or a lower class always going before a \
                  higher one",
        nodes: &["gpu-0", "gpu-1"],
        pods: &[
            placed("b-research-small", "gpu-0", 2, Research),
            placed("b-research-big", "gpu-0", 4, Research),
            placed("b-scavenger", "gpu-0", 2, Scavenger),
            placed("b-research-1", "gpu-1", 2, Research),
            placed("b-research-2", "gpu-1", 2, Research),
            placed("b-research-3", "gpu-1", 2, Research),
            placed("b-research-4", "gpu-1", 2, Research),
        ],
        need: 4,
        node: "gpu-0",
        victims: &["b-research-big"],
    },
    Layout {
        name: "fewest-victims",
        rule: "with the same highest victim class, the smallest sum of victim priorities, each \
               shifted to be positive: one victim beats two, even two of lower priorities",
        catches: "summing the raw negative priorities (-3000 on gpu-1 looks cheaper than -1000 \
                  on gpu-0), or ranking by the victims' start before their number (c-research \
                  on gpu-1 started after c-research-new)",
        nodes: &["gpu-0", "gpu-1"],
        pods: &[
            placed("c-inference", "gpu-1", 4, Inference),
            placed("c-research-old", "gpu-0", 4, Research),
            placed("c-research-new", "gpu-0", 4, Research),
            placed("c-research", "gpu-1", 2, Research),
            placed("c-scavenger", "gpu-1", 2, Scavenger),
        ],
        need: 4,
        node: "gpu-0",
        victims: &["c-research-new"],
    },
    Layout {
        name: "latest-start",
        rule: "with victims equal in class, sum and number, the node whose most important \
               victims started latest",
        catches: "the earliest start winning, or the first node on a tie (d-research-2 on gpu-0)",
        nodes: &["gpu-0", "gpu-1"],
        pods: &[
            placed("d-research-0", "gpu-0", 4, Research),
            placed("d-research-1", "gpu-1", 4, Research),
            placed("d-research-2", "gpu-0", 4, Research),
            placed("d-research-3", "gpu-1", 4, Research),
        ],
        need: 4,
        node: "gpu-1",
        victims: &["d-research-3"],
    },
];

pub async fn run(cluster: Arc<Cluster>) -> Result<()> {
    let c = &*cluster;
    objects::ensure_priority_classes(&c.client).await?;
    objects::ensure_scavenger_class(&c.client).await?;
    c.create_namespace(NS, json!({})).await?;
    let result = layouts(c).await;
    let deleted = crate::harness::binary::delete_namespace_now(c, NS).await;
    result.and(deleted)
}

async fn layouts(c: &Cluster) -> Result<()> {
    for layout in LAYOUTS {
        one(c, layout)
            .await
            .with_context(|| format!("layout {}", layout.name))?;
        clear(c).await?;
    }
    eprintln!(
        "preemption: the model agreed with kube-scheduler on all {} layouts",
        LAYOUTS.len()
    );
    Ok(())
}

/// `namespace/name` in this scenario's namespace.
fn id(name: &str) -> String {
    format!("{NS}/{name}")
}

fn short(ids: &[String]) -> Vec<&str> {
    ids.iter()
        .map(|i| i.rsplit('/').next().unwrap_or(i))
        .collect()
}

async fn one(c: &Cluster, l: &Layout) -> Result<()> {
    let client = &c.client;
    // The layout's nodes start empty: anything left would change the decision.
    let before = model::read(client, l.nodes).await?;
    ensure!(
        before.nodes.iter().all(|n| n.pods.is_empty()),
        "the layout's nodes are not empty: {}",
        before.describe(before.earliest())
    );
    let mut origin = None;
    for p in l.pods {
        let pod = objects::pinned_pod(p.name, &[p.node], p.gpus, p.class.name(), p.class.role());
        let started = create_started(client, NS, pod, STEP).await?;
        origin.get_or_insert(started);
    }
    let origin = origin.context("a layout without pods")?;

    // The model, on the cluster's state as the scheduler sees it now.
    let view = model::read(client, l.nodes).await?;
    let expected = Choice::Preempt {
        node: l.node.to_string(),
        victims: l.victims.iter().map(|v| id(v)).collect(),
    };
    let predicted = view.schedule(l.need, INFERENCE_VALUE);
    ensure!(
        predicted == expected,
        "the layout does not make the model decide as designed: model {predicted:?}, layout \
         {expected:?} on {}",
        view.describe(origin)
    );

    let watch = VictimWatch::start(client, NS, STEP).await?;
    let t = Instant::now();
    let stored = create_pod(
        client,
        NS,
        objects::pinned_pod(PREEMPTOR, l.nodes, l.need, INFERENCE_CLASS, "inference"),
    )
    .await?;
    ensure!(
        stored.spec.as_ref().and_then(|s| s.priority) == Some(INFERENCE_VALUE),
        "the inference pod's priority is {:?}, the model was asked for {INFERENCE_VALUE}",
        stored.spec.as_ref().and_then(|s| s.priority)
    );
    let bound = wait::until(&format!("{PREEMPTOR} running"), STEP, || async {
        c.check_processes()?;
        let p = get_pod(client, NS, PREEMPTOR).await?;
        Ok(match node_of(&p) {
            Some(node) if is_running(&p) => Check::Done(node.to_string()),
            _ => Check::Pending(format!("status {:?}", p.status.map(|s| s.phase))),
        })
    })
    .await?;
    let took = t.elapsed();
    // The pod fit only once its victims were gone; the watch may see their marks a moment after.
    let candidates: Vec<&str> = l
        .pods
        .iter()
        .filter(|p| !matches!(p.class, Inference))
        .map(|p| p.name)
        .collect();
    let victims = wait::until("every pod gone marked as a victim", STEP, || async {
        let left = objects::pods(client, NS, "role=research").await?;
        let mut gone: Vec<String> = candidates
            .iter()
            .filter(|n| left.get(**n).is_none_or(|p| !is_running(p)))
            .map(|n| n.to_string())
            .collect();
        gone.sort();
        // Sorted too.
        let marked = watch.research_names();
        Ok(if gone == marked {
            Check::Done(marked)
        } else {
            Check::Pending(format!("gone {gone:?}, marked {marked:?}"))
        })
    })
    .await?;
    let nominated = watch.nominated(PREEMPTOR);
    let real = Choice::Preempt {
        node: bound.clone(),
        victims: victims.iter().map(|v| id(v)).collect(),
    };
    let Choice::Preempt {
        node: model_node,
        victims: model_victims,
    } = &predicted
    else {
        bail!("unreachable: the model's decision was checked to be a preemption");
    };
    eprintln!(
        "preemption: layout {} ({}): {}; inference pod of {} GPUs: model {} {:?}, kube-scheduler \
         {} {:?} (nominated {}), bound {:.2} s after its creation; wrong rules this layout catches: {}",
        l.name,
        l.rule,
        view.describe(origin),
        l.need,
        model_node,
        short(model_victims),
        bound,
        victims,
        nominated.as_deref().unwrap_or("not seen"),
        took.as_secs_f64(),
        l.catches,
    );
    ensure!(
        watch.inference() == 0,
        "an inference pod was preempted for another"
    );
    if let Some(n) = &nominated {
        ensure!(
            n == &bound,
            "nominated to {n} but bound on {bound}: the decision moved"
        );
    }
    ensure!(
        real == predicted,
        "kube-scheduler decided {real:?}, the model {predicted:?}"
    );
    Ok(())
}

/// Deletes every pod of the namespace at once and waits until none is left, so that the next
/// layout starts on empty nodes.
async fn clear(c: &Cluster) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default(),
    )
    .await
    .context("deleting the layout's pods")?;
    wait::until("the layout's pods gone", STEP, || async {
        let left = pods.list(&ListParams::default()).await?.items.len();
        Ok(if left == 0 {
            Check::Done(())
        } else {
            Check::Pending(format!("{left} pods left"))
        })
    })
    .await
}
