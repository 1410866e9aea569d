//! The gRPC listener's limits, each exceeded over loopback with small values.

use std::time::Duration;

use nightshift::{scaler::service::Limits, sources::policy::SourcePolicy};
use tonic::Code;

use crate::{
    emulator::Emulator,
    harness::{ScalerUnderTest, scaled_object},
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
