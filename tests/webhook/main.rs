//! The admission webhook over real TLS: certificates generated like `nightshift certs generate`
//! does, a server on a free loopback port, and a reqwest client trusting only the generated CA.

mod harness;
mod limits;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use base64::Engine as _;
use harness::{Server, admission_review, gpu_pod, research_cluster};
use nightshift::webhook::{certs, review::Outcome};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn post(server: &Server, body: impl Into<reqwest::Body>) -> (StatusCode, String) {
    let resp = server
        .client
        .post(server.url())
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request sent");
    let status = resp.status();
    (status, resp.text().await.expect("body"))
}

fn response_of(body: &str) -> Value {
    let review: Value = serde_json::from_str(body).expect("answer is JSON");
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1", "{review}");
    assert_eq!(review["kind"], "AdmissionReview", "{review}");
    review["response"].clone()
}

/// The patch bytes: base64 text, as Go encodes a `[]byte` and the API server expects.
fn patch_of(response: &Value) -> Value {
    assert_eq!(response["patchType"], "JSONPatch", "{response}");
    let Value::String(b64) = &response["patch"] else {
        panic!("patch is not a base64 string: {response}");
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("patch is base64");
    serde_json::from_slice(&bytes).expect("patch is JSON")
}

#[tokio::test]
async fn research_pod_is_mutated_over_tls() {
    let server = Server::start(research_cluster()).await;
    let review = admission_review("uid-mutate", "research", gpu_pod(json!({})), false);
    let (status, body) = post(&server, review.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let response = response_of(&body);
    assert_eq!(response["uid"], "uid-mutate");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let patch = patch_of(&response);
    let ops: Vec<&str> = patch
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|op| op["path"].as_str())
        .collect();
    assert!(ops.contains(&"/spec/priorityClassName"), "{ops:?}");
    assert!(ops.contains(&"/spec/affinity"), "{ops:?}");
    let warnings = response["warnings"].as_array().expect("warnings");
    assert!(
        warnings.iter().any(|w| w
            .as_str()
            .unwrap_or_default()
            .contains("nightshift-research")),
        "{warnings:?}"
    );
    assert_eq!(server.metrics.admissions(Outcome::Mutated), 1);
}

#[tokio::test]
async fn dry_run_gets_the_same_answer() {
    let server = Server::start(research_cluster()).await;
    let pod = gpu_pod(json!({}));
    let (_, real) = post(
        &server,
        admission_review("u", "research", pod.clone(), false).to_string(),
    )
    .await;
    let (_, dry) = post(
        &server,
        admission_review("u", "research", pod, true).to_string(),
    )
    .await;
    assert_eq!(response_of(&real), response_of(&dry));
}

#[tokio::test]
async fn ordinary_pod_is_admitted_unchanged() {
    let server = Server::start(research_cluster()).await;
    let review = admission_review("uid-skip", "web", gpu_pod(json!({})), false);
    let (status, body) = post(&server, review.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let response = response_of(&body);
    assert_eq!(response["uid"], "uid-skip");
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none(), "{response}");
    assert_eq!(server.metrics.admissions(Outcome::Skipped), 1);
}

#[tokio::test]
async fn research_pod_is_denied_when_its_priority_class_is_missing() {
    let mut cluster = research_cluster();
    cluster.classes.clear();
    let server = Server::start(cluster).await;
    let review = admission_review("uid-deny", "research", gpu_pod(json!({})), false);
    let (status, body) = post(&server, review.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let response = response_of(&body);
    assert_eq!(response["uid"], "uid-deny");
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 403);
    let message = response["status"]["message"].as_str().expect("message");
    assert!(
        message.contains("kubectl create priorityclass nightshift-research"),
        "{message}"
    );
    assert_eq!(server.metrics.admissions(Outcome::Denied), 1);
}

#[tokio::test]
async fn requests_without_a_review_to_answer_get_http_400() {
    let server = Server::start(research_cluster()).await;
    let mut wrong_version = admission_review("u", "research", gpu_pod(json!({})), false);
    wrong_version["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut no_uid = admission_review("u", "research", gpu_pod(json!({})), false);
    no_uid["request"]["uid"] = json!("");
    let cases = [
        (
            "not JSON",
            "{not json".to_string(),
            "not an AdmissionReview",
        ),
        (
            "wrong apiVersion",
            wrong_version.to_string(),
            "admission.k8s.io/v1",
        ),
        (
            "no request",
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).to_string(),
            "no request",
        ),
        ("no uid", no_uid.to_string(), "no uid"),
    ];
    for (name, body, expected) in cases {
        let (status, text) = post(&server, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {text}");
        assert!(text.contains(expected), "{name}: {text}");
    }
    assert_eq!(server.metrics.admissions(Outcome::Invalid), 4);
}

#[tokio::test]
async fn a_review_that_is_not_utf8_text_gets_http_400_even_where_no_field_is_read() {
    let server = Server::start(research_cluster()).await;
    // A byte that is never UTF-8 (0xFF) in the image, a field the decision does not read and the
    // parser only skips.
    let text = admission_review("u", "research", gpu_pod(json!({})), false).to_string();
    let at = text.find("trainer:1").expect("the image is in the review");
    let mut body = text.into_bytes();
    body[at] = 0xFF;
    let (status, text) = post(&server, body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("not an AdmissionReview"), "{text}");
    assert!(text.contains("utf-8"), "{text}");
    assert_eq!(server.metrics.admissions(Outcome::Invalid), 1);
}

#[tokio::test]
async fn reviews_with_an_unusable_object_get_an_invalid_response_echoing_the_uid() {
    let server = Server::start(research_cluster()).await;
    let mut deployment = admission_review("uid-deploy", "research", json!({}), false);
    deployment["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    deployment["request"]["object"] = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d"}, "spec": {}});
    let broken = admission_review(
        "uid-broken",
        "research",
        gpu_pod(json!({"spec": {"containers": "not a list"}})),
        false,
    );
    for (review, uid, expected) in [
        (deployment, "uid-deploy", "only handles pods"),
        (broken, "uid-broken", "cannot be read"),
    ] {
        let (status, body) = post(&server, review.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let response = response_of(&body);
        assert_eq!(response["uid"], uid);
        assert_eq!(response["allowed"], false);
        assert_eq!(response["status"]["code"], 400);
        let message = response["status"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(expected), "{message}");
    }
}

#[tokio::test]
async fn oversized_bodies_are_refused_with_413() {
    let server = Server::start(research_cluster()).await;
    let big = vec![b' '; harness::MAX_BODY + 1];
    let (status, _) = post(&server, big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn tls_1_2_clients_are_served() {
    // Older protocol versions cannot even be offered by rustls; 1.2 must work for older
    // API servers and tools.
    let server = Server::start(research_cluster()).await;
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&server.ca_pem).expect("ca")])
        .tls_version_max(reqwest::tls::Version::TLS_1_2)
        .build()
        .expect("client");
    let review = admission_review("u", "web", gpu_pod(json!({})), false);
    let resp = client
        .post(server.url())
        .body(review.to_string())
        .send()
        .await
        .expect("TLS 1.2 handshake");
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn certificate_rotation_while_a_client_keeps_sending_fails_no_request() {
    let server = Server::start(research_cluster()).await;
    // Fresh connections (a handshake per request) and a keep-alive connection both keep going.
    let fresh = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&server.ca_pem).expect("ca")])
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let clients = [server.client.clone(), fresh];
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let body = admission_review("uid-rot", "research", gpu_pod(json!({})), false).to_string();
    let mut senders = Vec::new();
    for client in clients {
        let (stop, ok, failed, body, url) = (
            stop.clone(),
            ok.clone(),
            failed.clone(),
            body.clone(),
            server.url(),
        );
        senders.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let res = client.post(&url).body(body.clone()).send().await;
                match res {
                    Ok(r) if r.status() == StatusCode::OK => ok.fetch_add(1, Ordering::Relaxed),
                    Ok(r) => {
                        eprintln!("unexpected status {}", r.status());
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                    Err(e) => {
                        eprintln!("request failed: {e:?}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    let mut served = vec![server.served_leaf().await];
    for _ in 0..3 {
        let before = ok.load(Ordering::Relaxed);
        certs::generate(&server.cert_args).expect("rotate");
        let new_leaf = harness::leaf_in(&server.cert_args.dir);
        harness::wait_until(Duration::from_secs(10), async || {
            server.served_leaf().await == new_leaf
        })
        .await;
        served.push(new_leaf);
        // Requests keep flowing after each rotation.
        harness::wait_until(Duration::from_secs(10), async || {
            ok.load(Ordering::Relaxed) > before + 20
        })
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        s.await.expect("sender");
    }
    served.dedup();
    assert_eq!(served.len(), 4, "each rotation served a new certificate");
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    assert!(ok.load(Ordering::Relaxed) > 60);
}

#[tokio::test]
async fn a_half_written_rotation_keeps_the_previous_certificate() {
    let server = Server::start(research_cluster()).await;
    let before = server.served_leaf().await;
    // New certificate with the old key: the pair does not match.
    let other = tempfile::tempdir().expect("tempdir");
    let mut args = server.cert_args.clone();
    args.dir = other.path().to_path_buf();
    certs::generate(&args).expect("other pair");
    std::fs::copy(
        other.path().join(certs::TLS_CERT),
        server.cert_args.dir.join(certs::TLS_CERT),
    )
    .expect("copy");
    assert!(server.tls.reload().is_err(), "mismatched pair rejected");
    assert_eq!(server.served_leaf().await, before);
    let (status, _) = post(
        &server,
        admission_review("u", "web", gpu_pod(json!({})), false).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn shutdown_lets_in_flight_reviews_finish() {
    let slow = harness::SlowCluster::new(research_cluster(), Duration::from_millis(300));
    let entered = slow.entered.clone();
    let server = Server::start_with(Arc::new(slow)).await;
    let client = server.client.clone();
    let url = server.url();
    let body = admission_review("uid-drain", "research", gpu_pod(json!({})), false).to_string();
    let request = tokio::spawn(async move { client.post(url).body(body).send().await });
    entered.notified().await;
    let started = Instant::now();
    server.shutdown.cancel();
    let resp = request
        .await
        .expect("join")
        .expect("in-flight request answered");
    assert_eq!(resp.status(), StatusCode::OK);
    let served = server.join().await;
    assert!(served.is_ok(), "{served:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn certs_generate_prints_the_ca_bundle_and_keeps_the_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nightshift"))
            .args(["certs", "generate", "--dir"])
            .arg(dir.path())
            .output()
            .expect("run nightshift");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout)
            .expect("utf8")
            .trim()
            .to_string()
    };
    let first = run();
    let ca = std::fs::read(dir.path().join(certs::CA_CERT)).expect("ca.crt");
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(&first)
            .expect("base64"),
        ca
    );
    let leaf = std::fs::read(dir.path().join(certs::TLS_CERT)).expect("tls.crt");
    let second = run();
    assert_eq!(first, second, "CA kept, caBundle stable");
    assert_ne!(
        std::fs::read(dir.path().join(certs::TLS_CERT)).expect("tls.crt"),
        leaf,
        "serving certificate renewed"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(certs::TLS_KEY))
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "private key readable by owner only");
    }
}

#[tokio::test]
async fn readiness_is_served_over_tls_and_follows_the_caches() {
    let server = Server::start(research_cluster()).await;
    let url = format!("https://127.0.0.1:{}/readyz", server.addr.port());
    let resp = server.client.get(&url).send().await.expect("request sent");
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        resp.text()
            .await
            .expect("body")
            .contains("test caches synced")
    );

    server.ready.set(true);
    let resp = server.client.get(&url).send().await.expect("request sent");
    assert_eq!(resp.status(), StatusCode::OK);
}

#[test]
fn a_gpu_resource_no_container_can_request_stops_start_up_with_the_option_named() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .args(["webhook", "--gpu-resource=gpu"])
        // No cluster to reach: the refusal must come before any connection is tried.
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("run nightshift");
    assert!(!out.status.success(), "{out:?}");
    // The error goes to the log, wherever the logger writes it.
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        log.contains(r#"--gpu-resource: \"gpu\" is not an extended resource name"#),
        "{log}"
    );
}
