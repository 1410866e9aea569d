//! The fuzz targets' checks (docs/fuzzing.md, "Targets"): one function per target, named as the
//! target, that parses one input and panics where an invariant fails. Each target in
//! `fuzz/fuzz_targets/` calls its function on the bytes libFuzzer makes; `tests/fuzz.rs` calls it
//! on every committed seed, so the same checks run in every `cargo test` on the stable
//! toolchain. An input outside a target's domain (not UTF-8, refused by the parser) returns
//! without a check.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use prometheus_http_query::response::PromqlResult;
use serde::Deserialize;
use serde_json::Value;

use crate::{
    scaler::metadata::{self, Table},
    sim::{
        config::Scenario,
        trace::{Arrivals, Envelope, Trace},
    },
    sources::{
        Selection, exposition,
        prometheus::{Auth, Labels, Server, index_from, single_value},
    },
    webhook::{
        mutate::{MutationPolicy, PriorityClassInfo, SparePlacement, mutate},
        pod_fields::AdmittedPod,
        review::{self, pod_namespace},
    },
};

/// Admission review parsing and mutation: [`review::parse`], then [`mutate`] on the pod with
/// two policies, in a research namespace and a plain one. Invariants: no panic on any body; for
/// a pod the patch applies to the object exactly as the API server sent it; mutating the
/// patched pod again gives an empty patch.
pub fn admission(body: &[u8]) {
    let Ok(request) = review::parse(body) else {
        return;
    };
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
    let classes = admission_classes();
    for policy in admission_policies() {
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
}

/// The classes a cluster with nightshift's base manifests has, and one that would make research
/// pods preempt (which `mutate` must refuse to hand out).
fn admission_classes() -> BTreeMap<String, PriorityClassInfo> {
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
fn admission_policies() -> [MutationPolicy; 2] {
    let mut full = MutationPolicy {
        scheduler_name: Some("nightshift-packing".into()),
        ..MutationPolicy::default()
    };
    if let Some(spare) = full.spare.as_mut() {
        spare.placement = SparePlacement::Preferred { weight: 100 };
    }
    [MutationPolicy::default(), full]
}

/// Prometheus exposition text as scraped from vLLM pods ([`exposition::parse`]), without and
/// with a label matcher. Invariants: no panic; every reading returned is finite and
/// non-negative.
pub fn exposition(body: &[u8]) {
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let matchers = [
        vec![],
        vec![(
            "model_name".to_string(),
            "meta-llama/Llama-3.1-8B-Instruct".to_string(),
        )],
    ];
    for m in &matchers {
        if let Ok(readings) = exposition::parse(text, m) {
            for r in readings.values() {
                for v in [r.waiting, r.running, r.kv_cache, r.generation_tokens_total]
                    .into_iter()
                    .flatten()
                {
                    assert!(v.is_finite() && v >= 0.0, "{r:?}");
                }
            }
        }
    }
}

/// The API's envelope (`{"status": "success", "data": …}`), as the client library reads it
/// before handing `data` over.
#[derive(Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
enum PrometheusAnswer {
    Success { data: PromqlResult },
    Error {},
}

/// A Prometheus HTTP API answer (`/api/v1/query`): the client library's decoding of the JSON
/// envelope and result, then nightshift's reading of it for family queries ([`index_from`]) and
/// raw queries ([`single_value`]). Invariants: no panic; accepted values, and their sum over
/// every model, are finite and non-negative.
pub fn prometheus_answer(body: &[u8]) {
    let Ok(PrometheusAnswer::Success { data }) = serde_json::from_slice::<PrometheusAnswer>(body)
    else {
        return;
    };
    let server = Server {
        address: "http://127.0.0.1:9090".into(),
        auth: Auth::None,
        headers: Vec::new(),
        ca_cert: None,
        unsafe_ssl: false,
        timeout: Duration::from_secs(1),
    };
    let labels = Labels {
        namespace_label: "namespace".into(),
        pod_label: "pod".into(),
        matchers: Vec::new(),
    };
    let (data, _stats) = data.into_inner();
    if let Ok(index) = index_from(&server, &labels, data.clone()) {
        let all = Selection {
            namespace: None,
            model: None,
        };
        if let Some(sum) = index.select(&all) {
            assert!(sum.total.is_finite() && sum.total >= 0.0, "{sum:?}");
        }
    }
    if let Ok(Some(v)) = single_value(&server, "q", data) {
        assert!(v.is_finite() && v >= 0.0, "{v}");
    }
}

/// A ScaledObject trigger's metadata as KEDA passes it ([`metadata::parse`]). The input is the
/// ScaledObject's namespace on the first line, then one `key: value` per line (the YAML of a
/// trigger's `metadata`). Invariants: no panic; parsing is deterministic.
pub fn trigger_metadata(body: &[u8]) {
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let mut lines = text.lines();
    let namespace = lines.next().unwrap_or_default();
    let raw: Table = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let first = metadata::parse(&raw, namespace);
    assert_eq!(first, metadata::parse(&raw, namespace));
}

/// Arrivals [`trace_csv`] draws from each accepted trace: enough to wrap around a short trace a
/// few times.
const TRACE_REPLAYED: usize = 64;

/// A request trace (CSV: TIMESTAMP, ContextTokens, GeneratedTokens; [`Trace::parse`]), then
/// arrivals replayed from it. Invariants: no panic; a parsed trace is ordered with finite
/// offsets, and replaying it gives finite, ordered arrival times.
pub fn trace_csv(body: &[u8]) {
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let Ok(trace) = Trace::parse(text) else {
        return;
    };
    assert!(!trace.requests.is_empty());
    assert!(trace.span.is_finite() && trace.span >= 0.0);
    assert!(
        trace
            .requests
            .windows(2)
            .all(|w| w[0].offset <= w[1].offset)
    );
    let envelope = Envelope::new(&[1.0; 24]).expect("a flat envelope is valid");
    let mut last = 0.0;
    for a in Arrivals::new(&trace, &envelope, 7).take(TRACE_REPLAYED) {
        assert!(a.at.is_finite() && a.at >= last, "{a:?} after {last}");
        last = a.at;
    }
}

/// A simulator scenario (TOML; [`Scenario::from_toml`] and [`Scenario::validate`]). Invariants:
/// no panic in reading or validating; a scenario read back from its own rendering renders the
/// same (compared as text: NaN is a valid TOML float).
pub fn scenario_toml(body: &[u8]) {
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let Ok(scenario) = Scenario::from_toml(text) else {
        return;
    };
    let _ = scenario.validate();
    let rendered = scenario.to_toml();
    let back = Scenario::from_toml(&rendered)
        .unwrap_or_else(|e| panic!("rendered scenario does not read back: {e}\n{rendered}"));
    assert_eq!(back.to_toml(), rendered);
}
