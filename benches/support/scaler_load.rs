//! The scaler load the scaler benchmarks share: one ScaledObject per model, reading a
//! Prometheus stand-in that answers every query with two pods per model.

use std::{collections::HashMap, net::SocketAddr};

use nightshift::scaler::service::proto::{GetMetricsRequest, ScaledObjectRef};

/// The Prometheus answer for `models` models, two pods each, every series at 0.5.
pub fn prometheus_answer(models: usize) -> String {
    let items: Vec<String> = (0..models)
        .flat_map(|m| {
            (0..2).map(move |p| {
                format!(
                    r#"{{"metric":{{"namespace":"bench","model_name":"model-{m}","pod":"pod-{m}-{p}"}},"value":[1700000000.0,"0.5"]}}"#
                )
            })
        })
        .collect();
    format!(
        r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
        items.join(",")
    )
}

/// KEDA's `GetMetrics` for ScaledObject `i`, reading model `i` from the Prometheus at `prom`.
pub fn request(prom: SocketAddr, i: usize) -> GetMetricsRequest {
    let meta: HashMap<String, String> = [
        ("serverAddress", format!("http://{prom}")),
        ("model", format!("model-{i}")),
        ("waitingTarget", "2".into()),
        ("kvCacheTarget", "0.8".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    GetMetricsRequest {
        scaled_object_ref: Some(ScaledObjectRef {
            name: format!("so-{i}"),
            namespace: "bench".into(),
            scaler_metadata: meta,
        }),
        metric_name: "vllm-demand".into(),
    }
}
