//! The webhook listener's limits, each exceeded over loopback with small values: connections
//! and handshakes above their caps wait (they are not refused), slow handshakes, headers and
//! bodies are cut off.

use std::{sync::Arc, time::Duration};

use nightshift::{tls::AcceptLimits, webhook::server::Limits};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::harness::{Server, research_cluster};

/// How long a waiting connection is watched to show it does not get through.
const HELD: Duration = Duration::from_millis(400);
/// Bound on anything that must happen.
const DEADLINE: Duration = Duration::from_secs(10);

async fn start(change: impl FnOnce(&mut Limits)) -> Server {
    let mut limits = Limits::default();
    change(&mut limits);
    Server::start_limited(Arc::new(research_cluster()), limits).await
}

/// Reads until the peer closes; what it sent.
async fn read_to_close(stream: &mut (impl AsyncReadExt + Unpin)) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut out)).await;
    assert!(
        read.is_ok(),
        "the server did not close the connection in time"
    );
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn connections_above_the_cap_wait_until_one_closes() {
    let s = start(|l| l.accept.max_connections = 1).await;
    let first = s.connect_tls().await.expect("first connection");
    let waiting = s.connect_tls();
    tokio::pin!(waiting);
    assert!(
        tokio::time::timeout(HELD, &mut waiting).await.is_err(),
        "a second connection was served while the only place was taken"
    );
    drop(first);
    let mut second = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("served once the first closed")
        .expect("handshake");
    second
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    assert!(read_to_close(&mut second).await.starts_with("HTTP/1.1 "));
}

#[tokio::test]
async fn handshakes_above_the_cap_wait_and_slow_ones_are_dropped() {
    let s = start(|l| {
        l.accept = AcceptLimits {
            max_connections: 8,
            max_handshakes: 1,
            handshake_timeout: Duration::from_millis(800),
        }
    })
    .await;
    // A client that connects and says nothing holds the only handshake place…
    let mut silent = TcpStream::connect(s.addr).await.expect("connect");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let waiting = s.connect_tls();
    tokio::pin!(waiting);
    assert!(
        tokio::time::timeout(HELD, &mut waiting).await.is_err(),
        "a second handshake ran while the only place was taken"
    );
    // …until its handshake times out and the server closes it; then the next one runs.
    read_to_close(&mut silent).await;
    tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("handshake once the place is free")
        .expect("handshake");
}

#[tokio::test]
async fn slow_headers_and_bodies_are_cut_off() {
    let s = start(|l| {
        l.http.header_read = Duration::from_millis(300);
        l.http.request = Duration::from_millis(300);
    })
    .await;
    // Nothing sent after the handshake: the connection is closed.
    let mut silent = s.connect_tls().await.expect("connect");
    read_to_close(&mut silent).await;

    // Headers never finished: the connection is closed.
    let mut slow_headers = s.connect_tls().await.expect("connect");
    slow_headers
        .write_all(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    let answer = read_to_close(&mut slow_headers).await;
    assert!(!answer.contains("200 OK"), "{answer}");

    // A body that never arrives: HTTP 408, not a task held for ever.
    let mut slow_body = s.connect_tls().await.expect("connect");
    slow_body
        .write_all(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 1000\r\n\r\n{\"kind\":",
        )
        .await
        .expect("write");
    let mut head = [0u8; 12];
    tokio::time::timeout(DEADLINE, slow_body.read_exact(&mut head))
        .await
        .expect("an answer in time")
        .expect("read");
    assert_eq!(&head, b"HTTP/1.1 408", "{}", String::from_utf8_lossy(&head));
}
