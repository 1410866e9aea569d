//! The gRPC server over TLS, and TLS requiring client certificates (mTLS), with certificates
//! generated for the test and read from files, as KEDA connects with a TriggerAuthentication's
//! caCert/tlsClientCert/tlsClientKey. Rotated files are picked up without a restart.

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use nightshift::{
    runtime::tls::{Metrics, ServerTls},
    scaler::{self, service::proto::external_scaler_client::ExternalScalerClient},
};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::{
    emulator::Emulator,
    harness::{ScalerUnderTest, eventually, get_metrics, scaled_object},
};

/// A CA with one server and one client certificate.
struct Pki {
    ca: String,
    server: (String, String),
    client: (String, String),
}

fn pki() -> Pki {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("ca");
    let leaf = |name: &str| {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec![name.to_string()])
            .expect("params")
            .signed_by(&key, &ca)
            .expect("sign");
        (cert.pem(), key.serialize_pem())
    };
    Pki {
        ca: ca.pem(),
        server: leaf("localhost"),
        client: leaf("keda-operator"),
    }
}

/// Server files in `dir`: `tls.crt`, `tls.key` and, when given, `ca.crt` (the client CA).
fn write_server_files(dir: &Path, server: &(String, String), client_ca: Option<&str>) {
    std::fs::write(dir.join("tls.crt"), &server.0).expect("write cert");
    std::fs::write(dir.join("tls.key"), &server.1).expect("write key");
    if let Some(ca) = client_ca {
        std::fs::write(dir.join("ca.crt"), ca).expect("write ca");
    }
}

fn load(dir: &Path, mtls: bool) -> Arc<ServerTls> {
    let ca = dir.join("ca.crt");
    scaler::tls::load(
        &dir.join("tls.crt"),
        &dir.join("tls.key"),
        mtls.then_some(ca.as_path()),
        &Metrics::default(),
    )
    .expect("TLS files load")
}

/// A client trusting `server_ca`, presenting `identity` when given.
fn client_tls(server_ca: &str, identity: Option<&(String, String)>) -> ClientTlsConfig {
    let tls = ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(Certificate::from_pem(server_ca));
    match identity {
        Some((cert, key)) => tls.identity(Identity::from_pem(cert, key)),
        None => tls,
    }
}

/// A new connection (own TCP connection and handshake).
async fn connect(addr: std::net::SocketAddr, tls: ClientTlsConfig) -> Result<Channel, String> {
    Endpoint::from_shared(format!("https://127.0.0.1:{}", addr.port()))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))
}

async fn call(addr: std::net::SocketAddr, tls: ClientTlsConfig) -> Result<(), String> {
    let channel = connect(addr, tls).await?;
    let so = scaled_object(
        "llama",
        &[("endpoints", "127.0.0.1:1"), ("waitingTarget", "1")],
    );
    ExternalScalerClient::new(channel)
        .get_metric_spec(so)
        .await
        .map(|_| ())
        .map_err(|e| format!("call: {e:?}"))
}

#[tokio::test]
async fn mtls_accepts_clients_with_a_certificate_from_the_ca_and_refuses_others() {
    let pki = pki();
    let dir = tempfile::tempdir().expect("tempdir");
    write_server_files(dir.path(), &pki.server, Some(&pki.ca));
    let s = ScalerUnderTest::start_with(
        Duration::from_millis(10),
        Duration::from_millis(50),
        Some(load(dir.path(), true)),
    )
    .await;
    call(s.addr, client_tls(&pki.ca, Some(&pki.client)))
        .await
        .expect("a client with a certificate signed by the CA is served");
    assert!(
        call(s.addr, client_tls(&pki.ca, None)).await.is_err(),
        "a client without a certificate must be refused"
    );
    let other = self::pki();
    assert!(
        call(s.addr, client_tls(&pki.ca, Some(&other.client)))
            .await
            .is_err(),
        "a client with a certificate from another CA must be refused"
    );
}

#[tokio::test]
async fn tls_without_client_ca_serves_any_client_that_trusts_the_server() {
    let pki = pki();
    let dir = tempfile::tempdir().expect("tempdir");
    write_server_files(dir.path(), &pki.server, None);
    let s = ScalerUnderTest::start_with(
        Duration::from_millis(10),
        Duration::from_millis(50),
        Some(load(dir.path(), false)),
    )
    .await;
    call(s.addr, client_tls(&pki.ca, None))
        .await
        .expect("served over TLS");
    assert!(
        call(s.addr, client_tls(&self::pki().ca, None))
            .await
            .is_err(),
        "a client that does not trust the server's CA must not connect"
    );
}

/// Re-reads of the files while the test rotates them: short, so the test takes little time.
const RELOAD_INTERVAL: Duration = Duration::from_millis(20);
/// Bound on each wait for a rotation to be served.
const ROTATION_DEADLINE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn rotated_certificate_and_client_ca_are_used_without_restart_and_no_call_fails() {
    let old = pki();
    let new = pki();
    let both_cas = format!("{}{}", old.ca, new.ca);
    let dir = tempfile::tempdir().expect("tempdir");
    write_server_files(dir.path(), &old.server, Some(&old.ca));
    let tls = load(dir.path(), true);
    let s = ScalerUnderTest::start_with(
        Duration::from_millis(10),
        Duration::from_millis(50),
        Some(tls.clone()),
    )
    .await;
    let stop_watch = tokio_util::sync::CancellationToken::new();
    tokio::spawn(tls.clone().watch(RELOAD_INTERVAL, stop_watch.clone()));
    let _stop_watch = stop_watch.drop_guard();

    let emu = Emulator::start("llama", 1, false).await;
    emu.set(0, |e| e.waiting = 3.0);
    let endpoint = emu.endpoint();
    let so = scaled_object(
        "llama",
        &[("endpoints", endpoint.as_str()), ("waitingTarget", "1")],
    );

    // The old client trusts both server CAs (as KEDA's caCert does during a rotation) and
    // presents a certificate from the old CA.
    let old_client = client_tls(&both_cas, Some(&old.client));
    let new_client = client_tls(&new.ca, Some(&new.client));
    assert!(
        call(s.addr, new_client.clone()).await.is_err(),
        "before the rotation, the new CA's client is refused"
    );

    // A stream of GetMetrics calls during the whole rotation: on one connection opened before it
    // (in flight throughout) and on a new connection every time (a handshake each).
    let running = Arc::new(AtomicBool::new(true));
    let (calls, failures) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let persistent = connect(s.addr, old_client.clone())
        .await
        .expect("connects before the rotation");
    let stream = {
        let (running, calls, failures) = (running.clone(), calls.clone(), failures.clone());
        let (so, addr, old_client) = (so.clone(), s.addr, old_client.clone());
        tokio::spawn(async move {
            let mut on_persistent = ExternalScalerClient::new(persistent);
            let mut errors = Vec::new();
            while running.load(Ordering::SeqCst) {
                let fresh = match connect(addr, old_client.clone()).await {
                    Ok(ch) => get_metrics(&mut ExternalScalerClient::new(ch), &so)
                        .await
                        .map_err(|e| format!("new connection: {e:?}")),
                    Err(e) => Err(e),
                };
                let kept = get_metrics(&mut on_persistent, &so)
                    .await
                    .map_err(|e| format!("connection in flight: {e:?}"));
                for r in [fresh, kept] {
                    calls.fetch_add(1, Ordering::SeqCst);
                    match r {
                        Ok(v) if v.metric_value_float == 300.0 => {}
                        Ok(v) => errors.push(format!("wrong value {v:?}")),
                        Err(e) => errors.push(e),
                    }
                }
                failures.store(errors.len(), Ordering::SeqCst);
            }
            (on_persistent, errors)
        })
    };
    eventually(ROTATION_DEADLINE, "calls before the rotation", || async {
        (calls.load(Ordering::SeqCst) >= 10).then_some(())
    })
    .await;

    // Rotation 1: a server certificate from the new CA, and both CAs accepted from clients.
    // Certificate and key are written one after the other, as a Secret update lands: the
    // half-written pair is refused and the previous one kept until both agree.
    write_server_files(dir.path(), &new.server, Some(&both_cas));
    eventually(ROTATION_DEADLINE, "the new certificate served", || {
        let new_client = new_client.clone();
        async move { call(s.addr, new_client).await.ok() }
    })
    .await;
    let at_rotation = calls.load(Ordering::SeqCst);
    eventually(ROTATION_DEADLINE, "calls after the rotation", || async {
        (calls.load(Ordering::SeqCst) >= at_rotation + 10).then_some(())
    })
    .await;
    running.store(false, Ordering::SeqCst);
    let (mut on_persistent, errors) = stream.await.expect("call stream");
    let total = calls.load(Ordering::SeqCst);
    assert!(
        errors.is_empty(),
        "{} of {total} calls failed during the rotation: {errors:?}",
        errors.len()
    );
    assert_eq!(failures.load(Ordering::SeqCst), 0);
    eprintln!("rotation: {total} GetMetrics calls, 0 failed");

    // A client trusting only the old server CA no longer connects: the old certificate is gone.
    assert!(
        call(s.addr, client_tls(&old.ca, Some(&old.client)))
            .await
            .is_err(),
        "the old server certificate must no longer be served"
    );

    // Rotation 2: the old client CA withdrawn. New connections with its certificates are
    // refused; the connection opened before keeps its session; mTLS is still enforced.
    std::fs::write(dir.path().join("ca.crt"), &new.ca).expect("write ca");
    eventually(ROTATION_DEADLINE, "the old client CA refused", || {
        let old_client = old_client.clone();
        async move { call(s.addr, old_client).await.is_err().then_some(()) }
    })
    .await;
    call(s.addr, new_client.clone())
        .await
        .expect("the new CA's client is served");
    assert!(
        call(s.addr, client_tls(&new.ca, None)).await.is_err(),
        "a client without a certificate is still refused"
    );
    get_metrics(&mut on_persistent, &so)
        .await
        .expect("the connection opened before the rotations still works");
    assert!(
        tls.reloads().get() >= 2,
        "two rotations counted, got {}",
        tls.reloads().get()
    );
}

#[tokio::test]
async fn unusable_rotated_files_keep_the_previous_certificate_in_use() {
    let pki = pki();
    let dir = tempfile::tempdir().expect("tempdir");
    write_server_files(dir.path(), &pki.server, Some(&pki.ca));
    let tls = load(dir.path(), true);
    let s = ScalerUnderTest::start_with(
        Duration::from_millis(10),
        Duration::from_millis(50),
        Some(tls.clone()),
    )
    .await;
    // A key that does not match the certificate, then a client CA that is not PEM.
    std::fs::write(dir.path().join("tls.key"), self::pki().server.1).expect("write key");
    assert!(tls.reload().is_err(), "mismatched pair refused");
    std::fs::write(dir.path().join("tls.key"), &pki.server.1).expect("write key");
    std::fs::write(dir.path().join("ca.crt"), "not a certificate").expect("write ca");
    assert!(
        tls.reload().is_err(),
        "a client CA without certificates refused"
    );
    call(s.addr, client_tls(&pki.ca, Some(&pki.client)))
        .await
        .expect("still served with the previous files");
    assert_eq!(tls.reloads().get(), 0);
}

/// Three clients connect and never start their handshake, above a cap of two handshakes in
/// flight: a well-behaved client waits (it is not refused), each stalled connection is dropped
/// once the handshake time has passed, and then the well-behaved client is served.
#[tokio::test]
async fn stalled_handshakes_above_the_cap_are_dropped_and_a_good_client_is_served_after() {
    use tokio::io::AsyncReadExt;
    /// How long the good client is watched to show it waits; well under the handshake time.
    const HELD: Duration = Duration::from_millis(300);
    const DEADLINE: Duration = Duration::from_secs(10);
    // Well above `HELD` plus the set-up before it, so that a paused machine does not free a
    // place while the test checks both are held.
    let handshake_timeout = Duration::from_secs(2);
    let pki = pki();
    let dir = tempfile::tempdir().expect("tempdir");
    write_server_files(dir.path(), &pki.server, None);
    let limits = scaler::service::Limits {
        max_connections: 8,
        max_handshakes: 2,
        handshake_timeout,
        ..scaler::service::Limits::default()
    };
    let s = ScalerUnderTest::start_full(
        Duration::from_millis(10),
        Duration::from_millis(50),
        Some(load(dir.path(), false)),
        nightshift::sources::policy::SourcePolicy::permissive(),
        limits,
    )
    .await;
    let started = std::time::Instant::now();
    let mut stalled = Vec::new();
    for _ in 0..3 {
        stalled.push(
            tokio::net::TcpStream::connect(s.addr)
                .await
                .expect("connect"),
        );
    }
    let mut good = tokio::spawn(call(s.addr, client_tls(&pki.ca, None)));
    assert!(
        tokio::time::timeout(HELD, &mut good).await.is_err(),
        "a handshake ran while both places were held by stalled connections"
    );
    for mut tcp in stalled {
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(DEADLINE, tcp.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "a stalled handshake was not dropped");
    }
    assert!(
        started.elapsed() >= handshake_timeout,
        "stalled connections dropped before the handshake time: {:?}",
        started.elapsed()
    );
    tokio::time::timeout(DEADLINE, good)
        .await
        .expect("served in time")
        .expect("task")
        .expect("the well-behaved client is served");
}
