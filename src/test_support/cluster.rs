//! A fixed cluster for the webhook's tests, benchmarks and examples: namespaces with labels and
//! PriorityClasses, answered from memory.

use std::collections::BTreeMap;

use crate::webhook::{
    cluster::{ClusterError, ClusterView},
    mutate::{PriorityClassInfo, PriorityClasses},
};

/// A fixed cluster for tests, benchmarks and examples (feature `test-support`).
#[derive(Clone, Debug, Default)]
pub struct FixedCluster {
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    pub classes: BTreeMap<String, PriorityClassInfo>,
}

impl FixedCluster {
    /// Adds a namespace with labels.
    pub fn with_namespace(mut self, name: &str, labels: &[(&str, &str)]) -> Self {
        self.namespaces.insert(
            name.to_string(),
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        self
    }

    /// Adds a PriorityClass.
    pub fn with_class(mut self, name: &str, value: i32, preemption_policy: &str) -> Self {
        self.classes.insert(
            name.to_string(),
            PriorityClassInfo {
                value,
                preemption_policy: preemption_policy.to_string(),
            },
        );
        self
    }
}

impl PriorityClasses for FixedCluster {
    fn priority_class(&self, name: &str) -> Option<PriorityClassInfo> {
        self.classes.priority_class(name)
    }
}

#[async_trait::async_trait]
impl ClusterView for FixedCluster {
    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<Option<BTreeMap<String, String>>, ClusterError> {
        Ok(self.namespaces.get(namespace).cloned())
    }
}
