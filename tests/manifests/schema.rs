//! Schema check without a cluster: every built-in object the manifests render is read as its
//! `k8s-openapi` type and written back. A field that does not exist in the API (a typo, a field
//! at the wrong level) or has the wrong type is lost or rejected on the way, and reported with its
//! path. Custom resources (KEDA, cert-manager, Argo, Prometheus operator) are left to the
//! end-to-end suite's server-side dry-run.

use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

/// Round-trips `object` through the typed API struct for its kind. `None` for kinds this check
/// does not know (custom resources); `Some(errors)` otherwise.
pub fn check(object: &Value) -> Option<Vec<String>> {
    use k8s_openapi::api::{
        admissionregistration::v1 as admission, apps::v1 as apps, batch::v1 as batch,
        core::v1 as core, networking::v1 as networking, policy::v1 as policy, rbac::v1 as rbac,
        scheduling::v1 as scheduling,
    };
    let kind = object["kind"].as_str()?;
    let api_version = object["apiVersion"].as_str()?;
    let errors = match (api_version, kind) {
        ("v1", "Namespace") => round_trip::<core::Namespace>(object),
        ("v1", "ServiceAccount") => round_trip::<core::ServiceAccount>(object),
        ("v1", "Service") => round_trip::<core::Service>(object),
        ("v1", "Secret") => round_trip::<core::Secret>(object),
        ("v1", "ConfigMap") => round_trip::<core::ConfigMap>(object),
        ("apps/v1", "Deployment") => round_trip::<apps::Deployment>(object),
        ("batch/v1", "Job") => round_trip::<batch::Job>(object),
        ("policy/v1", "PodDisruptionBudget") => round_trip::<policy::PodDisruptionBudget>(object),
        ("networking.k8s.io/v1", "NetworkPolicy") => {
            round_trip::<networking::NetworkPolicy>(object)
        }
        ("scheduling.k8s.io/v1", "PriorityClass") => {
            round_trip::<scheduling::PriorityClass>(object)
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<rbac::ClusterRole>(object),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round_trip::<rbac::ClusterRoleBinding>(object)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<rbac::Role>(object),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<rbac::RoleBinding>(object),
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
            round_trip::<admission::MutatingWebhookConfiguration>(object)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            round_trip::<admission::ValidatingAdmissionPolicy>(object)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            round_trip::<admission::ValidatingAdmissionPolicyBinding>(object)
        }
        _ => return None,
    };
    Some(errors)
}

fn round_trip<T: DeserializeOwned + Serialize>(object: &Value) -> Vec<String> {
    let typed: T = match serde_json::from_value(unwrap_base64(object)) {
        Ok(typed) => typed,
        Err(e) => return vec![format!("does not deserialize: {e}")],
    };
    let back = serde_json::to_value(&typed).expect("typed objects serialize");
    let mut errors = Vec::new();
    lost_fields(object, &back, "", &mut errors);
    errors
}

/// Paths present in `original` but missing or different in `back`.
fn lost_fields(original: &Value, back: &Value, path: &str, errors: &mut Vec<String>) {
    match (original, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let here = format!("{path}.{key}");
                match b.get(key) {
                    Some(other) => lost_fields(value, other, &here, errors),
                    None => errors.push(format!("{here}: not a field of the API type")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                lost_fields(x, y, &format!("{path}[{i}]"), errors);
            }
        }
        // Base64 fields (Secret data, caBundle) come back without kustomize's line breaks.
        (Value::String(a), Value::String(b)) if a.split_whitespace().collect::<String>() == *b => {}
        (a, b) if a == b => {}
        (a, b) => errors.push(format!("{path}: {a} came back as {b}")),
    }
}

/// kustomize wraps long base64 values (Secret data, a caBundle copied from it) over several
/// lines. The API server's decoder (Go's encoding/base64) skips line breaks; k8s-openapi's does
/// not, so they are removed before the typed read.
fn unwrap_base64(object: &Value) -> Value {
    let mut object = object.clone();
    let unwrap = |v: &mut Value| {
        if let Some(s) = v.as_str() {
            *v = Value::String(s.split_whitespace().collect());
        }
    };
    if object["kind"] == "Secret"
        && let Some(map) = object.get_mut("data").and_then(Value::as_object_mut)
    {
        map.values_mut().for_each(unwrap);
    }
    if let Some(webhooks) = object.get_mut("webhooks").and_then(Value::as_array_mut) {
        for webhook in webhooks {
            if let Some(bundle) = webhook.pointer_mut("/clientConfig/caBundle") {
                unwrap(bundle);
            }
        }
    }
    object
}
