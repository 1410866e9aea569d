//! Every RPC over real gRPC against vLLM-metrics emulators scraped directly.

use std::time::Duration;

use nightshift::scaler::service::proto::{
    ScaledObjectRef, external_scaler_client::ExternalScalerClient,
};
use tonic::Code;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::{
    emulator::{Behaviour, Emulator},
    harness::{ScalerUnderTest, eventually, get_metrics, scaled_object},
};

/// Two pods: one new vLLM with two engines, one old vLLM (old KV-cache name), one engine.
async fn two_pods() -> (Emulator, Emulator) {
    let new = Emulator::start("llama", 2, false).await;
    new.set(0, |e| {
        e.waiting = 3.0;
        e.kv_cache = 0.5;
    });
    new.set(1, |e| {
        e.waiting = 1.0;
        e.kv_cache = 0.3;
    });
    let old = Emulator::start("llama", 1, true).await;
    old.set(0, |e| {
        e.waiting = 2.0;
        e.kv_cache = 0.8;
    });
    (new, old)
}

fn scrape_trigger(endpoints: &str, extra: &[(&'static str, &'static str)]) -> ScaledObjectRef {
    let mut meta = vec![("endpoints", endpoints), ("model", "llama")];
    meta.extend_from_slice(extra);
    scaled_object("llama", &meta)
}

#[tokio::test]
async fn metric_spec_has_a_fixed_non_zero_target_in_both_fields() {
    let s = ScalerUnderTest::start(Duration::from_millis(100)).await;
    let mut c = s.client().await;
    let so = scrape_trigger("127.0.0.1:1", &[("waitingTarget", "5")]);
    let spec = c.get_metric_spec(so).await.expect("spec").into_inner();
    assert_eq!(spec.metric_specs.len(), 1);
    assert_eq!(spec.metric_specs[0].metric_name, "vllm-demand");
    assert_eq!(spec.metric_specs[0].target_size, 100);
    assert_eq!(spec.metric_specs[0].target_size_float, 100.0);
}

#[tokio::test]
async fn demand_sums_engines_and_pods_and_reads_old_names() {
    let (new, old) = two_pods().await;
    let s = ScalerUnderTest::start(Duration::from_millis(100)).await;
    let mut c = s.client().await;
    let endpoints = format!("{},{}", new.endpoint(), old.endpoint());
    let so = scaled_object(
        "llama",
        &[
            ("endpoints", &endpoints),
            ("model", "llama"),
            ("waitingTarget", "4"),
            ("kvCacheTarget", "0.6"),
        ],
    );
    // waiting 3+1+2 = 6 → 1.5 replicas; KV (0.5+0.3)/2 + 0.8 = 1.2 → 2 replicas: KV drives.
    let v = get_metrics(&mut c, &so).await.expect("metrics");
    assert!((v.metric_value_float - 200.0).abs() < 1e-6, "{v:?}");
    assert_eq!(v.metric_value, 200);
    let explained = s
        .scaler
        .decisions()
        .get("team-a", "llama")
        .expect("explained");
    assert_eq!(explained.driver, Some("kvCache"));
    assert_eq!(explained.pods, Some(2));
    let waiting = explained
        .terms
        .iter()
        .find(|t| t.signal == "waiting")
        .expect("waiting term");
    assert_eq!(
        (waiting.raw, waiting.target, waiting.ratio),
        (6.0, 4.0, 1.5)
    );
    assert!(c.is_active(so).await.expect("active").into_inner().result);
}

#[tokio::test]
async fn demand_follows_values_changed_during_the_test() {
    let (new, old) = two_pods().await;
    let s = ScalerUnderTest::start(Duration::from_millis(50)).await;
    let mut c = s.client().await;
    let so = scrape_trigger(
        &format!("{},{}", new.endpoint(), old.endpoint()),
        &[("waitingTarget", "2")],
    );
    assert_eq!(
        get_metrics(&mut c, &so)
            .await
            .expect("metrics")
            .metric_value,
        300
    );
    new.set(0, |e| e.waiting = 13.0);
    eventually(
        Duration::from_secs(5),
        "demand to rise to 8 replicas",
        || {
            let (mut c, so) = (c.clone(), so.clone());
            async move { (get_metrics(&mut c, &so).await.ok()?.metric_value == 800).then_some(()) }
        },
    )
    .await;
    for e in [&new, &old] {
        e.set(0, |e| e.waiting = 0.0);
    }
    new.set(1, |e| e.waiting = 0.0);
    eventually(Duration::from_secs(5), "demand to fall to zero", || {
        let (mut c, so) = (c.clone(), so.clone());
        async move { (get_metrics(&mut c, &so).await.ok()?.metric_value == 0).then_some(()) }
    })
    .await;
    assert!(!c.is_active(so).await.expect("active").into_inner().result);
}

#[tokio::test]
async fn generation_token_rates_come_from_counters() {
    let pod = Emulator::start("llama", 2, false).await;
    let s = ScalerUnderTest::start(Duration::from_millis(50)).await;
    let c = s.client().await;
    let so = scrape_trigger(
        &pod.endpoint(),
        &[("generationTokensTarget", "100"), ("rateWindow", "1s")],
    );
    // Each engine produces 1000 tokens/s of wall-clock time: 2000 tokens/s for the pod.
    let start = std::time::Instant::now();
    let bump = || {
        let t = start.elapsed().as_secs_f64();
        for engine in 0..2 {
            pod.set(engine, |e| e.generation_tokens_total = 1000.0 * t);
        }
    };
    eventually(Duration::from_secs(15), "a token rate near 2000/s", || {
        bump();
        let (mut c, so) = (c.clone(), so.clone());
        async move {
            let v = get_metrics(&mut c, &so).await.ok()?;
            // 2000 tokens/s over a target of 100 → 20 replicas → 2000.
            (v.metric_value_float > 1700.0 && v.metric_value_float < 2300.0).then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn prompt_token_rates_come_from_their_own_counters() {
    let pod = Emulator::start("llama", 2, false).await;
    let s = ScalerUnderTest::start(Duration::from_millis(50)).await;
    let c = s.client().await;
    let so = scrape_trigger(
        &pod.endpoint(),
        &[("promptTokensTarget", "1000"), ("rateWindow", "1s")],
    );
    // Each engine reads 4000 prompt tokens/s and generates 10/s: 8000 prompt tokens/s for the
    // pod, which the generated counter must not dilute.
    let start = std::time::Instant::now();
    let bump = || {
        let t = start.elapsed().as_secs_f64();
        for engine in 0..2 {
            pod.set(engine, |e| {
                e.prompt_tokens_total = 4000.0 * t;
                e.generation_tokens_total = 10.0 * t;
            });
        }
    };
    eventually(Duration::from_secs(15), "a prompt rate near 8000/s", || {
        bump();
        let (mut c, so) = (c.clone(), so.clone());
        async move {
            let v = get_metrics(&mut c, &so).await.ok()?;
            // 8000 tokens/s over a target of 1000 → 8 replicas → 800.
            (v.metric_value_float > 700.0 && v.metric_value_float < 900.0).then_some(())
        }
    })
    .await;
    let explained = s
        .scaler
        .decisions()
        .get("team-a", "llama")
        .expect("explained");
    assert_eq!(explained.driver, Some("promptTokens"));
    assert!(
        explained.terms.iter().any(|t| t.signal == "promptTokens"),
        "{explained:?}"
    );
}

#[tokio::test]
async fn is_active_respects_the_activation_threshold() {
    let pod = Emulator::start("llama", 1, false).await;
    pod.set(0, |e| e.waiting = 3.0);
    let s = ScalerUnderTest::start(Duration::from_millis(10)).await;
    let mut c = s.client().await;
    // 3 waiting / 2 per replica = 1.5 replicas.
    let low = scrape_trigger(
        &pod.endpoint(),
        &[("waitingTarget", "2"), ("activationThreshold", "1")],
    );
    let high = scrape_trigger(
        &pod.endpoint(),
        &[("waitingTarget", "2"), ("activationThreshold", "2")],
    );
    assert!(c.is_active(low).await.expect("ok").into_inner().result);
    assert!(!c.is_active(high).await.expect("ok").into_inner().result);
}

#[tokio::test]
async fn stream_is_active_sends_only_transitions() {
    let pod = Emulator::start("llama", 1, false).await;
    let s = ScalerUnderTest::start_with(Duration::from_millis(5), Duration::from_millis(20), None)
        .await;
    let mut c = s.client().await;
    let so = scrape_trigger(&pod.endpoint(), &[("waitingTarget", "2")]);
    let mut stream = c.stream_is_active(so).await.expect("stream").into_inner();
    let first = stream.message().await.expect("ok").expect("a first state");
    assert!(!first.result);
    // Many evaluations happen; none is sent while nothing changes.
    let quiet = tokio::time::timeout(Duration::from_millis(300), stream.message()).await;
    assert!(quiet.is_err(), "unexpected message while idle: {quiet:?}");
    pod.set(0, |e| e.waiting = 5.0);
    let next = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("transition in time")
        .expect("ok")
        .expect("message");
    assert!(next.result);
    let quiet = tokio::time::timeout(Duration::from_millis(300), stream.message()).await;
    assert!(quiet.is_err(), "repeated true was sent: {quiet:?}");
    pod.set(0, |e| e.waiting = 0.0);
    let back = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("transition in time")
        .expect("ok")
        .expect("message");
    assert!(!back.result);
}

#[tokio::test]
async fn stream_metric_spec_is_unimplemented_so_keda_falls_back() {
    let s = ScalerUnderTest::start(Duration::from_millis(10)).await;
    let mut c = s.client().await;
    let err = c
        .stream_metric_spec(scrape_trigger("127.0.0.1:1", &[("waitingTarget", "1")]))
        .await
        .expect_err("unimplemented");
    assert_eq!(err.code(), Code::Unimplemented);
}

#[tokio::test]
async fn health_service_reports_the_scaler_serving() {
    let s = ScalerUnderTest::start(Duration::from_millis(10)).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", s.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel);
    for service in ["", "externalscaler.ExternalScaler"] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health")
            .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
}

#[tokio::test]
async fn malformed_metadata_is_invalid_argument_naming_the_key() {
    let s = ScalerUnderTest::start(Duration::from_millis(10)).await;
    let mut c = s.client().await;
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("endpoints", "127.0.0.1:1"), ("waitingTarget", "-3")],
            "waitingTarget",
        ),
        (
            &[
                ("endpoints", "127.0.0.1:1"),
                ("waitingTarget", "1"),
                ("colour", "blue"),
            ],
            "colour",
        ),
        (
            &[("endpoints", "nowhere"), ("waitingTarget", "1")],
            "endpoints",
        ),
        (&[("waitingTarget", "1")], "serverAddress"),
    ];
    for (meta, key) in cases {
        let so = scaled_object("bad", meta);
        for status in [
            c.get_metric_spec(so.clone()).await.expect_err("spec"),
            get_metrics(&mut c, &so).await.expect_err("metrics"),
            c.is_active(so.clone()).await.expect_err("active"),
            c.stream_is_active(so.clone()).await.expect_err("stream"),
        ] {
            assert_eq!(status.code(), Code::InvalidArgument, "{meta:?}: {status:?}");
            assert!(
                status.message().contains(key),
                "{meta:?}: {}",
                status.message()
            );
        }
    }
}

async fn expect_error(
    c: &mut ExternalScalerClient<tonic::transport::Channel>,
    so: &ScaledObjectRef,
    code: Code,
) -> String {
    let status = get_metrics(c, so)
        .await
        .expect_err("an error, never a zero");
    assert_eq!(status.code(), code, "{status:?}");
    let active = c
        .is_active(so.clone())
        .await
        .expect_err("IsActive errors too");
    assert_eq!(active.code(), code);
    status.message().to_string()
}

#[tokio::test]
async fn unreachable_slow_broken_and_garbage_pods_are_errors_not_zeros() {
    let s = ScalerUnderTest::start(Duration::from_millis(1)).await;
    let mut c = s.client().await;
    // Nothing listens on a port we bound and released.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").to_string()
    };
    let msg = expect_error(
        &mut c,
        &scrape_trigger(&closed, &[("waitingTarget", "1")]),
        Code::Unavailable,
    )
    .await;
    assert!(msg.contains(&closed), "{msg}");

    let pod = Emulator::start("llama", 1, false).await;
    let so = scrape_trigger(
        &pod.endpoint(),
        &[("waitingTarget", "1"), ("timeout", "200ms")],
    );
    pod.behave(Behaviour::Slow(Duration::from_secs(3)));
    let started = std::time::Instant::now();
    expect_error(&mut c, &so, Code::DeadlineExceeded).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "timeout not applied"
    );
    // The short timeout only where the slow answer is under test: elsewhere a paused machine
    // must not turn the expected error into a timeout.
    let so = scrape_trigger(
        &pod.endpoint(),
        &[("waitingTarget", "1"), ("timeout", "10s")],
    );
    pod.behave(Behaviour::Garbage);
    tokio::time::sleep(Duration::from_millis(5)).await;
    expect_error(&mut c, &so, Code::Internal).await;
    pod.behave(Behaviour::ServerError);
    tokio::time::sleep(Duration::from_millis(5)).await;
    expect_error(&mut c, &so, Code::Unavailable).await;
    pod.behave(Behaviour::Normal);
    eventually(Duration::from_secs(15), "recovery", || {
        let (mut c, so) = (c.clone(), so.clone());
        async move { get_metrics(&mut c, &so).await.ok() }
    })
    .await;

    // One good pod and one dead pod: the good pod alone would under-report.
    let msg = expect_error(
        &mut c,
        &scrape_trigger(
            &format!("{},{closed}", pod.endpoint()),
            &[("waitingTarget", "1")],
        ),
        Code::Unavailable,
    )
    .await;
    assert!(msg.contains(&closed), "{msg}");
}

#[tokio::test]
async fn a_missing_model_is_an_error_unless_empty_means_zero() {
    let pod = Emulator::start("llama", 1, false).await;
    let s = ScalerUnderTest::start(Duration::from_millis(10)).await;
    let mut c = s.client().await;
    let missing = scaled_object(
        "qwen",
        &[
            ("endpoints", &pod.endpoint()),
            ("model", "qwen"),
            ("waitingTarget", "1"),
        ],
    );
    let msg = expect_error(&mut c, &missing, Code::NotFound).await;
    assert!(msg.contains("emptyResult"), "{msg}");
    let zero = scaled_object(
        "qwen",
        &[
            ("endpoints", &pod.endpoint()),
            ("model", "qwen"),
            ("waitingTarget", "1"),
            ("emptyResult", "zero"),
        ],
    );
    assert_eq!(
        get_metrics(&mut c, &zero).await.expect("zero").metric_value,
        0
    );
}

#[tokio::test]
async fn service_discovery_without_a_cluster_is_a_failed_precondition() {
    let s = ScalerUnderTest::start(Duration::from_millis(10)).await;
    let mut c = s.client().await;
    let so = scaled_object(
        "llama",
        &[("service", "llama-vllm"), ("waitingTarget", "1")],
    );
    let msg = expect_error(&mut c, &so, Code::FailedPrecondition).await;
    assert!(msg.contains("endpoints"), "{msg}");
}

#[tokio::test]
async fn requests_and_demand_are_exported_as_metrics() {
    let pod = Emulator::start("llama", 1, false).await;
    pod.set(0, |e| e.waiting = 4.0);
    let s = ScalerUnderTest::start(Duration::from_millis(10)).await;
    let mut c = s.client().await;
    let so = scrape_trigger(&pod.endpoint(), &[("waitingTarget", "2")]);
    get_metrics(&mut c, &so).await.expect("metrics");
    let _ = c
        .is_active(scrape_trigger(&pod.endpoint(), &[("waitingTarget", "x")]))
        .await;
    let text = s.metrics_text();
    for expected in [
        r#"nightshift_scaler_requests_total{rpc="GetMetrics",code="Ok"} 1"#,
        r#"nightshift_scaler_requests_total{rpc="IsActive",code="InvalidArgument"} 1"#,
        r#"nightshift_scaler_demand_replicas{namespace="team-a",scaled_object="llama"} 2.0"#,
        r#"nightshift_scaler_upstream_request_duration_seconds_count{source="scrape",family="all",outcome="ok"}"#,
    ] {
        assert!(text.contains(expected), "missing {expected} in:\n{text}");
    }
}
