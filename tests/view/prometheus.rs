//! The history rebuilt after a restart from a real Prometheus (Debian's `prometheus`, path in
//! NIGHTSHIFT_PROMETHEUS_BIN or on PATH, with its `promtool` beside it): three hours of
//! nightshift's own metrics are written as blocks with `promtool tsdb create-blocks-from
//! openmetrics`, a server started on a free port serves them, and the view reads them back.
//! Then the ways a Prometheus fails: down, hung, answering garbage or impossible values.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{Router, routing::get};
use jiff::Timestamp;
use nightshift::{
    core::vocabulary::Vocabulary,
    pool::{
        controller::{Controller, LendingPolicy, Metrics},
        windows::Windows,
    },
    view::{
        ViewState,
        model::HistoryOrigin,
        rebuild::{self, Error},
    },
};

/// Bound on Prometheus starting and loading the blocks.
const START: Duration = Duration::from_secs(60);
/// Minutes of history written.
const MINUTES: i64 = 180;

/// A Prometheus child process over a data directory, killed on drop.
struct Prometheus {
    child: Child,
    url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    async fn start(bin: &Path, dir: &Path) -> Prometheus {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        std::fs::write(
            dir.join("prometheus.yml"),
            "global:\n  scrape_interval: 1m\n",
        )
        .expect("config");
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log file");
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let http = reqwest::Client::new();
        let deadline = Instant::now() + START;
        loop {
            let ready = http
                .get(format!("{}/-/ready", p.url))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return p;
            }
            assert!(Instant::now() < deadline, "Prometheus did not get ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Three hours of nightshift's metrics, a minute apart, ending a minute before `end`: 12 GPUs
/// held by inference, research at 6 then 10 (from the second half), 10 free of which 8 are
/// headroom; inference/llama asks for 2.5 replicas with 3 serving.
fn openmetrics(end: i64) -> String {
    let first = end - MINUTES * 60;
    let mut out = String::new();
    let mut family = |name: &str, series: &[(&str, &dyn Fn(i64) -> f64)]| {
        out.push_str(&format!("# TYPE {name} gauge\n"));
        for (labels, value) in series {
            for m in 0..MINUTES {
                let t = first + m * 60;
                out.push_str(&format!("{name}{{{labels}}} {} {t}\n", value(m)));
            }
        }
    };
    family(
        "nightshift_pool_gpus",
        &[
            ("state=\"protected\"", &|_| 12.0),
            ("state=\"lent\"", &|m| {
                if m < MINUTES / 2 { 6.0 } else { 10.0 }
            }),
            ("state=\"free\"", &|_| 10.0),
        ],
    );
    family("nightshift_pool_headroom_gpus", &[("", &|_| 8.0)]);
    let llama = "namespace=\"inference\",scaled_object=\"llama\"";
    family("nightshift_scaler_demand_replicas", &[(llama, &|_| 2.5)]);
    family("nightshift_scaler_pods", &[(llama, &|_| 3.0)]);
    out.push_str("# EOF\n");
    out
}

fn empty_controller() -> Arc<Mutex<Controller>> {
    Arc::new(Mutex::new(Controller::new(
        LendingPolicy {
            vocabulary: Vocabulary::default(),
            headroom: 8,
            windows: Windows::default(),
        },
        Metrics::default(),
    )))
}

#[tokio::test]
async fn the_history_is_rebuilt_from_nightshifts_metrics_in_a_real_prometheus() {
    let Some(bin) = crate::prometheus_bin::prometheus_or_skip() else {
        return;
    };
    let promtool = bin.with_file_name("promtool");
    let dir = tempfile::tempdir().expect("temp dir");
    let now = Timestamp::now().as_second();
    let end = now.div_euclid(60) * 60;
    let input = dir.path().join("nightshift.om");
    std::fs::write(&input, openmetrics(end)).expect("metrics written");
    let made = Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&input)
        .arg(dir.path().join("data"))
        .output()
        .expect("promtool runs");
    assert!(
        made.status.success(),
        "promtool: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let prometheus = Prometheus::start(&bin, dir.path()).await;

    let at = Timestamp::from_second(now).expect("ts");
    let found = rebuild::from_prometheus(&prometheus.url, at, Duration::from_secs(30))
        .await
        .expect("rebuilt");
    // Each minute written, then up to 5 more (Prometheus' lookback holds the last value).
    let n = found.pool.len() as i64;
    assert!((MINUTES..=MINUTES + 6).contains(&n), "{n} samples");
    let first = &found.pool[0];
    assert_eq!(first.at, end - MINUTES * 60);
    assert_eq!(
        (first.inference, first.research, first.free, first.headroom),
        (12, 6, 2, 8),
        "free GPUs less the headroom ones"
    );
    assert_eq!(found.pool[MINUTES as usize - 1].research, 10);
    assert!(found.pool.windows(2).all(|w| w[1].at - w[0].at == 60));
    let llama = found.services.values().next().expect("llama");
    assert!(llama.len() >= 30, "{} 5-minute points", llama.len());
    assert!(llama.iter().all(|p| (p.demand, p.replicas) == (2.5, 3.0)));

    // The same through the view, at the same now: the page says where its history comes from.
    let state = ViewState::new(empty_controller(), at).with_clock(move || at);
    state
        .rebuild(&prometheus.url, Duration::from_secs(30))
        .await;
    let origin = state.timeline().origin.clone();
    assert!(
        matches!(origin, HistoryOrigin::Prometheus { samples, .. } if samples as i64 >= MINUTES + 36),
        "{origin:?}"
    );
    let html = page(state).await;
    assert!(html.contains("History rebuilt from Prometheus"), "{html}");
    assert!(html.contains("data-service=\"inference/llama\""));
}

async fn page(state: ViewState) -> String {
    use tower::ServiceExt;
    let response = nightshift::view::router(state)
        .oneshot(
            axum::http::Request::get("/")
                .body(axum::body::Body::empty())
                .expect("request"),
        )
        .await
        .expect("response");
    let body = axum::body::to_bytes(response.into_body(), 1 << 24)
        .await
        .expect("body");
    String::from_utf8(body.to_vec()).expect("utf-8")
}

/// Serves `router` on a free loopback port; returns its URL.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

#[tokio::test]
async fn a_prometheus_answering_garbage_leaves_the_history_empty_and_says_why() {
    let url = serve(Router::new().route(
        "/api/v1/query_range",
        get(|| async { "<html>not Prometheus</html>" }),
    ))
    .await;
    let state = ViewState::new(empty_controller(), Timestamp::now());
    state.rebuild(&url, Duration::from_secs(10)).await;
    let origin = state.timeline().origin.clone();
    let HistoryOrigin::SinceStart {
        rebuild_failed: Some(why),
        ..
    } = origin
    else {
        panic!("not a failed rebuild: {origin:?}");
    };
    assert!(why.contains(&url), "{why}");
    assert!(state.controller.lock().expect("lock").history().is_empty());
    let html = page(state).await;
    assert!(
        html.contains("rebuilding the earlier history from Prometheus failed"),
        "{html}"
    );
}

#[tokio::test]
async fn impossible_values_fail_the_whole_rebuild() {
    let url = serve(Router::new().route(
        "/api/v1/query_range",
        get(|| async {
            axum::Json(serde_json::json!({"status": "success", "data": {
                "resultType": "matrix",
                "result": [{"metric": {}, "values": [[1700000000, "12"], [1700000060, "-3"]]}]
            }}))
        }),
    ))
    .await;
    let err = rebuild::from_prometheus(&url, Timestamp::now(), Duration::from_secs(10))
        .await
        .expect_err("a negative GPU count");
    assert!(
        matches!(err, Error::Unusable { value, .. } if value == -3.0),
        "{err}"
    );
}

#[tokio::test]
async fn a_hung_prometheus_is_given_up_on_after_the_timeout() {
    // Accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let started = Instant::now();
    let err = rebuild::from_prometheus(&url, Timestamp::now(), Duration::from_millis(500))
        .await
        .expect_err("no answer");
    assert!(
        matches!(err, Error::Timeout { .. } | Error::Query { .. }),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "bounded");
    held.abort();
}
