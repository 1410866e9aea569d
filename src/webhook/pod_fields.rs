//! The part of a Pod that admission reads, decoded straight from the review's JSON.
//!
//! A pod in a review is mostly containers' images, commands, environment, volume mounts and
//! probes, and metadata such as managed fields and the last applied configuration, none of which
//! the decision reads. Decoding all of it into `k8s_openapi` types costs far more than the
//! decision itself, so the review is decoded into [`AdmittedPod`]: the metadata the decision reads
//! (name, namespace, labels, the mirror-pod annotation) plus the spec fields
//! [`super::mutate::mutate`] reads (node name, priority triple, affinity, tolerations, grace
//! period, scheduler name, volumes, and each container's name, resources, mounts and environment
//! variables). Every other field is skipped by the JSON parser without being built.
//! [`super::mutate::mutate`] decides on the [`AdmittedPod`] itself, with no `Pod` built for it; a
//! whole `Pod` (a tool's, a test's) gives one with `AdmittedPod::from`, and property tests check
//! that the pod read from JSON decides exactly as the whole pod. [`AdmittedPod::into_pod`] gives
//! back a `Pod` of the decoded fields, for tools and tests that apply a patch to it.
//!
//! Of the lists of volumes, mounts and environment variables (dozens of entries in a real pod),
//! the decision only asks whether the list is there and whether it holds the reclaim-notice
//! entry: the volume named [`NOTICE_VOLUME`], a mount at [`NOTICE_MOUNT_PATH`], the variable
//! [`NOTICE_FILE_ENV`]. So a list is skipped over as raw JSON, and its entries are read only when
//! its text could hold that entry (see `kept`); only that entry is kept. A list that is present
//! stays present (maybe empty), so the patch still appends to it rather than creating it.
//!
//! Because the lists are read from the raw text, an [`AdmittedPod`] is decoded from JSON text with
//! `sonic-rs` ([`AdmittedPod::from_json`], or as a field of a review that `sonic-rs` reads); not
//! with another JSON deserializer, and not from a `Value`.

use std::{borrow::Cow, collections::BTreeMap, sync::LazyLock};

use k8s_openapi::{
    api::core::v1::{
        Affinity, Container, EnvVar, Pod, PodSpec, ResourceRequirements, Toleration, Volume,
        VolumeMount,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::core::{NamespaceResourceScope, Resource};
use memchr::memmem::Finder;
use serde::{Deserialize, Deserializer};

use crate::core::vocabulary::{NOTICE_FILE_ENV, NOTICE_MOUNT_PATH, NOTICE_VOLUME};

/// Annotation the kubelet puts on mirror pods (static pods reflected into the API). They cannot
/// be scheduled or preempted, so they are never touched.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// A Pod as admission reads it: the metadata and the spec trimmed to what decisions use.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct AdmittedPod {
    /// Name, generated name, namespace, labels, and of the annotations only the mirror-pod one
    /// ([`AdmittedMeta`]).
    #[serde(default, deserialize_with = "admitted_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<AdmittedSpec>,
}

/// The metadata fields decisions read. Everything else (owner references, managed fields, which
/// the API server fills in before admission, timestamps) is skipped; of the annotations, often
/// kilobytes of `last-applied-configuration`, only [`MIRROR_POD_ANNOTATION`] is kept, the only
/// one the decision asks for, and the others are read in place.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdmittedMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "mirror_annotation")]
    annotations: Option<BTreeMap<String, String>>,
}

fn admitted_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = AdmittedMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        generate_name: m.generate_name,
        namespace: m.namespace,
        labels: m.labels,
        annotations: m.annotations,
        ..ObjectMeta::default()
    })
}

/// The annotations, keeping only [`MIRROR_POD_ANNOTATION`]; `null` reads as absent. Values are
/// still read as strings, so what the whole pod's decode refuses is refused here too.
fn mirror_annotation<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    use serde::de::{MapAccess, Visitor};

    struct Annotations;
    impl<'de> Visitor<'de> for Annotations {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a map of strings")
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut kept = BTreeMap::new();
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                if key == MIRROR_POD_ANNOTATION {
                    let value = map.next_value::<String>()?;
                    kept.insert(key.into_owned(), value);
                } else {
                    map.next_value::<AString>()?;
                }
            }
            Ok(Some(kept))
        }
    }
    d.deserialize_option(Annotations)
}

/// A JSON string, checked and dropped: an annotation the decision does not read (often kilobytes
/// of escaped `last-applied-configuration`, which a `String` would copy out).
struct AString;

impl<'de> Deserialize<'de> for AString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = AString;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E>(self, _: &str) -> Result<AString, E> {
                Ok(AString)
            }
        }
        d.deserialize_str(Visitor)
    }
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
    /// Only the reclaim-notice volume, if the pod has one.
    #[serde(default, deserialize_with = "notice_volumes")]
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
    /// Only the mounts at the reclaim-notice path, in order.
    #[serde(default, deserialize_with = "notice_mounts")]
    pub volume_mounts: Option<Vec<AdmittedMount>>,
    /// Only the reclaim-notice variable, if the container sets it.
    #[serde(default, deserialize_with = "notice_env")]
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

/// List entries as read in place: the strings borrow from the body when they hold no escape.
mod borrowed {
    use std::borrow::Cow;

    use serde::Deserialize;

    /// A volume or an environment variable (same name as the owned type: serde's error messages
    /// name it).
    #[derive(Deserialize)]
    pub struct Named<'a> {
        #[serde(default, borrow)]
        pub name: Option<Cow<'a, str>>,
    }

    /// A volume mount.
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct AdmittedMount<'a> {
        #[serde(default, borrow)]
        pub name: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        pub mount_path: Option<Cow<'a, str>>,
    }
}

/// An optional list, of which only the entries `read` keeps are kept. `null` reads as absent, as
/// for `Option<Vec<T>>`.
///
/// The list is first skipped over as raw JSON (syntax and UTF-8 checked, nothing built), and its
/// entries are read only when the text could hold the entry kept: when it contains `needle` (the
/// name or path the entry is recognised by) or an escape that could spell it. A list of dozens of
/// environment variables without the notice variable thus costs one scan, not a string per key
/// and value. Entries that cannot be the kept one are not type-checked: the API server has read
/// the pod into its own types before it sends it to a webhook, so a mistyped entry does not
/// come from it, and one sent by anyone else changes nothing the decision reads.
fn kept<'de, D, T>(
    d: D,
    needle: &Finder<'static>,
    read: fn(&str) -> sonic_rs::Result<Vec<T>>,
) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
{
    use serde::de::Error as _;

    let Some(raw) = Option::<sonic_rs::LazyValue<'de>>::deserialize(d)? else {
        return Ok(None);
    };
    let text = raw.as_raw_str();
    let may_hold =
        needle.find(text.as_bytes()).is_some() || memchr::memchr(b'\\', text.as_bytes()).is_some();
    if text.starts_with('[') && !may_hold {
        return Ok(Some(Vec::new()));
    }
    read(text).map(Some).map_err(D::Error::custom)
}

/// The entries of the JSON list `text` that `keep` keeps, read as `B` (whose strings may borrow
/// from `text`).
fn entries<'x, B: Deserialize<'x>, T>(
    text: &'x str,
    keep: impl Fn(B) -> Option<T>,
) -> sonic_rs::Result<Vec<T>> {
    let all: Vec<B> = sonic_rs::from_str(text)?;
    Ok(all.into_iter().filter_map(keep).collect())
}

/// The needles `kept` looks for, each searcher built once rather than at every list (as
/// `str::contains` would): 0.09-0.17 µs instead of 0.27-0.43 µs for a list of 33 variables.
static VOLUME_NEEDLE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(NOTICE_VOLUME));
static ENV_NEEDLE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(NOTICE_FILE_ENV));
static MOUNT_NEEDLE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(NOTICE_MOUNT_PATH));

fn notice_volumes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Named>>, D::Error> {
    kept(d, &VOLUME_NEEDLE, |text| {
        entries(text, |v: borrowed::Named<'_>| {
            (v.name.as_deref() == Some(NOTICE_VOLUME)).then(|| Named {
                name: Some(NOTICE_VOLUME.to_string()),
            })
        })
    })
}

fn notice_env<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Named>>, D::Error> {
    kept(d, &ENV_NEEDLE, |text| {
        entries(text, |e: borrowed::Named<'_>| {
            (e.name.as_deref() == Some(NOTICE_FILE_ENV)).then(|| Named {
                name: Some(NOTICE_FILE_ENV.to_string()),
            })
        })
    })
}

fn notice_mounts<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<AdmittedMount>>, D::Error> {
    // `/etc/nightshift/` and `/etc/nightshift` are one mount point (as `mutate` compares them).
    kept(d, &MOUNT_NEEDLE, |text| {
        entries(text, |m: borrowed::AdmittedMount<'_>| {
            let path = m.mount_path?;
            (path.trim_end_matches('/') == NOTICE_MOUNT_PATH).then(|| AdmittedMount {
                name: m.name.map(Cow::into_owned),
                mount_path: Some(path.into_owned()),
            })
        })
    })
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
    /// The pod in the JSON text `json`, read as the review reads it.
    pub fn from_json(json: &str) -> sonic_rs::Result<Self> {
        sonic_rs::from_str(json)
    }

    /// The `Pod` holding exactly the decoded fields (for tools and tests that apply a patch to
    /// the pod and decide again).
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

/// The fields of a whole pod that the decision reads, every list entry's name and path kept.
impl From<&Pod> for AdmittedPod {
    fn from(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        Self {
            metadata: ObjectMeta {
                name: meta.name.clone(),
                generate_name: meta.generate_name.clone(),
                namespace: meta.namespace.clone(),
                labels: meta.labels.clone(),
                annotations: meta.annotations.clone(),
                ..ObjectMeta::default()
            },
            spec: pod.spec.as_ref().map(AdmittedSpec::from),
        }
    }
}

impl From<&PodSpec> for AdmittedSpec {
    fn from(spec: &PodSpec) -> Self {
        let containers = |cs: &[Container]| cs.iter().map(AdmittedContainer::from).collect();
        Self {
            node_name: spec.node_name.clone(),
            priority_class_name: spec.priority_class_name.clone(),
            priority: spec.priority,
            preemption_policy: spec.preemption_policy.clone(),
            affinity: spec.affinity.clone(),
            tolerations: spec.tolerations.clone(),
            termination_grace_period_seconds: spec.termination_grace_period_seconds,
            scheduler_name: spec.scheduler_name.clone(),
            containers: containers(&spec.containers),
            init_containers: spec.init_containers.as_deref().map(containers),
            volumes: spec.volumes.as_ref().map(|vs| {
                vs.iter()
                    .map(|v| Named {
                        name: Some(v.name.clone()),
                    })
                    .collect()
            }),
        }
    }
}

impl From<&Container> for AdmittedContainer {
    fn from(c: &Container) -> Self {
        Self {
            name: c.name.clone(),
            resources: c.resources.clone(),
            volume_mounts: c.volume_mounts.as_ref().map(|ms| {
                ms.iter()
                    .map(|m| AdmittedMount {
                        name: Some(m.name.clone()),
                        mount_path: Some(m.mount_path.clone()),
                    })
                    .collect()
            }),
            env: c.env.as_ref().map(|es| {
                es.iter()
                    .map(|e| Named {
                        name: Some(e.name.clone()),
                    })
                    .collect()
            }),
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
