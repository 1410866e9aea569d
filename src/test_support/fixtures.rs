//! Builders of pods and nodes for tests and benchmarks (`pod("ns", "name").on("n1").gpus(2)`).
//! Not used by the controller itself: compiled for unit tests and with the `test-support`
//! feature only.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{
        Container, Node, NodeCondition, NodeSpec, NodeStatus, Pod, PodCondition, PodSpec,
        PodStatus, ResourceRequirements,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ObjectMeta, OwnerReference, Time},
    },
};

use crate::core::vocabulary::{
    GPU_RESOURCE, LENT_LABEL, POOL_LABEL, RESEARCH_PRIORITY_CLASS, SPARE_GPUS_LABEL, SPARE_LABEL,
    TRUE,
};

fn gpu_resources(n: u64) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([(
            GPU_RESOURCE.to_string(),
            Quantity(n.to_string()),
        )])),
        ..ResourceRequirements::default()
    }
}

fn container(name: &str, gpus: u64) -> Container {
    Container {
        name: name.to_string(),
        resources: (gpus > 0).then(|| gpu_resources(gpus)),
        ..Container::default()
    }
}

/// A pod builder.
#[derive(Clone, Debug)]
pub struct PodBuilder(Pod);

/// A running pod in `namespace` with one container that requests no GPU.
pub fn pod(namespace: &str, name: &str) -> PodBuilder {
    PodBuilder(Pod {
        metadata: ObjectMeta {
            namespace: Some(namespace.to_string()),
            name: Some(name.to_string()),
            uid: Some(format!("uid-{namespace}-{name}")),
            creation_timestamp: Some(Time(Timestamp::UNIX_EPOCH)),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![container("main", 0)],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".to_string()),
            ..PodStatus::default()
        }),
    })
}

impl PodBuilder {
    fn spec(&mut self) -> &mut PodSpec {
        self.0.spec.get_or_insert_with(PodSpec::default)
    }

    fn status(&mut self) -> &mut PodStatus {
        self.0.status.get_or_insert_with(PodStatus::default)
    }

    /// Binds the pod to `node` (`spec.nodeName`).
    pub fn on(mut self, node: &str) -> Self {
        self.spec().node_name = Some(node.to_string());
        self
    }

    /// Not bound to any node (pending).
    pub fn unbound(mut self) -> Self {
        self.spec().node_name = None;
        self.status().phase = Some("Pending".to_string());
        self
    }

    /// Adds an owner reference of `kind` named `name` (UID `uid-NAME`) that controls the pod.
    pub fn owned_by(mut self, api_version: &str, kind: &str, name: &str) -> Self {
        self.0
            .metadata
            .owner_references
            .get_or_insert_with(Vec::new)
            .push(OwnerReference {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                name: name.to_string(),
                uid: format!("uid-{name}"),
                controller: Some(true),
                block_owner_deletion: Some(true),
            });
        self
    }

    /// Sets the first app container's GPU request.
    pub fn gpus(mut self, n: u64) -> Self {
        self.spec().containers[0] = container("main", n);
        self
    }

    /// Adds an app container requesting `n` GPUs.
    pub fn container(mut self, n: u64) -> Self {
        let i = self.spec().containers.len();
        self.spec().containers.push(container(&format!("c{i}"), n));
        self
    }

    /// Adds a regular init container requesting `n` GPUs.
    pub fn init(mut self, n: u64) -> Self {
        let inits = self.spec().init_containers.get_or_insert_with(Vec::new);
        inits.push(container(&format!("init{}", inits.len()), n));
        self
    }

    /// Adds a sidecar (init container with `restartPolicy: Always`) requesting `n` GPUs.
    pub fn sidecar(mut self, n: u64) -> Self {
        let inits = self.spec().init_containers.get_or_insert_with(Vec::new);
        let mut c = container(&format!("sidecar{}", inits.len()), n);
        c.restart_policy = Some("Always".to_string());
        inits.push(c);
        self
    }

    /// Sets pod overhead of `n` GPUs.
    pub fn overhead(mut self, n: u64) -> Self {
        self.spec().overhead = Some(BTreeMap::from([(
            GPU_RESOURCE.to_string(),
            Quantity(n.to_string()),
        )]));
        self
    }

    /// Sets the first container's GPU *limit* only (requests left to defaulting).
    pub fn gpu_limit_only(mut self, n: u64) -> Self {
        self.spec().containers[0].resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                GPU_RESOURCE.to_string(),
                Quantity(n.to_string()),
            )])),
            ..ResourceRequirements::default()
        });
        self
    }

    /// Sets the first container's GPU request to a raw quantity.
    pub fn gpu_quantity(mut self, q: &str) -> Self {
        self.spec().containers[0].resources = Some(ResourceRequirements {
            requests: Some(BTreeMap::from([(
                GPU_RESOURCE.to_string(),
                Quantity(q.to_string()),
            )])),
            ..ResourceRequirements::default()
        });
        self
    }

    /// Marks the pod as research (the webhook's `nightshift.io/lent: "true"`).
    pub fn research(self) -> Self {
        self.label(LENT_LABEL, TRUE)
    }

    /// Puts the pod in the research PriorityClass (no label).
    pub fn research_priority(self) -> Self {
        self.priority_class(RESEARCH_PRIORITY_CLASS)
    }

    /// Sets a label on the pod.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
        self
    }

    /// Sets `spec.priorityClassName`.
    /// Sets an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key.to_string(), value.to_string());
        self
    }

    pub fn priority_class(mut self, name: &str) -> Self {
        self.spec().priority_class_name = Some(name.to_string());
        self
    }

    pub fn phase(mut self, phase: &str) -> Self {
        self.status().phase = Some(phase.to_string());
        self
    }

    pub fn created(mut self, at: Timestamp) -> Self {
        self.0.metadata.creation_timestamp = Some(Time(at));
        self
    }

    pub fn started(mut self, at: Timestamp) -> Self {
        self.status().start_time = Some(Time(at));
        self
    }

    /// Adds condition `DisruptionTarget=True` with `reason`, set at `at`.
    pub fn disrupted(mut self, reason: &str, at: Timestamp) -> Self {
        self.status()
            .conditions
            .get_or_insert_with(Vec::new)
            .push(PodCondition {
                type_: "DisruptionTarget".to_string(),
                status: "True".to_string(),
                reason: Some(reason.to_string()),
                last_transition_time: Some(Time(at)),
                ..PodCondition::default()
            });
        self
    }

    pub fn build(self) -> Pod {
        self.0
    }
}

/// A node builder.
#[derive(Clone, Debug)]
pub struct NodeBuilder(Node);

/// A ready, schedulable pool node with `gpus` allocatable GPUs.
pub fn node(name: &str, gpus: u64) -> NodeBuilder {
    NodeBuilder(Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([(
                POOL_LABEL.to_string(),
                "default".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            allocatable: Some(BTreeMap::from([
                (GPU_RESOURCE.to_string(), Quantity(gpus.to_string())),
                ("cpu".to_string(), Quantity("96".to_string())),
            ])),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".to_string(),
                status: "True".to_string(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
    })
}

impl NodeBuilder {
    fn status(&mut self) -> &mut NodeStatus {
        self.0.status.get_or_insert_with(NodeStatus::default)
    }

    /// `spec.unschedulable: true` (kubectl cordon).
    pub fn cordoned(mut self) -> Self {
        self.0
            .spec
            .get_or_insert_with(NodeSpec::default)
            .unschedulable = Some(true);
        self
    }

    /// `Ready` condition `False`.
    pub fn not_ready(mut self) -> Self {
        for c in self.status().conditions.iter_mut().flatten() {
            if c.type_ == "Ready" {
                c.status = "False".to_string();
            }
        }
        self
    }

    /// No GPU in allocatable at all (e.g. a CPU node or a node whose device plugin is down).
    pub fn without_gpu_resource(mut self) -> Self {
        if let Some(a) = self.status().allocatable.as_mut() {
            a.remove(GPU_RESOURCE);
        }
        self
    }

    /// Sets allocatable GPUs to a raw quantity.
    pub fn gpu_quantity(mut self, q: &str) -> Self {
        if let Some(a) = self.status().allocatable.as_mut() {
            a.insert(GPU_RESOURCE.to_string(), Quantity(q.to_string()));
        }
        self
    }

    /// Carries spare marks as if already patched (`None`: neither label).
    pub fn marked(mut self, spare_gpus: Option<u64>) -> Self {
        let labels = self.0.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.remove(SPARE_LABEL);
        labels.remove(SPARE_GPUS_LABEL);
        if let Some(n) = spare_gpus {
            labels.insert(SPARE_LABEL.to_string(), TRUE.to_string());
            labels.insert(SPARE_GPUS_LABEL.to_string(), n.to_string());
        }
        self
    }

    pub fn build(self) -> Node {
        self.0
    }
}
