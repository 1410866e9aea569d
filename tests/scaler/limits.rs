//! The gRPC listener's limits, each exceeded over loopback with small values.

use std::{sync::Arc, time::Duration};

use nightshift::{
    runtime::listen::silent_http2, scaler::service::Limits, sources::policy::SourcePolicy,
};
use tokio::sync::Semaphore;
use tonic::Code;

use crate::{
    emulator::Emulator,
    fake_prometheus::{FakePrometheus, Mode},
    harness::{ScalerUnderTest, eventually, get_metrics, scaled_object},
};

/// How long a waiting call is watched to show it does not get through.
const HELD: Duration = Duration::from_millis(400);
/// Bound on anything that must happen.
const DEADLINE: Duration = Duration::from_secs(10);

async fn start(change: impl FnOnce(&mut Limits)) -> ScalerUnderTest {
    let mut limits = Limits::default();
    change(&mut limits);
    ScalerUnderTest::start_full(
        Duration::from_millis(10),
        Duration::from_millis(50),
        None,
        SourcePolicy::permissive(),
        limits,
    )
    .await
}

#[tokio::test]
async fn oversized_messages_are_refused() {
    let s = start(|l| l.max_message_bytes = 64 * 1024).await;
    let mut c = s.client().await;
    let big = "x".repeat(128 * 1024);
    let so = scaled_object("llama", &[("endpoints", "10.0.0.7:8000"), ("model", &big)]);
    let status = c.get_metric_spec(so).await.expect_err("too large");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    // The connection stays usable for a normal request.
    let so = scaled_object(
        "llama",
        &[("endpoints", "10.0.0.7:8000"), ("waitingTarget", "1")],
    );
    c.get_metric_spec(so).await.expect("a normal request");
}

#[tokio::test]
async fn connections_above_the_cap_wait_until_one_closes() {
    let s = start(|l| l.max_connections = 1).await;
    let so = scaled_object(
        "llama",
        &[("endpoints", "10.0.0.7:8000"), ("waitingTarget", "1")],
    );
    let mut first = s.client().await;
    first.get_metric_spec(so.clone()).await.expect("first");
    let mut second = s.client().await;
    let waiting = second.get_metric_spec(so.clone());
    tokio::pin!(waiting);
    assert!(
        tokio::time::timeout(HELD, &mut waiting).await.is_err(),
        "a second connection was served while the only place was taken"
    );
    drop(first);
    tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("served once the first connection closed")
        .expect("answer");
}

#[tokio::test]
async fn streams_above_the_cap_wait_until_one_ends() {
    let pod = Emulator::start("llama", 1, false).await;
    let s = start(|l| l.max_streams = 1).await;
    let so = scaled_object(
        "llama",
        &[("endpoints", &pod.endpoint()), ("waitingTarget", "1")],
    );
    let mut c = s.client().await;
    let open = c
        .stream_is_active(so.clone())
        .await
        .expect("first stream")
        .into_inner();
    let mut c2 = c.clone();
    let waiting = c2.get_metric_spec(so.clone());
    tokio::pin!(waiting);
    assert!(
        tokio::time::timeout(HELD, &mut waiting).await.is_err(),
        "a second stream ran while the only one was taken"
    );
    drop(open);
    tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("served once the stream ended")
        .expect("answer");
}

/// A trigger reading `model-0` from `prom`, with an upstream timeout far above the RPC limits
/// these tests set, so that only the listener's limits can end a call.
fn held_trigger(prom: &FakePrometheus) -> nightshift::scaler::service::proto::ScaledObjectRef {
    scaled_object(
        "held",
        &[
            ("serverAddress", &prom.address()),
            ("model", "model-0"),
            ("waitingTarget", "1"),
            ("timeout", "30s"),
        ],
    )
}

#[tokio::test]
async fn rpcs_above_the_per_connection_cap_wait_until_one_ends() {
    let gate = Arc::new(Semaphore::new(0));
    let prom = FakePrometheus::start(Mode::Held(gate.clone()), 1).await;
    let s = start(|l| l.concurrency_per_connection = 1).await;
    let c = s.client().await;
    let first = tokio::spawn({
        let (mut c, so) = (c.clone(), held_trigger(&prom));
        async move { get_metrics(&mut c, &so).await }
    });
    eventually(DEADLINE, "the first RPC reading Prometheus", || async {
        (prom.queries() == 1).then_some(())
    })
    .await;
    let spec = scaled_object(
        "llama",
        &[("endpoints", "10.0.0.7:8000"), ("waitingTarget", "1")],
    );
    // A second RPC on the same connection waits behind the one in evaluation…
    let mut second = tokio::spawn({
        let (mut c, spec) = (c.clone(), spec.clone());
        async move { c.get_metric_spec(spec).await }
    });
    // …while another connection is served: the cap is per connection.
    let mut other = s.client().await;
    tokio::time::timeout(DEADLINE, other.get_metric_spec(spec))
        .await
        .expect("another connection answered in time")
        .expect("answer");
    assert!(
        tokio::time::timeout(HELD, &mut second).await.is_err(),
        "a second RPC was evaluated while the connection's only place was taken"
    );
    gate.add_permits(1);
    tokio::time::timeout(DEADLINE, second)
        .await
        .expect("served once the first RPC ended")
        .expect("task")
        .expect("answer");
    let value = tokio::time::timeout(DEADLINE, first)
        .await
        .expect("the first RPC answered")
        .expect("task")
        .expect("metrics");
    // Two pods with 1.0 waiting each, a target of 1 per replica: 2 replicas, 100 each.
    assert_eq!(value.metric_value, 200);
}

#[tokio::test]
async fn an_rpc_slower_than_the_rpc_timeout_is_cancelled_never_answered_with_zero() {
    let prom = FakePrometheus::start(Mode::Held(Arc::new(Semaphore::new(0))), 1).await;
    // Long enough that the call reaches the source before it is cancelled, even on a paused
    // machine; short next to `DEADLINE`.
    let limit = Duration::from_secs(1);
    let s = start(|l| l.rpc_timeout = limit).await;
    let mut c = s.client().await;
    let started = std::time::Instant::now();
    let status = tokio::time::timeout(DEADLINE, get_metrics(&mut c, &held_trigger(&prom)))
        .await
        .expect("an answer in time")
        .expect_err("no demand without a reading");
    assert_eq!(status.code(), Code::Cancelled, "{status:?}");
    assert!(started.elapsed() >= limit, "{:?}", started.elapsed());
    assert_eq!(prom.queries(), 1, "the source was asked");
    // The connection still serves.
    let spec = scaled_object(
        "llama",
        &[("endpoints", "10.0.0.7:8000"), ("waitingTarget", "1")],
    );
    c.get_metric_spec(spec).await.expect("a quick request");
}

#[tokio::test]
async fn an_http2_peer_that_does_not_answer_pings_is_closed() {
    let s = start(|l| {
        l.keep_alive_interval = Duration::from_millis(100);
        l.keep_alive_timeout = Duration::from_millis(100);
    })
    .await;
    let tcp = tokio::net::TcpStream::connect(s.addr)
        .await
        .expect("connect");
    let seen = silent_http2::watch(tcp, DEADLINE).await;
    assert_eq!(
        seen,
        silent_http2::Observed {
            pinged: true,
            closed: true
        }
    );
}
