//! The source policy over real gRPC: refused sources are `PERMISSION_DENIED` from the first RPC
//! (GetMetricSpec) on, name the flag that would allow them and cause no upstream request; what
//! upstreams answer is not reflected beyond a bounded, single-line excerpt.

use std::time::Duration;

use nightshift::{
    scaler::service::proto::ScaledObjectRef,
    sources::policy::{Namespaces, SourcePolicy},
};
use tonic::Code;

use crate::{
    emulator::{Behaviour, Emulator},
    fake_prometheus::{FakePrometheus, Mode},
    harness::{ScalerUnderTest, get_metrics, scaled_object},
};

/// The shipped defaults: the platform Prometheus only, own namespace, no static endpoints, no
/// loopback or link-local addresses.
fn shipped() -> SourcePolicy {
    SourcePolicy {
        prometheus: vec!["http://prometheus.monitoring:9090".into()],
        ..SourcePolicy::default()
    }
}

async fn start(policy: SourcePolicy) -> ScalerUnderTest {
    ScalerUnderTest::start_with_policy(
        Duration::from_millis(10),
        Duration::from_millis(50),
        None,
        policy,
    )
    .await
}

/// Every RPC refuses `so` with PERMISSION_DENIED naming `flag`.
async fn expect_denied(s: &ScalerUnderTest, so: &ScaledObjectRef, flag: &str) {
    let mut c = s.client().await;
    let spec = c
        .get_metric_spec(so.clone())
        .await
        .expect_err("GetMetricSpec refuses");
    assert_eq!(spec.code(), Code::PermissionDenied, "{spec:?}");
    assert!(spec.message().contains(flag), "{flag}: {}", spec.message());
    let metrics = get_metrics(&mut c, so)
        .await
        .expect_err("GetMetrics refuses");
    assert_eq!(metrics.code(), Code::PermissionDenied, "{metrics:?}");
    let active = c.is_active(so.clone()).await.expect_err("IsActive refuses");
    assert_eq!(active.code(), Code::PermissionDenied, "{active:?}");
    let stream = c
        .stream_is_active(so.clone())
        .await
        .expect_err("StreamIsActive refuses");
    assert_eq!(stream.code(), Code::PermissionDenied, "{stream:?}");
}

#[tokio::test]
async fn the_defaults_refuse_every_dangerous_source_before_calling_it() {
    let prom = FakePrometheus::start(Mode::Values(1.0), 1).await;
    let pod = Emulator::start("llama", 1, false).await;
    let s = start(shipped()).await;
    let cases = [
        (
            vec![("serverAddress", prom.address())],
            "--scaler-allowed-prometheus",
        ),
        (
            vec![("serverAddress", "http://169.254.169.254/latest".into())],
            "--scaler-allowed-prometheus",
        ),
        (
            vec![("endpoints", pod.endpoint())],
            "--scaler-allow-endpoints",
        ),
        (
            vec![("service", "vllm".into()), ("namespace", "team-b".into())],
            "--scaler-scrape-namespaces",
        ),
    ];
    for (metadata, flag) in cases {
        let mut metadata: Vec<(&str, &str)> =
            metadata.iter().map(|(k, v)| (*k, v.as_str())).collect();
        metadata.push(("waitingTarget", "1"));
        expect_denied(&s, &scaled_object("llama", &metadata), flag).await;
    }
    assert_eq!(prom.queries(), 0, "a refused Prometheus is never queried");
}

#[tokio::test]
async fn allowing_one_thing_does_not_allow_the_next() {
    let prom = FakePrometheus::start(Mode::Values(2.0), 1).await;
    let pod = Emulator::start("llama", 1, false).await;
    // Prometheus listed by its loopback address: still refused without the loopback flag.
    let listed = SourcePolicy {
        prometheus: vec![prom.address()],
        endpoints: true,
        namespaces: Namespaces::Listed(vec!["team-b".into()]),
        ..SourcePolicy::default()
    };
    let s = start(listed.clone()).await;
    let from_prom = scaled_object(
        "llama",
        &[
            ("serverAddress", &prom.address()),
            ("waitingTarget", "1"),
            ("model", "model-0"),
        ],
    );
    expect_denied(&s, &from_prom, "--scaler-allow-loopback").await;
    let endpoints = scaled_object(
        "llama",
        &[("endpoints", &pod.endpoint()), ("waitingTarget", "1")],
    );
    expect_denied(&s, &endpoints, "--scaler-allow-loopback").await;
    let by_name = scaled_object(
        "llama",
        &[("endpoints", "vllm.team-a:8000"), ("waitingTarget", "1")],
    );
    expect_denied(&s, &by_name, "endpoints must be IP addresses").await;
    let metadata_service = scaled_object(
        "llama",
        &[("endpoints", "169.254.169.254:80"), ("waitingTarget", "1")],
    );
    expect_denied(&s, &metadata_service, "--scaler-allow-link-local").await;
    let elsewhere = scaled_object(
        "llama",
        &[
            ("service", "vllm"),
            ("namespace", "team-c"),
            ("waitingTarget", "1"),
        ],
    );
    expect_denied(&s, &elsewhere, "--scaler-scrape-namespaces").await;
    assert_eq!(prom.queries(), 0);
    drop(s);

    // With the loopback flag, the listed Prometheus and the endpoints are read.
    let s = start(SourcePolicy {
        loopback: true,
        ..listed
    })
    .await;
    let mut c = s.client().await;
    let v = get_metrics(&mut c, &from_prom).await.expect("allowed");
    assert!(v.metric_value_float > 0.0, "{v:?}");
    pod.set(0, |e| e.waiting = 3.0);
    let v = get_metrics(&mut c, &endpoints).await.expect("allowed");
    assert_eq!(v.metric_value, 300);
}

#[tokio::test]
async fn upstream_bodies_are_not_reflected() {
    let s = start(SourcePolicy::permissive()).await;
    let mut c = s.client().await;

    // A pod answering HTML: the error says what is wrong, not what it read.
    let pod = Emulator::start("llama", 1, false).await;
    pod.behave(Behaviour::Garbage);
    let so = scaled_object(
        "llama",
        &[("endpoints", &pod.endpoint()), ("waitingTarget", "1")],
    );
    let status = get_metrics(&mut c, &so).await.expect_err("garbage");
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        !status.message().contains("Bad Gateway") && !status.message().contains("<html>"),
        "{}",
        status.message()
    );

    // A Prometheus-shaped error carrying a large text: bounded and on one line.
    let reflected = format!("line one\nsecret-{}", "x".repeat(64 * 1024));
    let prom = FakePrometheus::start(Mode::LongError(reflected), 1).await;
    let so = scaled_object(
        "llama",
        &[
            ("serverAddress", &prom.address()),
            ("query", "up"),
            ("queryTarget", "1"),
        ],
    );
    let status = get_metrics(&mut c, &so).await.expect_err("rejected");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().len() < 1024, "{}", status.message().len());
    assert!(!status.message().contains('\n'), "{}", status.message());
    assert!(
        status.message().contains("line one"),
        "{}",
        status.message()
    );
}
