//! The gRPC server over TLS requiring client certificates (mTLS), with certificates generated
//! for the test, as KEDA connects with a TriggerAuthentication's caCert/tlsClientCert/tlsClientKey.

use std::time::Duration;

use nightshift::scaler::{TlsPem, service::proto::external_scaler_client::ExternalScalerClient};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::harness::{ScalerUnderTest, scaled_object};

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

async fn call(addr: std::net::SocketAddr, tls: ClientTlsConfig) -> Result<(), String> {
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", addr.port()))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
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
    let s = ScalerUnderTest::start_with(
        Duration::from_millis(10),
        Duration::from_millis(50),
        Some(TlsPem {
            cert: pki.server.0.clone().into_bytes(),
            key: pki.server.1.clone().into_bytes(),
            client_ca: Some(pki.ca.clone().into_bytes()),
        }),
    )
    .await;
    let base = ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(Certificate::from_pem(&pki.ca));
    call(
        s.addr,
        base.clone()
            .identity(Identity::from_pem(&pki.client.0, &pki.client.1)),
    )
    .await
    .expect("a client with a certificate signed by the CA is served");
    assert!(
        call(s.addr, base).await.is_err(),
        "a client without a certificate must be refused"
    );
}

#[tokio::test]
async fn tls_without_client_ca_serves_any_client_that_trusts_the_server() {
    let pki = pki();
    let s = ScalerUnderTest::start_with(
        Duration::from_millis(10),
        Duration::from_millis(50),
        Some(TlsPem {
            cert: pki.server.0.clone().into_bytes(),
            key: pki.server.1.clone().into_bytes(),
            client_ca: None,
        }),
    )
    .await;
    let tls = ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(Certificate::from_pem(&pki.ca));
    call(s.addr, tls).await.expect("served over TLS");
}
