//! Admission review parsing and mutation. Invariants: no panic on any body; for a pod creation
//! the patch applies to the object exactly as the API server sent it; mutating the patched pod
//! again gives an empty patch.
#![no_main]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;
use nightshift::webhook::{
    mutate::{MutationPolicy, PriorityClassInfo, SparePlacement, mutate},
    pod_fields::AdmittedPod,
    review::{parse, pod_namespace},
};
use serde_json::Value;

/// The classes a cluster with nightshift's base manifests has, and one that would make research
/// pods preempt (which `mutate` must refuse to hand out).
fn classes() -> BTreeMap<String, PriorityClassInfo> {
    [
        ("nightshift-research", -1000, "Never"),
        ("nightshift-inference", 1_000_000, "PreemptLowerPriority"),
        ("low-but-preempting", -5000, "PreemptLowerPriority"),
    ]
    .into_iter()
    .map(|(name, value, policy)| {
        (
            name.to_string(),
            PriorityClassInfo {
                value,
                preemption_policy: policy.to_string(),
            },
        )
    })
    .collect()
}

/// The default policy, and one with every part switched on and the preferred spare placement.
fn policies() -> [MutationPolicy; 2] {
    let mut full = MutationPolicy::default();
    full.scheduler_name = Some("nightshift-packing".into());
    if let Some(spare) = full.spare.as_mut() {
        spare.placement = SparePlacement::Preferred { weight: 100 };
    }
    [MutationPolicy::default(), full]
}

fuzz_target!(|body: &[u8]| {
    let Ok(request) = parse(body) else { return };
    let Some(pod) = request.object.as_deref() else {
        return;
    };
    let Some(namespace) = pod_namespace(request.namespace.as_deref(), pod) else {
        return;
    };
    // A body the review's parse accepts (UTF-8 text, then JSON) is a JSON document.
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(body) {
        panic!("the review's parse accepted a body that is no JSON document: {e}");
    }
    // The object as sent: what the API server applies the patch to. A document with a number
    // beyond a float's range (`1e999`, in a field the review skips) is JSON but has no `Value`;
    // the API server never sends one (Go's encoder writes finite numbers only).
    let Ok(sent) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let sent = &sent["request"]["object"];
    // The API server always sends both (Go's `omitempty` never omits a struct); a patch for an
    // object without them has nothing to apply to, and the API server would refuse the pod.
    if !(sent["metadata"].is_object() && sent["spec"].is_object()) {
        return;
    }
    let research: BTreeMap<String, String> =
        [("nightshift.io/research".to_string(), "true".to_string())].into();
    let classes = classes();
    for policy in policies() {
        for labels in [&research, &BTreeMap::new()] {
            let Ok(first) = mutate(pod, namespace, labels, &policy, &classes) else {
                continue;
            };
            let operations = match first.patch.operations() {
                Ok(operations) => operations,
                Err(e) => panic!(
                    "the patch is not JSON Patch: {e}\npatch: {}",
                    first.patch.as_str()
                ),
            };
            let mut patched = sent.clone();
            if let Err(e) = json_patch::patch(&mut patched, &operations.0) {
                panic!(
                    "patch does not apply: {e}\npatch: {}\nobject: {sent}",
                    first.patch.as_str()
                );
            }
            // From JSON text, as the webhook reads a pod (its lists are skipped as raw text).
            let text = serde_json::to_string(&patched).expect("the patched pod serialises");
            let again = match AdmittedPod::from_json(&text) {
                Ok(again) => again,
                // A list entry of the wrong type (`"name": true`) in a list the first read
                // skipped as text, because it could not hold the notice entry, is read once the
                // patch adds that entry. Such a pod is no Pod: the API server decodes every pod
                // into its types before any webhook sees it, so it never sends one.
                Err(_) if serde_json::from_value::<Pod>(sent.clone()).is_err() => continue,
                Err(e) => panic!("the patched pod does not read back: {e}\npatched: {patched}"),
            };
            let second = mutate(&again, namespace, labels, &policy, &classes)
                .expect("a marked pod is not denied");
            assert!(
                second.patch.is_empty(),
                "second pass not empty: {}\npatched: {patched}",
                second.patch.as_str()
            );
        }
    }
});
