//! Against a real Prometheus server (Debian's `prometheus`, path in NIGHTSHIFT_PROMETHEUS_BIN or
//! on PATH) started on a free loopback port with a generated configuration that scrapes the
//! emulators every second.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use tonic::Code;

use crate::{
    emulator::Emulator,
    harness::{ScalerUnderTest, eventually, get_metrics, scaled_object},
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
    fn start(bin: PathBuf, dir: PathBuf, targets: &[(&str, &str)]) -> Self {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: vllm\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    static_configs:\n",
        );
        for (target, pod) in targets {
            config.push_str(&format!(
                "      - targets: ['{target}']\n        labels: {{namespace: team-a, pod: {pod}}}\n"
            ));
        }
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
    let Some(bin) = crate::prometheus_bin::prometheus_bin() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "prometheus binary not found: run `bash .ci/test`, which installs it"
        );
        eprintln!(
            "SKIPPED: no prometheus binary (install Debian's `prometheus` or run bash .ci/test)"
        );
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
