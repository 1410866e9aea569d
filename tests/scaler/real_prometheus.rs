//! Against a real Prometheus server (Debian's `prometheus`, path in NIGHTSHIFT_PROMETHEUS_BIN or
//! on PATH) started on a free loopback port with a generated configuration that scrapes the
//! emulators, or a scaler's own metrics, every second.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use tonic::Code;

use jiff::Timestamp;
use nightshift::scaler::forecasts::{Clock, ForecastOptions};

use crate::{
    emulator::Emulator,
    harness::{NAMESPACE, ScalerUnderTest, eventually, get_json, get_metrics, scaled_object},
};

/// A Prometheus child process, killed on drop.
struct Prometheus {
    child: Option<Child>,
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Prometheus {
    /// Scraping vLLM pods: (address, pod name), in namespace team-a.
    fn start(bin: PathBuf, dir: PathBuf, targets: &[(&str, &str)]) -> Self {
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: vllm\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    static_configs:\n",
        );
        for (target, pod) in targets {
            config.push_str(&format!(
                "      - targets: ['{target}']\n        labels: {{namespace: team-a, pod: {pod}}}\n"
            ));
        }
        Self::with_config(bin, dir, &config)
    }

    /// Scraping nightshift's metrics at `target`, keeping its labels (`honor_labels`, as the
    /// example ServiceMonitor's `honorLabels: true`).
    fn scraping_nightshift(bin: PathBuf, dir: PathBuf, target: &str) -> Self {
        let config = format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: nightshift\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    honor_labels: true\n    static_configs:\n      - targets: ['{target}']\n"
        );
        Self::with_config(bin, dir, &config)
    }

    fn with_config(bin: PathBuf, dir: PathBuf, config: &str) -> Self {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        std::fs::write(dir.join("prometheus.yml"), config).expect("write config");
        let mut p = Self {
            child: None,
            bin,
            dir,
            port,
        };
        p.restart();
        p
    }

    fn restart(&mut self) {
        let log = std::fs::File::create(self.dir.join("prometheus.log")).expect("log file");
        let child = Command::new(&self.bin)
            .arg(format!(
                "--config.file={}",
                self.dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                self.dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{}", self.port))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        self.child = Some(child);
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn address(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn wait_ready(&self) {
        let url = format!("{}/-/ready", self.address());
        let http = reqwest::Client::new();
        let log = self.dir.join("prometheus.log");
        eventually(Duration::from_secs(60), "Prometheus to be ready", || {
            let (http, url, log) = (http.clone(), url.clone(), log.clone());
            async move {
                let ok = http
                    .get(&url)
                    .timeout(Duration::from_secs(1))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                if !ok && let Ok(text) = std::fs::read_to_string(&log) {
                    assert!(!text.contains("level=error"), "Prometheus failed:\n{text}");
                }
                ok.then_some(())
            }
        })
        .await;
    }
}

#[tokio::test]
async fn demand_follows_load_through_prometheus_and_errors_while_it_is_down() {
    let Some(bin) = crate::prometheus_bin::prometheus_or_skip() else {
        return;
    };
    // Pod 0: new vLLM, two engines. Pod 1: old vLLM (gpu_cache_usage_perc), one engine.
    let new = Emulator::start("llama", 2, false).await;
    let old = Emulator::start("llama", 1, true).await;
    new.set(0, |e| {
        e.waiting = 3.0;
        e.kv_cache = 0.5;
    });
    new.set(1, |e| {
        e.waiting = 1.0;
        e.kv_cache = 0.3;
    });
    old.set(0, |e| {
        e.waiting = 2.0;
        e.kv_cache = 0.8;
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let mut prom = Prometheus::start(
        bin,
        dir.path().to_path_buf(),
        &[(&new.endpoint(), "vllm-0"), (&old.endpoint(), "vllm-1")],
    );
    prom.wait_ready().await;

    let s = ScalerUnderTest::start(Duration::from_millis(100)).await;
    let c = s.client().await;
    let address = prom.address();
    let so = scaled_object(
        "llama",
        &[
            ("serverAddress", &address),
            ("model", "llama"),
            ("waitingTarget", "4"),
            ("kvCacheTarget", "0.6"),
            ("timeout", "1s"),
        ],
    );
    let value_is = |want: i64| {
        let (c, so) = (c.clone(), so.clone());
        move || {
            let (mut c, so) = (c.clone(), so.clone());
            async move { (get_metrics(&mut c, &so).await.ok()?.metric_value == want).then_some(()) }
        }
    };
    // KV: (0.5 + 0.3) / 2 + 0.8 = 1.2 → 2 replicas; waiting 6 → 1.5 replicas.
    eventually(
        Duration::from_secs(30),
        "demand of 2 replicas via Prometheus",
        value_is(200),
    )
    .await;

    // Load rises: waiting 20 + 1 + 2 = 23 → 5.75 replicas.
    new.set(0, |e| e.waiting = 20.0);
    eventually(
        Duration::from_secs(30),
        "demand to follow the load",
        value_is(575),
    )
    .await;

    // Prometheus goes away: errors, never a zero.
    prom.stop();
    let mut c2 = c.clone();
    let first = eventually(
        Duration::from_secs(10),
        "an error once Prometheus is down",
        || {
            let (mut c, so) = (c.clone(), so.clone());
            async move { get_metrics(&mut c, &so).await.err() }
        },
    )
    .await;
    assert_eq!(first.code(), Code::Unavailable, "{first:?}");
    for _ in 0..5 {
        let r = get_metrics(&mut c2, &so).await;
        assert!(r.is_err(), "a value while Prometheus is down: {r:?}");
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
    let explained = s
        .scaler
        .decisions()
        .get("team-a", "llama")
        .expect("explained");
    assert!(explained.error.is_some(), "{explained:?}");

    // Back again (same data directory): answers recover.
    prom.restart();
    prom.wait_ready().await;
    eventually(
        Duration::from_secs(30),
        "recovery after Prometheus restarts",
        value_is(575),
    )
    .await;
}

/// The forecast's rebuild after a restart, against a real Prometheus that scraped a scaler: the
/// query the scaler writes is valid PromQL, selects the measured demand the scaler exported for
/// this ScaledObject and the service its trigger reads, and nothing of another service.
#[tokio::test]
async fn a_forecast_rebuilds_from_what_prometheus_scraped_of_its_own_service() {
    let Some(bin) = crate::prometheus_bin::prometheus_or_skip() else {
        return;
    };
    let llama = Emulator::start("llama", 1, false).await;
    llama.set(0, |e| e.waiting = 10.0);
    let mistral = Emulator::start("mistral", 1, false).await;
    mistral.set(0, |e| e.waiting = 10.0);
    let trigger = |pod: &Emulator, model: &str| {
        scaled_object(
            "forecast",
            &[
                ("endpoints", &pod.endpoint()),
                ("model", model),
                ("waitingTarget", "5"),
                ("forecast", "daily"),
            ],
        )
    };

    // The scaler before the restart measures 2 replicas of llama and exports it on /metrics.
    let before =
        ScalerUnderTest::start_with_forecast(Duration::from_millis(50), ForecastOptions::default())
            .await;
    let mut c = before.client().await;
    let v = get_metrics(&mut c, &trigger(&llama, "llama"))
        .await
        .expect("metrics");
    assert_eq!(v.metric_value, 200, "{v:?}");
    let registry = before.registry.clone();
    let metrics = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let registry = registry.clone();
            async move {
                let mut text = String::new();
                prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
                text
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let target = listener.local_addr().expect("addr").to_string();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, metrics).await;
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let prom = Prometheus::scraping_nightshift(bin, dir.path().to_path_buf(), &target);
    prom.wait_ready().await;
    let http = reqwest::Client::new();
    let address = prom.address();
    eventually(
        Duration::from_secs(30),
        "Prometheus to hold the measured demand",
        || {
            let (http, address) = (http.clone(), address.clone());
            async move {
                let answer: serde_json::Value = http
                    .get(format!("{address}/api/v1/query"))
                    .query(&[("query", "nightshift_scaler_measured_demand_replicas")])
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                let found = answer["data"]["result"].as_array()?;
                (found.len() == 1 && found[0]["value"][1] == "2").then_some(())
            }
        },
    )
    .await;
    server.abort();
    drop(before);

    // After the restart: the first evaluation rebuilds from Prometheus. The clock reads one
    // bucket ahead, so that the bucket holding the seconds just scraped is a whole one.
    let rebuilt = |pod: &Emulator, model: &str| {
        let (so, address) = (trigger(pod, model), address.clone());
        async move {
            let after = ScalerUnderTest::start_with_forecast(
                Duration::from_millis(50),
                ForecastOptions {
                    prometheus: Some(address),
                    clock: Clock::from_fn(|| {
                        Timestamp::now() + jiff::SignedDuration::from_secs(300)
                    }),
                    ..ForecastOptions::default()
                },
            )
            .await;
            let c = after.client().await;
            let routes = after.scaler.decisions().routes();
            // Each evaluation's explanation says where the shape's history stands.
            eventually(Duration::from_secs(30), "the rebuild", || {
                let (routes, mut c, so) = (routes.clone(), c.clone(), so.clone());
                async move {
                    get_metrics(&mut c, &so).await.ok()?;
                    let json =
                        get_json(routes, &format!("/scaler/decisions/{NAMESPACE}/forecast")).await;
                    let history = json["forecast"]["history"].as_str()?.to_string();
                    (!history.starts_with("rebuilding")).then_some(history)
                }
            })
            .await
        }
    };
    let same = rebuilt(&llama, "llama").await;
    assert!(
        same.starts_with("rebuilt from Prometheus (")
            && !same.starts_with("rebuilt from Prometheus (0 "),
        "{same}"
    );
    // The same ScaledObject changed to another model: what Prometheus holds is llama's demand.
    let other = rebuilt(&mistral, "mistral").await;
    assert!(
        other.starts_with("rebuilt from Prometheus (0 points)"),
        "{other}"
    );
}
