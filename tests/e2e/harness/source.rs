//! The vLLM load the scenarios scale on: a vLLM-metrics emulator (the scaler suite's, in-process)
//! and a real Prometheus (Debian's binary) scraping it every second, with the series labelled as
//! a pod of the scenario's namespace, as a Kubernetes scrape configuration would. Prometheus can
//! be killed and restarted on the same port and data directory, to take the source away.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Result, anyhow};
use serde_json::Value;

use crate::harness::process::{Process, free_port};
use crate::harness::wait::{self, Check};

pub(crate) use nightshift::test_support::{emulator, prometheus_bin};

/// Deadline of each wait; far above the seconds Prometheus needs, for a loaded 2-core machine.
const STEP: Duration = Duration::from_secs(120);

/// Debian's `prometheus`: `NIGHTSHIFT_PROMETHEUS_BIN`, else on PATH; an error saying how to get
/// it when there is none.
pub(crate) fn find_prometheus() -> Result<PathBuf> {
    prometheus_bin::prometheus_bin().ok_or_else(|| {
        anyhow!(
            "prometheus not found: install Debian's `prometheus` (`bash .ci/test` does) or set \
             NIGHTSHIFT_PROMETHEUS_BIN"
        )
    })
}

/// A real Prometheus scraping the emulator every second, labelling its series as a pod of the
/// scenario's namespace (as a Kubernetes scrape configuration would).
pub(crate) struct Prometheus {
    process: Mutex<Option<Process>>,
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl Prometheus {
    /// Starts Prometheus on a free loopback port, scraping `target` every second and labelling
    /// its series as pod `pod` of `namespace`; its files go to `dir`.
    pub(crate) fn start(
        bin: &Path,
        dir: &Path,
        target: &str,
        namespace: &str,
        pod: &str,
    ) -> Result<Self> {
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: vllm\n    \
             scrape_interval: 1s\n    scrape_timeout: 1s\n    static_configs:\n      - targets: ['{target}']\n        \
             labels: {{namespace: {namespace}, pod: {pod}}}\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config)?;
        let p = Self {
            process: Mutex::new(None),
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            port: free_port()?,
        };
        p.restart()?;
        Ok(p)
    }

    pub(crate) fn restart(&self) -> Result<()> {
        let args = vec![
            format!(
                "--config.file={}",
                self.dir.join("prometheus.yml").display()
            ),
            format!(
                "--storage.tsdb.path={}",
                self.dir.join("prometheus-data").display()
            ),
            format!("--web.listen-address=127.0.0.1:{}", self.port),
            "--log.level=warn".to_string(),
        ];
        let p = Process::spawn("prometheus", &self.bin, &args, &self.dir)?;
        *self.lock()? = Some(p);
        Ok(())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Option<Process>>> {
        self.process
            .lock()
            .map_err(|_| anyhow!("prometheus process lock poisoned"))
    }

    pub(crate) fn kill(&self) -> Result<()> {
        drop(self.lock()?.take());
        Ok(())
    }

    pub(crate) fn address(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until Prometheus holds an emulator sample scraped after `since`. Prometheus applies
    /// scrape targets on a 5 s tick, so the first scrape after a start can take that long; until
    /// then, after a restart, it answers from the samples its WAL kept from before the crash.
    pub(crate) async fn wait_fresh_scrape(&self, since: SystemTime) -> Result<()> {
        let since = since.duration_since(UNIX_EPOCH)?.as_secs_f64();
        let url = format!("{}/api/v1/query", self.address());
        let http = reqwest::Client::new();
        wait::until("Prometheus to scrape the emulator", STEP, || async {
            let body: Value = http
                .get(&url)
                .query(&[("query", "timestamp(vllm:num_requests_waiting)")])
                .timeout(Duration::from_secs(1))
                .send()
                .await?
                .json()
                .await?;
            let last = body["data"]["result"][0]["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok());
            Ok(match last {
                Some(t) if t >= since => Check::Done(()),
                other => Check::Pending(format!("last sample at {other:?}")),
            })
        })
        .await
    }

    pub(crate) async fn wait_ready(&self) -> Result<()> {
        let url = format!("{}/-/ready", self.address());
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()?;
        wait::http_ok("Prometheus /-/ready", &http, &url, STEP, || {
            match self.lock()?.as_mut() {
                Some(p) => p.check_running(),
                None => Ok(()),
            }
        })
        .await
    }
}
