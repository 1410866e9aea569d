//! A Prometheus HTTP API stand-in that counts queries and can misbehave; used where a real
//! Prometheus cannot be made to (garbage, slowness) and to count upstream load exactly.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    extract::{Query, State},
    http::{StatusCode, header::CONTENT_TYPE},
    response::IntoResponse,
    routing::get,
};
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::harness::{ScalerUnderTest, get_metrics, scaled_object};

#[derive(Clone, Debug)]
pub enum Mode {
    /// One series per namespace/model/pod with the given value.
    Values(f64),
    Slow(Duration),
    Garbage,
    BadData,
    /// A `bad_data` error whose message is this long text (an upstream reflecting a body).
    LongError(String),
    /// Each query waits for a permit of this gate (a permit goes back once taken, so one
    /// releases every query in turn), then answers as `Values(1.0)`.
    Held(Arc<tokio::sync::Semaphore>),
}

struct FakeState {
    mode: Mutex<Mode>,
    queries: AtomicUsize,
    models: usize,
}

/// Runs until dropped.
pub struct FakePrometheus {
    pub addr: SocketAddr,
    state: Arc<FakeState>,
    stop: CancellationToken,
}

/// Serves `app` on a loopback port from the OS until the returned token is cancelled.
pub async fn serve(app: Router) -> (SocketAddr, CancellationToken) {
    crate::emulator::serve_on(std::net::Ipv4Addr::LOCALHOST.into(), app).await
}

impl Drop for FakePrometheus {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FakePrometheus {
    /// Serves `models` models (`model-0` …), each with two pods, in namespace `team-a`.
    pub async fn start(mode: Mode, models: usize) -> Self {
        let state = Arc::new(FakeState {
            mode: Mutex::new(mode),
            queries: AtomicUsize::new(0),
            models,
        });
        let app = Router::new()
            .route("/api/v1/query", get(query).post(query))
            .with_state(state.clone());
        let (addr, stop) = serve(app).await;
        Self { addr, state, stop }
    }

    pub fn address(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn queries(&self) -> usize {
        self.state.queries.load(Ordering::SeqCst)
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.state.mode.lock().expect("lock") = mode;
    }
}

async fn query(
    State(state): State<Arc<FakeState>>,
    Query(params): Query<HashMap<String, String>>,
) -> impl IntoResponse {
    let (status, body) = answer(&state, &params).await;
    let content_type = if body.starts_with('{') {
        "application/json"
    } else {
        "text/html"
    };
    (status, [(CONTENT_TYPE, content_type)], body)
}

async fn answer(state: &FakeState, params: &HashMap<String, String>) -> (StatusCode, String) {
    state.queries.fetch_add(1, Ordering::SeqCst);
    let mode = state.mode.lock().expect("lock").clone();
    let q = params.get("query").cloned().unwrap_or_default();
    match mode {
        Mode::Garbage => (StatusCode::OK, "<html>login required</html>".to_string()),
        Mode::BadData => (
            StatusCode::BAD_REQUEST,
            r#"{"status":"error","errorType":"bad_data","error":"parse error at char 4"}"#.into(),
        ),
        Mode::LongError(text) => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({"status": "error", "errorType": "bad_data", "error": text})
                .to_string(),
        ),
        Mode::Slow(d) => {
            tokio::time::sleep(d).await;
            (StatusCode::OK, vector(&[]))
        }
        Mode::Held(gate) => {
            let _ = gate.acquire().await;
            values(state, &q, 1.0)
        }
        Mode::Values(v) => values(state, &q, v),
    }
}

/// The answer to query `q` when every series has value `v`.
fn values(state: &FakeState, q: &str, v: f64) -> (StatusCode, String) {
    if !q.contains("by (") {
        // A raw query: one element.
        return (
            StatusCode::OK,
            vector(&[(String::new(), String::new(), String::new(), v)]),
        );
    }
    let mut series = Vec::new();
    for m in 0..state.models {
        for pod in 0..2 {
            series.push((
                "team-a".to_string(),
                format!("model-{m}"),
                format!("pod-{m}-{pod}"),
                v,
            ));
        }
    }
    (StatusCode::OK, vector(&series))
}

fn vector(series: &[(String, String, String, f64)]) -> String {
    let items: Vec<String> = series
        .iter()
        .map(|(ns, model, pod, v)| {
            format!(
                r#"{{"metric":{{"namespace":"{ns}","model_name":"{model}","pod":"{pod}"}},"value":[1700000000.0,"{v}"]}}"#
            )
        })
        .collect();
    format!(
        r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
        items.join(",")
    )
}

#[tokio::test]
async fn one_upstream_query_per_family_serves_a_thousand_scaled_objects() {
    let prom = FakePrometheus::start(Mode::Values(1.0), 1000).await;
    let s = ScalerUnderTest::start(Duration::from_secs(30)).await;
    let address = prom.address();
    let client = s.client().await;
    let mut tasks = Vec::new();
    for i in 0..1000 {
        let mut c = client.clone();
        let so = scaled_object(
            &format!("so-{i}"),
            &[
                ("serverAddress", &address),
                ("model", &format!("model-{i}")),
                ("waitingTarget", "1"),
                ("kvCacheTarget", "0.5"),
                // Generous: this test counts queries, and the machine may be busy.
                ("timeout", "30s"),
            ],
        );
        tasks.push(tokio::spawn(async move { get_metrics(&mut c, &so).await }));
    }
    for t in tasks {
        // Two pods × 1.0 KV / 0.5 target = 4 replicas; waiting 2 → 2 replicas.
        assert_eq!(t.await.expect("join").expect("metrics").metric_value, 400);
    }
    assert_eq!(
        prom.queries(),
        2,
        "one query per metric family (waiting, KV cache)"
    );
}

#[tokio::test]
async fn raw_query_divides_its_single_value_by_its_target() {
    let prom = FakePrometheus::start(Mode::Values(7.0), 1).await;
    let s = ScalerUnderTest::start(Duration::from_millis(10)).await;
    let mut c = s.client().await;
    let so = scaled_object(
        "raw",
        &[
            ("serverAddress", &prom.address()),
            ("query", "sum(my_queue)"),
            ("queryTarget", "2"),
        ],
    );
    let v = get_metrics(&mut c, &so).await.expect("metrics");
    assert_eq!((v.metric_value, v.metric_value_float), (350, 350.0));
}

#[tokio::test]
async fn garbage_slow_and_refusing_prometheus_are_explicit_errors() {
    let prom = FakePrometheus::start(Mode::Garbage, 1).await;
    let s = ScalerUnderTest::start(Duration::from_millis(1)).await;
    let mut c = s.client().await;
    // A short timeout only where the slow answer is under test: elsewhere a paused machine must
    // not turn the expected error into a timeout.
    let trigger = |timeout: &str| {
        scaled_object(
            "m",
            &[
                ("serverAddress", &prom.address()),
                ("model", "model-0"),
                ("waitingTarget", "1"),
                ("timeout", timeout),
            ],
        )
    };
    let so = trigger("10s");
    let e = get_metrics(&mut c, &so).await.expect_err("garbage");
    assert_eq!(e.code(), Code::Internal, "{e:?}");

    prom.set_mode(Mode::Slow(Duration::from_secs(5)));
    tokio::time::sleep(Duration::from_millis(5)).await;
    let started = std::time::Instant::now();
    let e = get_metrics(&mut c, &trigger("300ms"))
        .await
        .expect_err("slow");
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(3));

    prom.set_mode(Mode::BadData);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let raw = scaled_object(
        "m",
        &[
            ("serverAddress", &prom.address()),
            ("query", "sum(("),
            ("queryTarget", "1"),
        ],
    );
    let e = get_metrics(&mut c, &raw).await.expect_err("bad query");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("parse error"), "{e:?}");

    // Nothing listening at all.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", l.local_addr().expect("addr"))
    };
    let down = scaled_object("m", &[("serverAddress", &closed), ("waitingTarget", "1")]);
    let e = get_metrics(&mut c, &down).await.expect_err("down");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
}
