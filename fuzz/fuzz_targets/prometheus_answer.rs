//! A Prometheus HTTP API answer (`/api/v1/query`): the client library's decoding of the JSON
//! envelope and result, then nightshift's reading of it for family queries and raw queries.
//! Invariants: no panic; accepted values, and their sum over every model, are finite and
//! non-negative.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use nightshift::sources::{
    Selection,
    prometheus::{Auth, Labels, Server, index_from, single_value},
};
use prometheus_http_query::response::PromqlResult;
use serde::Deserialize;

/// The API's envelope (`{"status": "success", "data": …}`), as the client library reads it
/// before handing `data` over.
#[derive(Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
enum Answer {
    Success { data: PromqlResult },
    Error {},
}

fuzz_target!(|body: &[u8]| {
    let Ok(Answer::Success { data }) = serde_json::from_slice::<Answer>(body) else {
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
});
