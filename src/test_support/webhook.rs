//! The webhook as the suites and benchmarks run it: the shipped mutation policy over one research
//! namespace, `research`, with the research PriorityClass in the cluster.

use std::sync::Arc;

use super::cluster::FixedCluster;
use crate::webhook::{
    cluster::ClusterView,
    mutate::MutationPolicy,
    review::{Metrics, Reviewer},
};

/// The namespace labelled for research in [`research_cluster`].
pub const RESEARCH_NAMESPACE: &str = "research";

/// An unlabelled namespace in [`research_cluster`]: its pods are not research.
pub const OTHER_NAMESPACE: &str = "web";

/// A cluster with the namespace `research` labelled for research, an unlabelled namespace `web`,
/// and the research PriorityClass (value -1000, `preemptionPolicy: Never`), as the base manifests
/// create it.
pub fn research_cluster() -> FixedCluster {
    FixedCluster::default()
        .with_namespace(RESEARCH_NAMESPACE, &[("nightshift.io/research", "true")])
        .with_namespace(OTHER_NAMESPACE, &[])
        .with_class("nightshift-research", -1000, "Never")
}

/// A reviewer with the default policy over [`research_cluster`], with metrics of its own.
pub fn research_reviewer() -> Reviewer {
    reviewer(MutationPolicy::default(), Arc::new(research_cluster()))
}

/// A reviewer with `policy` over `cluster`, with metrics of its own.
pub fn reviewer(policy: MutationPolicy, cluster: Arc<dyn ClusterView>) -> Reviewer {
    Reviewer {
        policy: Arc::new(policy),
        cluster,
        metrics: Metrics::default(),
    }
}
