//! Kubernetes label-selector semantics, to check which pods the webhook configuration selects.

use std::collections::BTreeMap;

use serde_json::Value;

pub type Labels = BTreeMap<String, String>;

/// Builds a label map from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Whether a `metav1.LabelSelector` (JSON) matches `labels`. An absent or empty selector matches
/// everything, as in the API server.
pub fn matches(selector: &Value, labels: &Labels) -> bool {
    if selector.is_null() {
        return true;
    }
    if let Some(match_labels) = selector["matchLabels"].as_object() {
        for (key, value) in match_labels {
            if labels.get(key).map(String::as_str) != value.as_str() {
                return false;
            }
        }
    }
    if let Some(expressions) = selector["matchExpressions"].as_array() {
        for expr in expressions {
            let key = expr["key"].as_str().expect("expression key");
            let values: Vec<&str> = expr["values"]
                .as_array()
                .map(|v| v.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let actual = labels.get(key).map(String::as_str);
            let ok = match expr["operator"].as_str().expect("operator") {
                "In" => actual.is_some_and(|a| values.contains(&a)),
                "NotIn" => actual.is_none_or(|a| !values.contains(&a)),
                "Exists" => actual.is_some(),
                "DoesNotExist" => actual.is_none(),
                other => panic!("unknown selector operator {other}"),
            };
            if !ok {
                return false;
            }
        }
    }
    true
}
