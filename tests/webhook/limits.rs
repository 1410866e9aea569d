//! The webhook listener's limits, each exceeded over loopback with small values: connections
//! and handshakes above their caps wait (they are not refused), slow handshakes, headers and
//! bodies are cut off.

use std::{sync::Arc, time::Duration};

use nightshift::{
    runtime::listen::silent_http2, runtime::tls::AcceptLimits, webhook::server::Limits,
};
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::harness::{Server, SlowCluster, admission_review, gpu_pod, research_cluster};

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
            // Well above `HELD` plus the set-up before it, so that a paused machine does not
            // free the place while the test checks it is held.
            handshake_timeout: Duration::from_secs(2),
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

/// An HTTP/2 client over TLS (ALPN `h2` only) trusting the server's CA: one connection.
fn h2_client(s: &Server) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&s.ca_pem).expect("ca pem")])
        .http2_prior_knowledge()
        .build()
        .expect("client")
}

/// One stream per connection: a second request on the same HTTP/2 connection waits until the
/// first (a review held by a slow cluster lookup) ends, while another connection is served.
#[tokio::test]
async fn http2_streams_above_the_cap_wait_until_one_ends() {
    // The lookup outlasts the request limit: the review ends with HTTP 408 at that limit, which
    // is well above `HELD` plus the set-up before it, even on a paused machine.
    let request_limit = Duration::from_secs(5);
    let slow = SlowCluster::new(research_cluster(), Duration::from_secs(60));
    let entered = slow.entered.clone();
    let mut limits = Limits::default();
    limits.http.max_streams = 1;
    limits.http.request = request_limit;
    let s = Server::start_limited(Arc::new(slow), limits).await;
    let client = h2_client(&s);
    let readyz = format!("https://127.0.0.1:{}/readyz", s.addr.port());
    let body = admission_review("uid-held", "research", gpu_pod(json!({})), false).to_string();
    let started = std::time::Instant::now();
    let review = tokio::spawn(client.post(s.url()).body(body).send());
    tokio::time::timeout(DEADLINE, entered.notified())
        .await
        .expect("the review reached the cluster lookup");
    let mut second = tokio::spawn(client.get(&readyz).send());
    let other = tokio::time::timeout(DEADLINE, h2_client(&s).get(&readyz).send())
        .await
        .expect("another connection answered in time")
        .expect("response");
    assert_eq!(other.version(), reqwest::Version::HTTP_2);
    assert!(
        tokio::time::timeout(HELD, &mut second).await.is_err(),
        "a second stream ran on a connection whose only stream was taken"
    );
    let review = tokio::time::timeout(DEADLINE, review)
        .await
        .expect("the review ended in time")
        .expect("task")
        .expect("response");
    assert_eq!(review.status(), reqwest::StatusCode::REQUEST_TIMEOUT);
    let second = tokio::time::timeout(DEADLINE, second)
        .await
        .expect("served once the review ended")
        .expect("task")
        .expect("response");
    assert_eq!(second.status(), other.status());
    assert!(started.elapsed() >= request_limit);
}

#[tokio::test]
async fn an_http2_peer_that_does_not_answer_pings_is_closed() {
    let s = start(|l| {
        l.http.keep_alive_interval = Duration::from_millis(100);
        l.http.keep_alive_timeout = Duration::from_millis(100);
    })
    .await;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(&s.ca_pem).expect("ca der"))
        .expect("root");
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(s.addr).await.expect("connect");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").expect("name"), tcp)
        .await
        .expect("handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let seen = silent_http2::watch(tls, DEADLINE).await;
    assert_eq!(
        seen,
        silent_http2::Observed {
            pinged: true,
            closed: true
        }
    );
}
