//! Table-driven and property tests of the mutation: the decision and the patch it writes.

use super::*;
use json_patch::PatchOperation;
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::Value;

const NS: &str = "team-a";
/// A packing scheduler profile's name, as a platform would configure it.
const PACKING: &str = "nightshift-packing";

fn classes() -> BTreeMap<String, PriorityClassInfo> {
    [
        ("nightshift-research", -1000, "Never"),
        ("nightshift-inference", 1_000_000, "PreemptLowerPriority"),
        ("default-prio", 1000, "PreemptLowerPriority"),
        ("scavenger", -5000, "Never"),
        ("low-but-preempting", -5000, "PreemptLowerPriority"),
    ]
    .into_iter()
    .map(|(n, v, p)| {
        (
            n.to_string(),
            PriorityClassInfo {
                value: v,
                preemption_policy: p.to_string(),
            },
        )
    })
    .collect()
}

fn research_ns() -> BTreeMap<String, String> {
    [("nightshift.io/research".to_string(), "true".to_string())].into()
}

fn plain_ns() -> BTreeMap<String, String> {
    BTreeMap::new()
}

/// A pod as the API server hands it to webhooks after defaulting and the Priority plugin.
fn pod(extra: Value) -> Pod {
    let mut base = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": NS},
        "spec": {
            "containers": [{
                "name": "main",
                "image": "trainer:1",
                "resources": {"limits": {"nvidia.com/gpu": "4"}, "requests": {"nvidia.com/gpu": "4"}}
            }],
            "priority": 0,
            "preemptionPolicy": "PreemptLowerPriority",
            "terminationGracePeriodSeconds": 30
        }
    });
    merge(&mut base, extra);
    serde_json::from_value(base).expect("test pod is valid")
}

fn merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                if v.is_null() {
                    b.remove(&k);
                } else {
                    merge(b.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (b, e) => *b = e,
    }
}

/// [`super::mutate`] on a whole pod, as a tool calls it: through the fields admission reads.
fn mutate(
    pod: &Pod,
    namespace: &str,
    namespace_labels: &BTreeMap<String, String>,
    policy: &MutationPolicy,
    classes: &dyn PriorityClasses,
) -> Result<Mutation, Denial> {
    super::mutate(
        &AdmittedPod::from(pod),
        namespace,
        namespace_labels,
        policy,
        classes,
    )
}

fn run(pod: &Pod, ns_labels: &BTreeMap<String, String>) -> Mutation {
    mutate(pod, NS, ns_labels, &MutationPolicy::default(), &classes()).expect("not denied")
}

fn apply(pod: &Pod, patch: &JsonPatch) -> Pod {
    let mut doc = serde_json::to_value(pod).expect("pod serialises");
    let operations = patch.operations().expect("the patch is JSON");
    json_patch::patch(&mut doc, &operations.0).expect("patch applies");
    serde_json::from_value(doc).expect("patched pod deserialises")
}

fn patch_json(m: &Mutation) -> Value {
    serde_json::from_str(m.patch.as_str()).expect("the patch is JSON")
}

/// Mutating the patched pod again changes nothing.
fn assert_idempotent(pod: &Pod, ns_labels: &BTreeMap<String, String>) -> Pod {
    let first = run(pod, ns_labels);
    let patched = apply(pod, &first.patch);
    let second = run(&patched, ns_labels);
    assert!(
        second.patch.is_empty(),
        "second pass must be empty, got {}",
        patch_json(&second)
    );
    patched
}

fn paths(m: &Mutation) -> Vec<String> {
    m.patch
        .operations()
        .expect("the patch is JSON")
        .0
        .iter()
        .map(|op| match op {
            PatchOperation::Add(a) => format!("add {}", a.path),
            PatchOperation::Replace(r) => format!("replace {}", r.path),
            other => format!("{other:?}"),
        })
        .collect()
}

#[test]
fn gpu_pod_in_research_namespace_gets_the_full_mark() {
    let p = pod(json!({}));
    let m = run(&p, &research_ns());
    assert_eq!(m.selection, Classification::Research { gpu: true });
    assert_eq!(
        patch_json(&m),
        json!([
            {"op": "add", "path": "/spec/priorityClassName", "value": "nightshift-research"},
            {"op": "replace", "path": "/spec/priority", "value": -1000},
            {"op": "replace", "path": "/spec/preemptionPolicy", "value": "Never"},
            {"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [
                        {"key": "nightshift.io/pool", "operator": "Exists"},
                        {"key": "nightshift.io/spare", "operator": "In", "values": ["true"]}
                    ]}
                ]}
            }}},
            {"op": "add", "path": "/spec/tolerations", "value": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ]},
            {"op": "add", "path": "/metadata/labels", "value": {"nightshift.io/lent": "true"}},
            {"op": "add", "path": "/spec/volumes", "value": [{
                "name": "nightshift-notice",
                "downwardAPI": {"items": [{
                    "path": "annotations",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.annotations"}
                }]}
            }]},
            {"op": "add", "path": "/spec/containers/0/volumeMounts", "value": [
                {"name": "nightshift-notice", "mountPath": "/etc/nightshift", "readOnly": true}
            ]},
            {"op": "add", "path": "/spec/containers/0/env", "value": [
                {"name": "NIGHTSHIFT_NOTICE_FILE", "value": "/etc/nightshift/annotations"}
            ]}
        ])
    );
    assert!(
        m.warnings.iter().any(|w| w.contains("nightshift-research")),
        "{:?}",
        m.warnings
    );
    assert_idempotent(&p, &research_ns());
}

#[test]
fn pods_that_are_not_selected_are_never_touched() {
    type Case<'a> = (&'a str, Pod, BTreeMap<String, String>, &'a str, SkipReason);
    let cases: Vec<Case<'_>> = vec![
        (
            "plain pod, plain namespace",
            pod(json!({})),
            plain_ns(),
            NS,
            SkipReason::NotResearch,
        ),
        (
            "pod label other than true",
            pod(json!({"metadata": {"labels": {"nightshift.io/research": "yes"}}})),
            plain_ns(),
            NS,
            SkipReason::NotResearch,
        ),
        (
            "excluded namespace even when labelled",
            pod(json!({"metadata": {"labels": {"nightshift.io/research": "true"}}})),
            research_ns(),
            "kube-system",
            SkipReason::ExcludedNamespace,
        ),
        (
            "mirror pod",
            pod(json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "abc"}}})),
            research_ns(),
            NS,
            SkipReason::MirrorPod,
        ),
        (
            "already bound",
            pod(json!({"spec": {"nodeName": "gpu-1"}})),
            research_ns(),
            NS,
            SkipReason::AlreadyBound,
        ),
    ];
    for (name, p, labels, ns, reason) in cases {
        let m = mutate(&p, ns, &labels, &MutationPolicy::default(), &classes()).expect(name);
        assert_eq!(m.selection, Classification::Skipped(reason), "{name}");
        assert!(m.patch.is_empty(), "{name}: {}", patch_json(&m));
        assert!(m.warnings.is_empty(), "{name}");
    }
}

#[test]
fn pod_label_opts_in_outside_research_namespaces() {
    let p = pod(json!({"metadata": {"labels": {"nightshift.io/research": "true", "app": "x"}}}));
    let m = run(&p, &plain_ns());
    assert_eq!(m.selection, Classification::Research { gpu: true });
    assert!(paths(&m).contains(&"add /metadata/labels/nightshift.io~1lent".to_string()));
    assert_idempotent(&p, &plain_ns());
}

#[test]
fn pods_in_research_namespaces_cannot_opt_out() {
    let p = pod(json!({"metadata": {"labels": {"nightshift.io/research": "false"}}}));
    let m = run(&p, &research_ns());
    assert_eq!(m.selection, Classification::Research { gpu: true });
    assert!(
        m.warnings.iter().any(|w| w.contains("ignored")),
        "{:?}",
        m.warnings
    );
    assert_idempotent(&p, &research_ns());
}

#[test]
fn required_affinity_is_anded_into_every_existing_term() {
    let p = pod(json!({"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
            {"matchExpressions": [{"key": "nightshift.io/pool", "operator": "Exists"}]}
        ]}
    }}}}));
    let m = run(&p, &research_ns());
    let ps = paths(&m);
    let base = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms";
    let count = |path: String| ps.iter().filter(|p| **p == path).count();
    assert_eq!(
        count(format!("add {base}/0/matchExpressions/-")),
        2,
        "pool and spare into term 0: {ps:?}"
    );
    assert_eq!(count(format!("add {base}/1/matchExpressions")), 1, "{ps:?}");
    assert_eq!(
        count(format!("add {base}/2/matchExpressions/-")),
        1,
        "only the spare mark into the term that has the pool: {ps:?}"
    );
    assert!(
        !ps.iter().any(|p| p.contains("preferredDuring")),
        "no soft preference in required mode: {ps:?}"
    );
    let patched = assert_idempotent(&p, &research_ns());
    let terms = patched
        .spec
        .and_then(|s| s.affinity)
        .and_then(|a| a.node_affinity)
        .and_then(|n| n.required_during_scheduling_ignored_during_execution)
        .expect("required affinity")
        .node_selector_terms;
    assert_eq!(terms.len(), 3, "no term added or removed");
    let policy = MutationPolicy::default();
    let reqs = required_requirements(&policy);
    assert_eq!(reqs.len(), 2, "pool and spare mark");
    assert!(terms.iter().all(|t| reqs.iter().all(|r| term_has(t, r))));
    assert_eq!(
        terms[1].match_fields.as_ref().map(Vec::len),
        Some(1),
        "matchFields kept"
    );
}

fn preferred_policy() -> MutationPolicy {
    let mut policy = MutationPolicy::default();
    if let Some(spare) = policy.spare.as_mut() {
        spare.placement = SparePlacement::Preferred { weight: 100 };
    }
    policy
}

#[test]
fn preferred_placement_gives_a_soft_spare_preference_and_only_the_pool_is_required() {
    let policy = preferred_policy();
    let p = pod(json!({}));
    let m = mutate(&p, NS, &research_ns(), &policy, &classes()).expect("ok");
    let text = patch_json(&m).to_string();
    assert!(
        text.contains(r#""preferredDuringSchedulingIgnoredDuringExecution":[{"preference":{"matchExpressions":[{"key":"nightshift.io/spare","operator":"In","values":["true"]}]},"weight":100}]"#),
        "{text}"
    );
    assert!(
        text.contains(r#""nodeSelectorTerms":[{"matchExpressions":[{"key":"nightshift.io/pool","operator":"Exists"}]}]"#),
        "{text}"
    );
    assert!(
        m.warnings.iter().any(|w| w.contains("preferred")),
        "{:?}",
        m.warnings
    );
}

#[test]
fn required_placement_warns_that_research_waits_for_spare_gpus() {
    let m = run(&pod(json!({})), &research_ns());
    assert!(
        m.warnings
            .iter()
            .any(|w| w.contains("marks spare") && w.contains("pending while no spare GPU")),
        "{:?}",
        m.warnings
    );
}

#[test]
fn existing_preferred_terms_are_kept_and_spare_preference_appended() {
    let policy = preferred_policy();
    let p = pod(
        json!({"spec": {"affinity": {"podAntiAffinity": {}, "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}
            ]
        }}}}),
    );
    let m = mutate(&p, NS, &research_ns(), &policy, &classes()).expect("ok");
    let ps = paths(&m);
    assert!(
        ps.contains(
            &"add /spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
                .to_string()
        )
    );
    assert!(
        ps.contains(
            &"add /spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/-"
                .to_string()
        )
    );
    let patched = apply(&p, &m.patch);
    let again = mutate(&patched, NS, &research_ns(), &policy, &classes()).expect("ok");
    assert!(again.patch.is_empty(), "{}", patch_json(&again));
    let prefs = patched
        .spec
        .and_then(|s| s.affinity)
        .and_then(|a| a.node_affinity)
        .and_then(|n| n.preferred_during_scheduling_ignored_during_execution)
        .expect("preferred");
    assert_eq!(prefs.len(), 2);
    assert_eq!(prefs[0].weight, 10, "user preference untouched");
}

#[test]
fn required_placement_leaves_the_users_preferences_alone() {
    let p = pod(json!({"spec": {"affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}
        ]
    }}}}));
    let m = run(&p, &research_ns());
    assert!(
        !paths(&m).iter().any(|p| p.contains("preferredDuring")),
        "{:?}",
        paths(&m)
    );
    assert_idempotent(&p, &research_ns());
}

#[test]
fn affinity_without_node_affinity_gets_node_affinity_added() {
    let p = pod(json!({"spec": {"affinity": {"podAffinity": {}}}}));
    let m = run(&p, &research_ns());
    assert!(paths(&m).contains(&"add /spec/affinity/nodeAffinity".to_string()));
    assert_idempotent(&p, &research_ns());
}

#[test]
fn only_missing_tolerations_are_added() {
    let cases = [
        (json!([{"key": "nvidia.com/gpu", "operator": "Exists"}]), 0),
        (json!([{"operator": "Exists"}]), 0),
        (
            json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}]),
            1,
        ),
        (
            json!([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}]),
            1,
        ),
        (
            json!([{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]),
            1,
        ),
    ];
    for (tolerations, added) in cases {
        let p = pod(json!({"spec": {"tolerations": tolerations.clone()}}));
        let m = run(&p, &research_ns());
        let n = paths(&m)
            .iter()
            .filter(|p| p.as_str() == "add /spec/tolerations/-")
            .count();
        assert_eq!(n, added, "{tolerations}");
        let patched = assert_idempotent(&p, &research_ns());
        let len = patched.spec.and_then(|s| s.tolerations).map(|t| t.len());
        assert_eq!(
            len,
            Some(tolerations.as_array().map_or(0, Vec::len) + added),
            "existing tolerations kept"
        );
    }
}

#[test]
fn taints_with_values_get_equal_tolerations() {
    let policy = MutationPolicy {
        pool_taints: vec!["gpu=shared:NoExecute".parse().expect("taint")],
        ..MutationPolicy::default()
    };
    let p = pod(json!({}));
    let m = mutate(&p, NS, &research_ns(), &policy, &classes()).expect("ok");
    let tol = m
        .patch
        .operations()
        .expect("the patch is JSON")
        .0
        .iter()
        .find_map(|op| match op {
            PatchOperation::Add(a) if a.path.as_str() == "/spec/tolerations" => {
                Some(a.value.clone())
            }
            _ => None,
        })
        .expect("tolerations added");
    assert_eq!(
        tol,
        json!([{"key": "gpu", "operator": "Equal", "value": "shared", "effect": "NoExecute"}])
    );
}

#[test]
fn label_keys_with_slash_and_tilde_are_escaped_in_pointers() {
    let policy = MutationPolicy {
        lent_label: Some("example.com/odd~key".into()),
        ..MutationPolicy::default()
    };
    let p = pod(json!({"metadata": {"labels": {"app": "x"}}}));
    let m = mutate(&p, NS, &research_ns(), &policy, &classes()).expect("ok");
    let ps = paths(&m);
    assert!(
        ps.contains(&"add /metadata/labels/example.com~1odd~0key".to_string()),
        "{ps:?}"
    );
    let patched = apply(&p, &m.patch);
    let labels = patched.metadata.labels.expect("labels");
    assert_eq!(
        labels.get("example.com/odd~key").map(String::as_str),
        Some("true")
    );
    assert_eq!(labels.get("app").map(String::as_str), Some("x"));
}

/// The patch is written as text: a key that JSON itself must escape (quote, backslash, control
/// character) still gives a JSON document whose pointer names exactly that key.
#[test]
fn label_keys_that_json_escapes_are_written_as_valid_pointers() {
    for key in ["example.com/a\"b", "a\\b~/c", "tab\there", "é/ü"] {
        let policy = MutationPolicy {
            lent_label: Some(key.into()),
            ..MutationPolicy::default()
        };
        let p = pod(json!({"metadata": {"labels": {"app": "x"}}}));
        let m = mutate(&p, NS, &research_ns(), &policy, &classes()).expect("ok");
        let patched = apply(&p, &m.patch);
        let labels = patched.metadata.labels.expect("labels");
        assert_eq!(labels.get(key).map(String::as_str), Some("true"), "{key:?}");
        assert_eq!(m.patch.len(), patch_json(&m).as_array().map_or(0, Vec::len));
    }
}

#[test]
fn user_set_higher_priority_is_overridden_with_a_warning() {
    let p = pod(json!({"spec": {
        "priorityClassName": "nightshift-inference",
        "priority": 1_000_000,
        "preemptionPolicy": "PreemptLowerPriority"
    }}));
    let m = run(&p, &research_ns());
    let ps = paths(&m);
    for field in ["priorityClassName", "priority", "preemptionPolicy"] {
        assert!(ps.contains(&format!("replace /spec/{field}")), "{ps:?}");
    }
    assert!(
        m.warnings
            .iter()
            .any(|w| w.contains("\"nightshift-inference\" replaced")),
        "{:?}",
        m.warnings
    );
    let patched = assert_idempotent(&p, &research_ns());
    let spec = patched.spec.expect("spec");
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("nightshift-research")
    );
    assert_eq!(spec.priority, Some(-1000));
    assert_eq!(spec.preemption_policy.as_deref(), Some("Never"));
}

#[test]
fn global_default_class_stamped_by_the_api_server_is_replaced_consistently() {
    // What the Priority plugin leaves when a globalDefault class exists.
    let p = pod(json!({"spec": {"priorityClassName": "default-prio", "priority": 1000}}));
    let patched = assert_idempotent(&p, &research_ns());
    let spec = patched.spec.expect("spec");
    assert_eq!(
        (
            spec.priority_class_name.as_deref(),
            spec.priority,
            spec.preemption_policy.as_deref()
        ),
        (Some("nightshift-research"), Some(-1000), Some("Never"))
    );
}

#[test]
fn pod_without_priority_fields_gets_all_three_added() {
    let p = pod(json!({"spec": {"priority": null, "preemptionPolicy": null}}));
    let m = run(&p, &research_ns());
    let ps = paths(&m);
    for field in ["priorityClassName", "priority", "preemptionPolicy"] {
        assert!(ps.contains(&format!("add /spec/{field}")), "{ps:?}");
    }
}

#[test]
fn a_lower_never_preempting_class_may_be_kept() {
    let p = pod(
        json!({"spec": {"priorityClassName": "scavenger", "priority": -5000, "preemptionPolicy": "Never"}}),
    );
    let m = run(&p, &research_ns());
    assert!(
        !paths(&m).iter().any(|p| p.contains("priority")),
        "{:?}",
        paths(&m)
    );
    // A lower class that still preempts is not acceptable.
    let p = pod(json!({"spec": {"priorityClassName": "low-but-preempting", "priority": -5000}}));
    let patched = assert_idempotent(&p, &research_ns());
    assert_eq!(
        patched.spec.and_then(|s| s.priority_class_name).as_deref(),
        Some("nightshift-research")
    );
}

#[test]
fn missing_research_class_denies_with_instructions() {
    let mut cls = classes();
    cls.remove("nightshift-research");
    let err = mutate(
        &pod(json!({})),
        NS,
        &research_ns(),
        &MutationPolicy::default(),
        &cls,
    )
    .expect_err("denied");
    let msg = err.to_string();
    assert!(
        msg.contains("kubectl create priorityclass nightshift-research"),
        "{msg}"
    );
    assert!(msg.contains("preemption-policy=Never"), "{msg}");
    // Pods that are not research are not affected by the missing class.
    let m = mutate(
        &pod(json!({})),
        NS,
        &plain_ns(),
        &MutationPolicy::default(),
        &cls,
    )
    .expect("ok");
    assert!(m.patch.is_empty());
}

#[test]
fn cpu_only_research_pod_gets_low_priority_but_stays_off_the_gpu_pool() {
    let p = pod(
        json!({"spec": {"containers": [{"name": "prep", "image": "prep:1",
        "resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "0"}}}]}}),
    );
    let m = run(&p, &research_ns());
    assert_eq!(m.selection, Classification::Research { gpu: false });
    let ps = paths(&m);
    assert!(ps.iter().any(|p| p.contains("priorityClassName")), "{ps:?}");
    assert!(
        !ps.iter()
            .any(|p| p.contains("affinity") || p.contains("tolerations")),
        "{ps:?}"
    );
    assert!(
        m.warnings
            .iter()
            .any(|w| w.contains("not sent to the GPU pool")),
        "{:?}",
        m.warnings
    );
    assert_idempotent(&p, &research_ns());
}

#[test]
fn gpu_requested_only_by_an_init_container_counts() {
    let p = pod(json!({"spec": {
        "containers": [{"name": "main", "image": "x"}],
        "initContainers": [{"name": "warm", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    }}));
    assert_eq!(
        run(&p, &research_ns()).selection,
        Classification::Research { gpu: true }
    );
}

#[test]
fn grace_period_is_capped_never_raised() {
    for (current, expected_op, end) in [
        (Some(600), Some("replace"), 30),
        (Some(10), None, 10),
        (None, Some("add"), 30),
    ] {
        let p = pod(json!({"spec": {"terminationGracePeriodSeconds": current}}));
        let m = run(&p, &research_ns());
        let op = paths(&m)
            .into_iter()
            .find(|p| p.ends_with("/spec/terminationGracePeriodSeconds"));
        assert_eq!(
            op.as_deref().and_then(|o| o.split(' ').next()),
            expected_op,
            "{current:?}"
        );
        let patched = assert_idempotent(&p, &research_ns());
        assert_eq!(
            patched
                .spec
                .and_then(|s| s.termination_grace_period_seconds),
            Some(end)
        );
    }
}

#[test]
fn packing_profile_is_given_to_gpu_research_pods_of_the_default_scheduler_only() {
    let policy = MutationPolicy {
        scheduler_name: Some(PACKING.into()),
        ..MutationPolicy::default()
    };
    let name_after = |extra: Value| {
        let p = pod(extra);
        let m = mutate(&p, NS, &research_ns(), &policy, &classes()).expect("ok");
        let patched = apply(&p, &m.patch);
        let again = mutate(&patched, NS, &research_ns(), &policy, &classes()).expect("ok");
        assert!(again.patch.is_empty(), "{}", patch_json(&again));
        (
            patched.spec.and_then(|s| s.scheduler_name),
            m.warnings.join("; "),
        )
    };
    let (name, warnings) = name_after(json!({}));
    assert_eq!(name.as_deref(), Some(PACKING));
    assert!(warnings.contains("packs research"), "{warnings}");
    let (name, _) = name_after(json!({"spec": {"schedulerName": "default-scheduler"}}));
    assert_eq!(name.as_deref(), Some(PACKING));
    let (name, warnings) = name_after(json!({"spec": {"schedulerName": "volcano"}}));
    assert_eq!(
        name.as_deref(),
        Some("volcano"),
        "a chosen scheduler is kept"
    );
    assert!(warnings.contains("\"volcano\" kept"), "{warnings}");
    // CPU-only research pods are not sent to the GPU pool, nor to its packing profile.
    let cpu = pod(json!({"spec": {"containers": [{"name": "c", "image": "x"}]}}));
    let m = mutate(&cpu, NS, &research_ns(), &policy, &classes()).expect("ok");
    assert!(
        !patch_json(&m).to_string().contains("schedulerName"),
        "{}",
        patch_json(&m)
    );
    // Off by default.
    let m = run(&pod(json!({})), &research_ns());
    assert!(!patch_json(&m).to_string().contains("schedulerName"));
}

#[test]
fn every_part_can_be_switched_off() {
    let policy = MutationPolicy {
        priority_class: None,
        pool: None,
        spare: None,
        pool_taints: Vec::new(),
        lent_label: None,
        max_grace_period_seconds: None,
        notice_file: false,
        ..MutationPolicy::default()
    };
    let p = pod(json!({"spec": {"terminationGracePeriodSeconds": 600}}));
    let m = mutate(&p, NS, &research_ns(), &policy, &BTreeMap::new()).expect("no class needed");
    assert!(m.patch.is_empty(), "{}", patch_json(&m));
}

#[test]
fn pool_names_give_an_in_requirement() {
    let policy = MutationPolicy {
        pool: Some(PoolSelector {
            key: "nightshift.io/pool".into(),
            values: vec!["h100".into(), "a100".into()],
        }),
        ..MutationPolicy::default()
    };
    let p = pod(json!({}));
    let m = mutate(&p, NS, &research_ns(), &policy, &classes()).expect("ok");
    let text = patch_json(&m).to_string();
    assert!(
        text.contains(r#"{"key":"nightshift.io/pool","operator":"In","values":["h100","a100"]}"#),
        "{text}"
    );
}

#[test]
fn taint_specs_parse_and_reject_nonsense() {
    assert_eq!(
        "nvidia.com/gpu=present:NoSchedule".parse::<PoolTaint>(),
        Ok(PoolTaint {
            key: "nvidia.com/gpu".into(),
            value: Some("present".into()),
            effect: "NoSchedule".into()
        })
    );
    assert!("nvidia.com/gpu".parse::<PoolTaint>().is_err());
    assert!("gpu:Sometimes".parse::<PoolTaint>().is_err());
    assert!(":NoSchedule".parse::<PoolTaint>().is_err());
}

#[test]
fn quantities_of_zero_are_not_requests() {
    for (q, positive) in [
        ("0", false),
        ("0.0", false),
        ("", false),
        ("1", true),
        ("8", true),
        ("1k", true),
        ("-1", false),
    ] {
        assert_eq!(quantity_is_positive(q), positive, "{q:?}");
    }
}

/// Per container: the volumes mounted at the notice path, and the values of the notice variable.
type ContainerNotice = (Vec<String>, Vec<String>);

/// The notice parts of a patched pod: volume names, then per container its [`ContainerNotice`].
fn notice_parts(p: &Pod) -> (Vec<String>, Vec<ContainerNotice>) {
    let spec = p.spec.clone().expect("spec");
    let volumes = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.clone())
        .collect();
    let containers = spec
        .containers
        .iter()
        .map(|c| {
            let mounts = c
                .volume_mounts
                .iter()
                .flatten()
                .filter(|m| m.mount_path.trim_end_matches('/') == "/etc/nightshift")
                .map(|m| m.name.clone())
                .collect();
            let env = c
                .env
                .iter()
                .flatten()
                .filter(|e| e.name == "NIGHTSHIFT_NOTICE_FILE")
                .map(|e| e.value.clone().unwrap_or_default())
                .collect();
            (mounts, env)
        })
        .collect();
    (volumes, containers)
}

/// Applies `m` to `doc` exactly as sent, checks that a second pass is empty, returns the pod.
fn apply_sent(doc: &Value, m: &Mutation) -> Pod {
    let mut patched = doc.clone();
    json_patch::patch(
        &mut patched,
        &m.patch.operations().expect("the patch is JSON").0,
    )
    .unwrap_or_else(|e| panic!("patch does not apply: {e}: {}", patch_json(m)));
    let p: Pod = serde_json::from_value(patched).expect("patched pod reads");
    let second = run(&p, &research_ns());
    assert!(second.patch.is_empty(), "{}", patch_json(&second));
    p
}

#[test]
fn every_container_gets_the_notice_file_and_init_containers_do_not() {
    let doc = serde_json::to_value(pod(json!({"spec": {
        "volumes": [{"name": "data", "emptyDir": {}}],
        "containers": [
            {"name": "main", "image": "x",
             "resources": {"limits": {"nvidia.com/gpu": "1"}},
             "volumeMounts": [{"name": "data", "mountPath": "/data"}],
             "env": [{"name": "EPOCHS", "value": "3"}]},
            {"name": "sidecar", "image": "y"}
        ],
        "initContainers": [{"name": "fetch", "image": "z"}]
    }})))
    .expect("pod serialises");
    let p: Pod = serde_json::from_value(doc.clone()).expect("pod reads");
    let m = run(&p, &research_ns());
    let ps = paths(&m);
    for path in [
        "add /spec/volumes/-",
        "add /spec/containers/0/volumeMounts/-",
        "add /spec/containers/0/env/-",
        "add /spec/containers/1/volumeMounts",
        "add /spec/containers/1/env",
    ] {
        assert!(ps.contains(&path.to_string()), "{path} missing from {ps:?}");
    }
    assert!(!ps.iter().any(|p| p.contains("initContainers")), "{ps:?}");
    assert!(
        m.warnings
            .iter()
            .any(|w| w.contains("/etc/nightshift/annotations")),
        "{:?}",
        m.warnings
    );
    let patched = apply_sent(&doc, &m);
    let file = || vec!["/etc/nightshift/annotations".to_string()];
    let ours = || vec!["nightshift-notice".to_string()];
    assert_eq!(
        notice_parts(&patched),
        (
            vec!["data".to_string(), "nightshift-notice".to_string()],
            vec![(ours(), file()), (ours(), file())]
        )
    );
    let spec = patched.spec.expect("spec");
    let volume = spec.volumes.iter().flatten().last().expect("volume");
    let item = volume
        .downward_api
        .as_ref()
        .and_then(|d| d.items.as_ref())
        .and_then(|i| i.first())
        .expect("downward API item");
    assert_eq!(item.path, "annotations");
    assert_eq!(
        item.field_ref.as_ref().map(|f| f.field_path.as_str()),
        Some("metadata.annotations")
    );
    let mount = spec.containers[1].volume_mounts.iter().flatten().next();
    assert_eq!(mount.and_then(|m| m.read_only), Some(true));
    let init = spec.init_containers.iter().flatten().next().expect("init");
    assert!(init.volume_mounts.is_none() && init.env.is_none());
}

#[test]
fn notice_parts_already_there_are_not_added_again() {
    let ours = json!({"name": "nightshift-notice", "downwardAPI": {"items": [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
    ]}});
    let doc = serde_json::to_value(pod(json!({"spec": {
        "volumes": [ours],
        "containers": [
            // Mounted (with a trailing slash) and the variable set to a path of its own: kept.
            {"name": "a", "image": "x",
             "volumeMounts": [{"name": "nightshift-notice", "mountPath": "/etc/nightshift/"}],
             "env": [{"name": "NIGHTSHIFT_NOTICE_FILE", "value": "/elsewhere"}]},
            // Mounted, no variable: only the variable is added.
            {"name": "b", "image": "x",
             "volumeMounts": [{"name": "nightshift-notice", "mountPath": "/etc/nightshift"}]},
            // Its own volume at the notice path: left alone.
            {"name": "c", "image": "x",
             "volumeMounts": [{"name": "config", "mountPath": "/etc/nightshift"}]},
            // The variable only: the mount is added, the variable kept.
            {"name": "d", "image": "x", "env": [{"name": "NIGHTSHIFT_NOTICE_FILE", "value": "/x"}]}
        ]
    }})))
    .expect("pod serialises");
    let p: Pod = serde_json::from_value(doc.clone()).expect("pod reads");
    let m = run(&p, &research_ns());
    let notice: Vec<String> = paths(&m)
        .into_iter()
        .filter(|p| p.contains("volume") || p.contains("env"))
        .collect();
    assert_eq!(
        notice,
        [
            "add /spec/containers/1/env",
            "add /spec/containers/3/volumeMounts"
        ]
    );
    let patched = apply_sent(&doc, &m);
    let (volumes, containers) = notice_parts(&patched);
    assert_eq!(volumes, ["nightshift-notice"]);
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        containers,
        [
            (s(&["nightshift-notice"]), s(&["/elsewhere"])),
            (
                s(&["nightshift-notice"]),
                s(&["/etc/nightshift/annotations"])
            ),
            (s(&["config"]), s(&[])),
            (s(&["nightshift-notice"]), s(&["/x"])),
        ]
    );
}

#[test]
fn empty_and_null_notice_lists_get_patches_that_apply() {
    for (volumes, mounts, env) in [
        (json!([]), json!([]), json!([])),
        (Value::Null, Value::Null, Value::Null),
    ] {
        let mut doc = serde_json::to_value(pod(json!({}))).expect("pod serialises");
        doc["spec"]["volumes"] = volumes.clone();
        doc["spec"]["containers"][0]["volumeMounts"] = mounts;
        doc["spec"]["containers"][0]["env"] = env;
        let p: Pod = serde_json::from_value(doc.clone()).expect("pod reads");
        let m = run(&p, &research_ns());
        let patched = apply_sent(&doc, &m);
        let (vs, cs) = notice_parts(&patched);
        assert_eq!(vs, ["nightshift-notice"], "{volumes}");
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].1, ["/etc/nightshift/annotations"], "{volumes}");
    }
}

#[test]
fn a_marked_pod_readmitted_gets_no_patch_and_no_warning() {
    let p = pod(json!({}));
    let patched = assert_idempotent(&p, &research_ns());
    let again = run(&patched, &research_ns());
    assert!(again.warnings.is_empty(), "{:?}", again.warnings);
}

// ---- property test -------------------------------------------------------------------------

fn arb_requirement() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({"key": "zone", "operator": "In", "values": ["a", "b"]})),
        Just(json!({"key": "nightshift.io/pool", "operator": "Exists"})),
        Just(json!({"key": "nightshift.io/pool", "operator": "In", "values": ["h100"]})),
        Just(json!({"key": "nightshift.io/spare", "operator": "In", "values": ["true"]})),
        Just(json!({"key": "weird/key~1", "operator": "DoesNotExist"})),
    ]
}

fn arb_term() -> impl Strategy<Value = Value> {
    (
        proptest::option::of(proptest::collection::vec(arb_requirement(), 0..3)),
        any::<bool>(),
    )
        .prop_map(|(exprs, fields)| {
            let mut t = serde_json::Map::new();
            if let Some(e) = exprs {
                t.insert("matchExpressions".into(), Value::Array(e));
            }
            if fields {
                t.insert(
                    "matchFields".into(),
                    json!([{"key": "metadata.name", "operator": "In", "values": ["n1"]}]),
                );
            }
            Value::Object(t)
        })
}

fn arb_affinity() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        Just(json!({})),
        Just(json!({"nodeAffinity": {}})),
        (
            proptest::option::of(proptest::collection::vec(arb_term(), 0..4)),
            proptest::option::of(proptest::collection::vec(
                (1..=100i32, arb_term()).prop_map(|(w, t)| json!({"weight": w, "preference": t})),
                0..3
            )),
        )
            .prop_map(|(req, pref)| {
                let mut na = serde_json::Map::new();
                if let Some(terms) = req {
                    na.insert(
                        "requiredDuringSchedulingIgnoredDuringExecution".into(),
                        json!({ "nodeSelectorTerms": terms }),
                    );
                }
                if let Some(p) = pref {
                    na.insert(
                        "preferredDuringSchedulingIgnoredDuringExecution".into(),
                        Value::Array(p),
                    );
                }
                json!({ "nodeAffinity": na })
            }),
    ]
}

fn arb_toleration() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})),
        Just(json!({"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"})),
        Just(json!({"operator": "Exists"})),
        Just(json!({"key": "other", "operator": "Exists", "effect": "NoExecute"})),
    ]
}

prop_compose! {
    fn arb_case()(
        ns_research in any::<bool>(),
        pod_label in proptest::option::of(prop_oneof![Just("true"), Just("false"), Just("")]),
        other_labels in any::<bool>(),
        gpus in prop_oneof![Just(None), Just(Some("0")), Just(Some("1")), Just(Some("8"))],
        init_gpu in any::<bool>(),
        affinity in arb_affinity(),
        tolerations in proptest::option::of(proptest::collection::vec(arb_toleration(), 0..4)),
        class in prop_oneof![
            Just(None), Just(Some("nightshift-research")), Just(Some("nightshift-inference")),
            Just(Some("default-prio")), Just(Some("scavenger")), Just(Some("unknown"))
        ],
        priority in proptest::option::of(-10_000..2_000_000i32),
        policy in proptest::option::of(prop_oneof![Just("Never"), Just("PreemptLowerPriority")]),
        grace in proptest::option::of(0..1000i64),
        scheduler in proptest::option::of(prop_oneof![
            Just("default-scheduler"), Just(PACKING), Just("custom-scheduler")
        ]),
    ) -> (BTreeMap<String, String>, Value) {
        let ns = if ns_research { research_ns() } else { plain_ns() };
        let mut labels = serde_json::Map::new();
        if let Some(v) = pod_label { labels.insert("nightshift.io/research".into(), json!(v)); }
        if other_labels { labels.insert("app.kubernetes.io/name".into(), json!("x")); }
        let mut container = json!({"name": "main", "image": "x"});
        if let Some(g) = gpus { container["resources"] = json!({"limits": {"nvidia.com/gpu": g}}); }
        let mut spec = json!({"containers": [container]});
        if init_gpu {
            spec["initContainers"] = json!([{"name": "i", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]);
        }
        if !affinity.is_null() { spec["affinity"] = affinity; }
        if let Some(t) = tolerations { spec["tolerations"] = Value::Array(t); }
        if let Some(c) = class { spec["priorityClassName"] = json!(c); }
        if let Some(p) = priority { spec["priority"] = json!(p); }
        if let Some(p) = policy { spec["preemptionPolicy"] = json!(p); }
        if let Some(g) = grace { spec["terminationGracePeriodSeconds"] = json!(g); }
        if let Some(n) = scheduler { spec["schedulerName"] = json!(n); }
        let mut metadata = json!({"name": "p", "namespace": NS});
        if !labels.is_empty() { metadata["labels"] = Value::Object(labels); }
        (ns, json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}))
    }
}

/// Notice parts a pod may carry already: its volumes, the first container's mounts and
/// variables (each absent, empty, unrelated or the notice's own), and whether a second container
/// with none of them follows.
type NoticeCase = (Value, Value, Value, bool);

fn arb_notice() -> impl Strategy<Value = NoticeCase> {
    (
        prop_oneof![
            Just(Value::Null),
            Just(json!([])),
            Just(json!([{"name": "data", "emptyDir": {}}])),
            Just(json!([{"name": "nightshift-notice", "emptyDir": {}}])),
        ],
        prop_oneof![
            Just(Value::Null),
            Just(json!([])),
            Just(json!([{"name": "data", "mountPath": "/data"}])),
            Just(json!([{"name": "nightshift-notice", "mountPath": "/etc/nightshift"}])),
            Just(json!([{"name": "data", "mountPath": "/etc/nightshift/"}])),
        ],
        prop_oneof![
            Just(Value::Null),
            Just(json!([])),
            Just(json!([{"name": "A", "value": "b"}])),
            Just(json!([{"name": "NIGHTSHIFT_NOTICE_FILE", "value": "/f"}])),
        ],
        any::<bool>(),
    )
}

fn with_notice(doc: &mut Value, (volumes, mounts, env, second): NoticeCase) {
    let sidecar = second.then(|| json!({"name": "side", "image": "x"}));
    set_lists(doc, volumes, mounts, env, sidecar);
}

/// Sets the pod's volumes and its first container's mounts and env (a null leaves one unset),
/// and appends `sidecar` as a second container.
fn set_lists(doc: &mut Value, volumes: Value, mounts: Value, env: Value, sidecar: Option<Value>) {
    if !volumes.is_null() {
        doc["spec"]["volumes"] = volumes;
    }
    if !mounts.is_null() {
        doc["spec"]["containers"][0]["volumeMounts"] = mounts;
    }
    if !env.is_null() {
        doc["spec"]["containers"][0]["env"] = env;
    }
    if let (Some(side), Some(cs)) = (sidecar, doc["spec"]["containers"].as_array_mut()) {
        cs.push(side);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn patched_pods_are_valid_marked_and_stable(
        (ns, mut doc) in arb_case(), notice in arb_notice(), preferred in any::<bool>(),
        packing in any::<bool>()
    ) {
        with_notice(&mut doc, notice);
        let mut policy = if preferred { preferred_policy() } else { MutationPolicy::default() };
        if packing { policy.scheduler_name = Some(PACKING.into()); }
        let pod: Pod = serde_json::from_value(doc.clone()).expect("generated pod is valid");
        let m = mutate(&pod, NS, &ns, &policy, &classes()).expect("research class exists");

        // The patch applies to the pod's own JSON (not a re-serialisation) and gives a Pod.
        let mut patched_doc = doc;
        json_patch::patch(&mut patched_doc, &m.patch.operations().expect("the patch is JSON").0).expect("patch applies");
        let patched: Pod = serde_json::from_value(patched_doc).expect("patched JSON is a Pod");

        let selected = ns.contains_key("nightshift.io/research")
            || pod.metadata.labels.as_ref().and_then(|l| l.get("nightshift.io/research")).is_some_and(|v| v == "true");
        match m.selection {
            Classification::Skipped(_) => {
                prop_assert!(!selected);
                prop_assert!(m.patch.is_empty());
            }
            Classification::Research { gpu } => {
                prop_assert!(selected);
                let spec = patched.spec.clone().expect("spec");
                let cls = classes();
                let name = spec.priority_class_name.clone().expect("class set");
                let info = cls.get(&name).expect("known class");
                prop_assert!(info.value <= -1000 && info.preemption_policy == "Never");
                prop_assert_eq!(spec.priority, Some(info.value));
                prop_assert_eq!(spec.preemption_policy.as_deref(), Some(info.preemption_policy.as_str()));
                prop_assert!(spec.termination_grace_period_seconds.is_some_and(|g| g <= 30));
                prop_assert_eq!(
                    patched.metadata.labels.as_ref().and_then(|l| l.get("nightshift.io/lent")).map(String::as_str),
                    Some("true")
                );
                prop_assert_eq!(gpu, requests_resource(&AdmittedSpec::from(&spec), "nvidia.com/gpu"));
                let (volumes, containers) = notice_parts(&patched);
                prop_assert_eq!(volumes.iter().filter(|v| *v == "nightshift-notice").count(), 1);
                for (mounts, env) in containers {
                    // One mount at the notice path: the notice volume with the variable set,
                    // or one of the pod's own (left alone).
                    prop_assert_eq!(mounts.len(), 1);
                    prop_assert!(mounts[0] != "nightshift-notice" || env.len() == 1);
                }
                if gpu {
                    let reqs = required_requirements(&policy);
                    let terms = spec.affinity.as_ref()
                        .and_then(|a| a.node_affinity.as_ref())
                        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
                        .map(|s| s.node_selector_terms.clone())
                        .unwrap_or_default();
                    prop_assert!(!terms.is_empty());
                    prop_assert!(terms.iter().all(|t| reqs.iter().all(|r| term_has(t, r))));
                    let tols = spec.tolerations.clone().unwrap_or_default();
                    prop_assert!(policy.pool_taints.iter().all(|t| tols.iter().any(|tol| tolerates(tol, t))));
                }
            }
        }
        let again = mutate(&patched, NS, &ns, &policy, &classes()).expect("still fine");
        prop_assert!(again.patch.is_empty(), "second pass: {}", patch_json(&again));
    }

    #[test]
    fn the_trimmed_decode_decides_exactly_as_the_whole_pod(
        (ns, mut doc) in arb_case(), notice in arb_notice(), noise in any::<bool>()
    ) {
        with_notice(&mut doc, notice);
        if noise {
            // Fields the decision never reads, as real pods carry them.
            doc["spec"]["containers"][0]["env"] = json!([{"name": "A", "value": "b"}]);
            doc["spec"]["containers"][0]["command"] = json!(["python", "train.py"]);
            doc["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
            doc["spec"]["nodeSelector"] = json!({"zone": "a"});
            doc["metadata"]["annotations"] = json!({"team": "x"});
        }
        let policy = MutationPolicy { scheduler_name: Some(PACKING.into()), ..MutationPolicy::default() };
        let whole: Pod = serde_json::from_value(doc.clone()).expect("generated pod is valid");
        // From JSON text, as the review reads it: the lists are skipped over as raw JSON text.
        let text = serde_json::to_string(&doc).expect("pod serialises");
        let trimmed = AdmittedPod::from_json(&text).expect("trimmed decode");
        let a = mutate(&whole, NS, &ns, &policy, &classes()).expect("research class exists");
        let b = super::mutate(&trimmed, NS, &ns, &policy, &classes()).expect("research class exists");
        prop_assert_eq!(patch_json(&a), patch_json(&b));
        prop_assert_eq!(a.warnings, b.warnings);
        prop_assert_eq!(format!("{:?}", a.selection), format!("{:?}", b.selection));
    }
}

/// Lists of volumes, mounts or environment variables as real pods carry them: a few entries in
/// any order, among them (maybe several times) the reclaim-notice one, entries without a name or
/// path, and names that only look alike.
fn arb_entries(pool: Vec<Value>) -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        proptest::collection::vec(proptest::sample::select(pool), 0..5).prop_map(Value::Array),
    ]
}

fn arb_lists() -> impl Strategy<Value = (Value, Value, Value, Value)> {
    let volumes = vec![
        json!({"name": "nightshift-notice", "emptyDir": {}}),
        json!({"name": "nightshift-notice-2", "emptyDir": {}}),
        json!({"name": "data", "persistentVolumeClaim": {"claimName": "d"}}),
        json!({"emptyDir": {}}),
        json!({"name": null}),
    ];
    let mounts = vec![
        json!({"name": "nightshift-notice", "mountPath": "/etc/nightshift"}),
        json!({"name": "data", "mountPath": "/etc/nightshift/"}),
        json!({"name": "data", "mountPath": "/etc/nightshift//", "readOnly": true}),
        json!({"name": "data", "mountPath": "/etc/nightshift-other"}),
        json!({"name": "data", "mountPath": "/data"}),
        json!({"mountPath": "/etc/nightshift"}),
        json!({"name": "nightshift-notice"}),
    ];
    let env = vec![
        json!({"name": "NIGHTSHIFT_NOTICE_FILE", "value": "/f"}),
        json!({"name": "NIGHTSHIFT_NOTICE_FILE_2", "value": "/f"}),
        json!({"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
        json!({"value": "no name"}),
    ];
    (
        arb_entries(volumes),
        arb_entries(mounts.clone()),
        arb_entries(env),
        arb_entries(mounts),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The review's own path: the body's bytes, parsed by `review::parse` into the trimmed pod
    /// whose lists keep only the reclaim-notice entries, give the same patch, warnings and
    /// decision as the whole pod.
    #[test]
    fn the_trimmed_parse_of_the_body_decides_exactly_as_the_whole_pod(
        (ns, mut doc) in arb_case(),
        (volumes, mounts, env, second_mounts) in arb_lists(),
        second in any::<bool>(),
        meta in 0..4u8,
    ) {
        match meta {
            // Annotations, the mirror-pod one among them, and a large one the decision skips.
            1 => doc["metadata"]["annotations"] = json!({
                "kubectl.kubernetes.io/last-applied-configuration": "{\"spec\": {}}".repeat(50),
                MIRROR_POD_ANNOTATION: "x",
                "team": "a\u{e9}\n",
            }),
            // What the API server fills in before admission.
            2 => {
                doc["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Node",
                    "name": "n", "uid": "u", "controller": true}]);
                doc["metadata"]["managedFields"] = json!([{"manager": "kubectl", "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}}}]);
                doc["metadata"]["uid"] = json!("0c9a8d74");
                doc["metadata"]["annotations"] = json!({"team": "x"});
            }
            3 => doc["metadata"]["annotations"] = Value::Null,
            _ => {}
        }
        let sidecar = second.then(|| json!({"name": "side", "image": "x", "volumeMounts": second_mounts}));
        set_lists(&mut doc, volumes, mounts, env, sidecar);
        let policy = MutationPolicy { scheduler_name: Some(PACKING.into()), ..MutationPolicy::default() };
        let whole: Pod = serde_json::from_value(doc.clone()).expect("generated pod is valid");
        let body = serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": NS, "operation": "CREATE", "userInfo": {}, "object": doc
            }
        })).expect("body");
        let trimmed = super::super::review::parse(&body)
            .expect("parses")
            .object
            .expect("object");
        let a = mutate(&whole, NS, &ns, &policy, &classes()).expect("research class exists");
        let b = super::mutate(&trimmed, NS, &ns, &policy, &classes()).expect("research class exists");
        prop_assert_eq!(patch_json(&a), patch_json(&b));
        prop_assert_eq!(a.warnings, b.warnings);
        prop_assert_eq!(format!("{:?}", a.selection), format!("{:?}", b.selection));
    }
}

/// The trimmed lists keep what the decision reads even when the JSON escapes it, read `null` as
/// absent, and refuse what the whole pod's decode refuses.
#[test]
fn trimmed_lists_read_escapes_nulls_and_refuse_what_the_whole_pod_refuses() {
    use super::super::pod_fields::AdmittedPod;
    let read = |spec: &str| {
        AdmittedPod::from_json(&format!(r#"{{"spec": {spec}}}"#)).map(AdmittedPod::into_pod)
    };
    let pod = read(
        r#"{"volumes": [{"name": "data"}, {"name": "nightshift-notice"}],
            "containers": [{"name": "c",
              "volumeMounts": [{"name": "x", "mountPath": "/data"},
                               {"name": "nightshift-notice", "mountPath": "\/etc\/nightshift"}],
              "env": [{"name": "A"}, {"name": "NIGHTSHIFT_NOTICE_FILE", "value": "v"}]}]}"#,
    )
    .expect("reads");
    let spec = pod.spec.expect("spec");
    let volumes: Vec<String> = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.clone())
        .collect();
    assert_eq!(volumes, ["nightshift-notice"]);
    let c = &spec.containers[0];
    let mounts = c.volume_mounts.clone().expect("mounts");
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0].mount_path, "/etc/nightshift");
    assert_eq!(mounts[0].name, "nightshift-notice");
    let env = c.env.clone().expect("env");
    assert_eq!(env.len(), 1);
    assert_eq!(env[0].name, "NIGHTSHIFT_NOTICE_FILE");

    // Present but without the notice entry: present and empty (the patch appends to it).
    let pod = read(r#"{"volumes": [{"name": "data"}], "containers": [{"env": [{"name": "A"}]}]}"#)
        .expect("reads");
    let spec = pod.spec.expect("spec");
    assert_eq!(spec.volumes.map(|v| v.len()), Some(0));
    assert_eq!(spec.containers[0].env.as_ref().map(Vec::len), Some(0));
    assert_eq!(spec.containers[0].volume_mounts, None);

    // `null` is absent, as for the whole pod.
    let pod = read(r#"{"volumes": null, "containers": [{"env": null, "volumeMounts": null}]}"#)
        .expect("reads");
    let spec = pod.spec.expect("spec");
    assert_eq!(spec.volumes, None);
    assert_eq!(spec.containers[0].env, None);

    // What the whole pod's decode refuses, the trimmed one refuses too.
    let meta = |m: &str| AdmittedPod::from_json(&format!(r#"{{"metadata": {m}}}"#));
    for bad in [
        r#"{"annotations": {"a": 1}}"#,
        r#"{"annotations": []}"#,
        r#"{"labels": {"a": null}}"#,
    ] {
        let whole = serde_json::from_str::<Pod>(&format!(r#"{{"metadata": {bad}}}"#));
        assert!(whole.is_err(), "the whole pod reads {bad}");
        assert!(meta(bad).is_err(), "the trimmed pod reads {bad}");
    }
    let mirror = meta(r#"{"annotations": {"kubernetes.io\/config.mirror": "m", "b": "c"}}"#)
        .expect("reads")
        .into_pod();
    assert_eq!(
        mirror.metadata.annotations,
        Some([(MIRROR_POD_ANNOTATION.to_string(), "m".to_string())].into())
    );
    for bad in [
        r#"{"volumes": {"name": "x"}, "containers": []}"#,
        r#"{"volumes": [{"name": "nightshift-notice"}, {"name": 1}], "containers": []}"#,
        r#"{"containers": [{"env": "A"}]}"#,
        r#"{"containers": [{"env": [{"name": "NIGHTSHIFT_NOTICE_FILE"}, 1]}]}"#,
        r#"{"containers": [{"volumeMounts": [{"mountPath": ["/etc/nightshift"]}]}]}"#,
        r#"{"containers": [{"env": [{"name": "A"]}]}"#,
        r#"{"containers": [{"env": [{"name": "\u0041"}, {"name": 1}]}]}"#,
    ] {
        let whole = serde_json::from_str::<Pod>(&format!(r#"{{"spec": {bad}}}"#));
        assert!(whole.is_err(), "the whole pod reads {bad}");
        assert!(read(bad).is_err(), "the trimmed pod reads {bad}");
    }
    // A list that cannot hold the notice entry is only checked to be an array of valid JSON: the
    // API server never sends mistyped entries (it has read the pod into its own types first), and
    // one that does not name the notice entry changes nothing the decision reads.
    for unread in [
        r#"{"volumes": [1], "containers": []}"#,
        r#"{"volumes": [{"name": 1}], "containers": []}"#,
    ] {
        let whole = serde_json::from_str::<Pod>(&format!(r#"{{"spec": {unread}}}"#));
        assert!(whole.is_err(), "the whole pod reads {unread}");
        let spec = read(unread).expect("reads").spec.expect("spec");
        assert_eq!(spec.volumes.map(|v| v.len()), Some(0), "{unread}");
    }
}

/// Found by the `admission` fuzz target: a required node affinity without its term list (absent
/// in the object as sent) got an append to that list, which does not apply. The patch must
/// apply to the object exactly as sent and leave nothing for a second pass.
#[test]
fn required_affinity_without_a_term_list_gets_the_whole_list() {
    for required in [json!({}), json!({"nodeSelectorTerms": []})] {
        let mut sent = serde_json::to_value(pod(json!({}))).expect("pod serialises");
        sent["spec"]["affinity"] =
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}});
        let p: Pod = serde_json::from_value(sent.clone()).expect("pod reads");
        let m = run(&p, &research_ns());
        let mut patched = sent.clone();
        json_patch::patch(
            &mut patched,
            &m.patch.operations().expect("the patch is JSON").0,
        )
        .unwrap_or_else(|e| panic!("{required}: patch does not apply: {e}"));
        let p2: Pod = serde_json::from_value(patched).expect("patched pod reads");
        let second = run(&p2, &research_ns());
        assert!(second.patch.is_empty(), "{}", patch_json(&second));
    }
}

#[test]
fn a_patch_operation_that_cannot_be_written_refuses_the_pod() {
    let mut b = Builder::default();
    b.add(&["metadata", "labels", "team"], "vision");
    // A map whose keys are not strings: the one value serde_json refuses to write.
    let unwritable: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
    b.add(&["spec", "nodeSelector"], &unwritable);
    b.add(&["spec", "priorityClassName"], "nightshift-research");
    let denial =
        finish(b, Classification::Research { gpu: true }).expect_err("refused, not marked in part");
    assert!(matches!(denial, Denial::Unwritable { .. }), "{denial:?}");
    assert!(
        denial.to_string().contains("add /spec/nodeSelector"),
        "{denial}"
    );
}
