//! The part of a Pod that admission reads, decoded straight from the review's JSON.
//!
//! A pod in a review is mostly containers' images, commands, environment, volume mounts and
//! probes, none of which the decision reads. Decoding all of it into `k8s_openapi` types costs
//! far more than the decision itself, so the review is decoded into [`AdmittedPod`]: the
//! metadata plus the spec fields [`super::mutate::mutate`] reads (node name, priority triple,
//! affinity, tolerations, grace period, scheduler name, volume names, and each container's name,
//! resources, mount paths and environment variable names). Every other field is skipped by the
//! JSON parser without being built. [`AdmittedPod::into_pod`] gives the `Pod` that `mutate`
//! takes; a property test checks that it decides exactly as on the whole pod.

use std::borrow::Cow;

use k8s_openapi::{
    api::core::v1::{
        Affinity, Container, EnvVar, Pod, PodSpec, ResourceRequirements, Toleration, Volume,
        VolumeMount,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::core::{NamespaceResourceScope, Resource};
use serde::Deserialize;

/// A Pod as admission reads it: metadata in full, the spec trimmed to what decisions use.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct AdmittedPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<AdmittedSpec>,
}

/// The spec fields that decide and shape the mutation.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmittedSpec {
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub priority_class_name: Option<String>,
    #[serde(default)]
    pub priority: Option<i32>,
    #[serde(default)]
    pub preemption_policy: Option<String>,
    #[serde(default)]
    pub affinity: Option<Affinity>,
    #[serde(default)]
    pub tolerations: Option<Vec<Toleration>>,
    #[serde(default)]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(default)]
    pub scheduler_name: Option<String>,
    #[serde(default)]
    pub containers: Vec<AdmittedContainer>,
    #[serde(default)]
    pub init_containers: Option<Vec<AdmittedContainer>>,
    #[serde(default)]
    pub volumes: Option<Vec<Named>>,
}

/// A container's name and resources (whether it asks for a GPU), the paths it mounts and the
/// names of its environment variables (whether it reads the notice file already).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmittedContainer {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
    #[serde(default)]
    pub volume_mounts: Option<Vec<AdmittedMount>>,
    #[serde(default)]
    pub env: Option<Vec<Named>>,
}

/// A list entry read for its name only (a volume, an environment variable). A missing or null
/// name reads as empty, as the API server would treat it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Named {
    #[serde(default)]
    pub name: Option<String>,
}

/// A volume mount's volume and path.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmittedMount {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub mount_path: Option<String>,
}

impl AdmittedContainer {
    fn into_container(self) -> Container {
        Container {
            name: self.name,
            resources: self.resources,
            volume_mounts: self.volume_mounts.map(|ms| {
                ms.into_iter()
                    .map(|m| VolumeMount {
                        name: m.name.unwrap_or_default(),
                        mount_path: m.mount_path.unwrap_or_default(),
                        ..VolumeMount::default()
                    })
                    .collect()
            }),
            env: self.env.map(|es| {
                es.into_iter()
                    .map(|e| EnvVar {
                        name: e.name.unwrap_or_default(),
                        ..EnvVar::default()
                    })
                    .collect()
            }),
            ..Container::default()
        }
    }
}

impl AdmittedPod {
    /// The `Pod` holding exactly the decoded fields.
    pub fn into_pod(self) -> Pod {
        Pod {
            metadata: self.metadata,
            spec: self.spec.map(|s| PodSpec {
                node_name: s.node_name,
                priority_class_name: s.priority_class_name,
                priority: s.priority,
                preemption_policy: s.preemption_policy,
                affinity: s.affinity,
                tolerations: s.tolerations,
                termination_grace_period_seconds: s.termination_grace_period_seconds,
                scheduler_name: s.scheduler_name,
                containers: s
                    .containers
                    .into_iter()
                    .map(AdmittedContainer::into_container)
                    .collect(),
                init_containers: s.init_containers.map(|cs| {
                    cs.into_iter()
                        .map(AdmittedContainer::into_container)
                        .collect()
                }),
                volumes: s.volumes.map(|vs| {
                    vs.into_iter()
                        .map(|v| Volume {
                            name: v.name.unwrap_or_default(),
                            ..Volume::default()
                        })
                        .collect()
                }),
                ..PodSpec::default()
            }),
            status: None,
        }
    }
}

/// Lets kube's admission types carry an [`AdmittedPod`]: it is a core/v1 Pod.
impl Resource for AdmittedPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
