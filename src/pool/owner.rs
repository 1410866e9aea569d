//! The owner a research pod's Events are also told to: the Job or Argo Workflow that controls
//! it, read from the pod's own `ownerReferences` (no API read, so no RBAC beyond Events).
//!
//! Pure. Only the controlling reference (`controller: true`) counts, and only of the two kinds
//! researchers look at (`kubectl describe job`, the Argo UI); a pod owned by anything else (a
//! ReplicaSet, a custom operator) has its Events on itself only.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The kinds of owner told about their pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OwnerKind {
    /// `batch/v1` Job (also the Jobs of a CronJob, or of a JobSet).
    Job,
    /// `argoproj.io/v1alpha1` Workflow: Argo makes each step's pod controlled by its Workflow.
    Workflow,
}

impl OwnerKind {
    /// The `apiVersion` of the Event's `regarding` reference.
    pub fn api_version(self) -> &'static str {
        match self {
            OwnerKind::Job => "batch/v1",
            OwnerKind::Workflow => "argoproj.io/v1alpha1",
        }
    }

    /// The `kind`, also the word the Event's note uses ("3 pods of this Job").
    pub fn kind(self) -> &'static str {
        match self {
            OwnerKind::Job => "Job",
            OwnerKind::Workflow => "Workflow",
        }
    }

    fn of(reference: &OwnerReference) -> Option<Self> {
        match (reference.api_version.as_str(), reference.kind.as_str()) {
            ("batch/v1", "Job") => Some(OwnerKind::Job),
            ("argoproj.io/v1alpha1", "Workflow") => Some(OwnerKind::Workflow),
            _ => None,
        }
    }
}

/// The controlling owner of a research pod, in the pod's namespace (owner references never
/// cross namespaces).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner {
    pub kind: OwnerKind,
    pub name: String,
    /// The owner's UID (`kubectl describe job` lists the Events whose `regarding` carries it).
    pub uid: String,
}

/// The pod's controlling owner when it is a Job or a Workflow; `None` otherwise, or when the
/// reference lacks a name or UID (the API server requires both, but the pod is outside data).
pub fn owner_of(meta: &ObjectMeta) -> Option<Owner> {
    let reference = meta
        .owner_references
        .as_deref()?
        .iter()
        .find(|r| r.controller == Some(true))?;
    let kind = OwnerKind::of(reference)?;
    if reference.name.is_empty() || reference.uid.is_empty() {
        return None;
    }
    Some(Owner {
        kind,
        name: reference.name.clone(),
        uid: reference.uid.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(
        api_version: &str,
        kind: &str,
        name: &str,
        controller: Option<bool>,
    ) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller,
            block_owner_deletion: None,
        }
    }

    fn meta(references: Vec<OwnerReference>) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(references),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn a_job_that_controls_the_pod_is_its_owner() {
        let owner = owner_of(&meta(vec![reference("batch/v1", "Job", "sft", Some(true))]));
        assert_eq!(
            owner,
            Some(Owner {
                kind: OwnerKind::Job,
                name: "sft".into(),
                uid: "uid-sft".into()
            })
        );
        assert_eq!(OwnerKind::Job.api_version(), "batch/v1");
    }

    #[test]
    fn an_argo_workflow_that_controls_the_pod_is_its_owner() {
        let owner = owner_of(&meta(vec![reference(
            "argoproj.io/v1alpha1",
            "Workflow",
            "eval-x7k2p",
            Some(true),
        )]))
        .expect("owner");
        assert_eq!(owner.kind, OwnerKind::Workflow);
        assert_eq!(owner.kind.api_version(), "argoproj.io/v1alpha1");
        assert_eq!(owner.name, "eval-x7k2p");
    }

    #[test]
    fn only_the_controlling_reference_counts() {
        // A Job referenced without controlling the pod (e.g. for garbage collection only) is
        // not the pod's owner; the controlling ReplicaSet is, and it is not a kind we tell.
        let refs = vec![
            reference("batch/v1", "Job", "sft", None),
            reference("batch/v1", "Job", "other", Some(false)),
            reference("apps/v1", "ReplicaSet", "web-5d8", Some(true)),
        ];
        assert_eq!(owner_of(&meta(refs)), None);
        let refs = vec![
            reference("batch/v1", "Job", "not-controller", Some(false)),
            reference("batch/v1", "Job", "controller", Some(true)),
        ];
        assert_eq!(
            owner_of(&meta(refs)).map(|o| o.name),
            Some("controller".to_string())
        );
    }

    #[test]
    fn other_kinds_versions_and_incomplete_references_have_no_owner() {
        for r in [
            reference("batch/v1beta1", "Job", "old", Some(true)),
            reference(
                "argoproj.io/v1alpha1",
                "CronWorkflow",
                "nightly",
                Some(true),
            ),
            reference("jobset.x-k8s.io/v1alpha2", "JobSet", "js", Some(true)),
            reference("batch/v1", "CronJob", "nightly", Some(true)),
            reference("batch/v1", "Job", "", Some(true)),
            OwnerReference {
                uid: String::new(),
                ..reference("batch/v1", "Job", "no-uid", Some(true))
            },
        ] {
            assert_eq!(owner_of(&meta(vec![r.clone()])), None, "{r:?}");
        }
        assert_eq!(owner_of(&ObjectMeta::default()), None);
    }
}
