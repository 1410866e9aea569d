//! The scaler drives it: `nightshift scaler` reads a real Prometheus that scrapes a vLLM-metrics
//! emulator, and a driver built on KEDA's generated external-scaler client polls it the way KEDA
//! does (GetMetricSpec once, then GetMetrics + IsActive every polling interval) and applies the
//! HPA rule `ceil(value / target)` to the inference Deployment's scale subresource.
//!
//! Raising the emulated load scales inference up and the scheduler preempts research pods;
//! Prometheus killed mid-run makes the scaler answer UNAVAILABLE and the replicas stay; Prometheus
//! restarted, answers recover; dropping the load scales inference down and research pods return.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::cluster::{Cluster, GPU_NODES, GPUS_PER_NODE};
use crate::objects::{self, is_bound, is_running};
use crate::process::{Process, free_port, tail};
use crate::source::{Prometheus, emulator, find_prometheus};
use crate::victims::{self, VictimWatch};
use crate::wait::{self, Check};

const NS: &str = "e2e-keda";
const DEPLOYMENT: &str = "inference";
const MODEL: &str = "llama";
/// GPUs per inference replica: half a node, as in the harvest scenario.
const INFERENCE_GPUS: u32 = 4;
const MIN_REPLICAS: i32 = 1;
/// maxReplicaCount: the high load asks for exactly this many.
const MAX_REPLICAS: i32 = 6;
/// Waiting requests one replica may carry (the trigger's `waitingTarget`).
const WAITING_TARGET: f64 = 4.0;
/// Emulated queue lengths: 8 / 4 → 2 replicas; 24 / 4 → 6 replicas.
const LOW_LOAD: f64 = 8.0;
const HIGH_LOAD: f64 = 24.0;
const LOW_REPLICAS: i32 = 2;
const HIGH_REPLICAS: i32 = 6;
/// More research pods than spare GPUs, so that some always wait: when inference gives GPUs
/// back, waiting research pods take them without anyone creating new ones.
const RESEARCH_PODS: i32 = 40;
/// KEDA's pollingInterval (30 s by default) and the HPA's sync (15 s), compressed so the
/// scenario takes seconds; Prometheus scrapes every second for the same reason.
const POLLING_INTERVAL: &str = "1s";
/// Polls that must fail while Prometheus is down before the test checks nothing was reduced.
const OUTAGE_POLLS: usize = 3;
/// Deadline of each step; far above the seconds each takes, for a loaded 2-core machine.
const STEP: Duration = Duration::from_secs(120);

pub async fn run(cluster: Arc<Cluster>) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("nightshift-e2e-keda-")
        .tempdir()?;
    let result = scenario(&cluster, dir.path()).await;
    let cleanup = cluster.delete_namespace(NS).await;
    match result {
        Ok(()) => cleanup,
        Err(e) => {
            let kept = dir.keep();
            let mut msg = format!(
                "{e:#}\nlogs of the scaler, Prometheus and the driver kept in {}",
                kept.display()
            );
            for name in ["nightshift-scaler", "prometheus", "keda-driver"] {
                let log = kept.join(format!("{name}.log"));
                msg.push_str(&format!("\n----- {name} -----\n{}", tail(&log, 20)));
            }
            Err(anyhow!(msg))
        }
    }
}

async fn scenario(cluster: &Cluster, dir: &Path) -> Result<()> {
    let client = cluster.client.clone();
    let driver_bin = find_driver()?;
    let prometheus_bin = find_prometheus()?;
    objects::ensure_priority_classes(&client).await?;
    cluster.create_namespace(NS, json!({})).await?;

    // The emulated vLLM load, scraped by a real Prometheus, read by the real scaler binary.
    let emu = emulator::Emulator::start(MODEL, 1, false).await;
    emu.set(0, |e| e.waiting = LOW_LOAD);
    let t_prom = SystemTime::now();
    let prom = Prometheus::start(
        &prometheus_bin,
        dir,
        &emu.endpoint(),
        NS,
        &format!("{DEPLOYMENT}-emulated"),
    )?;
    prom.wait_ready().await?;
    prom.wait_fresh_scrape(t_prom).await?;
    let scaler = Scaler::start(dir)?;
    scaler.wait_ready().await?;

    // Inference at the low load's replicas, research on every spare GPU (and more waiting).
    let total = GPU_NODES * GPUS_PER_NODE;
    let research_full = (total - LOW_REPLICAS as u32 * INFERENCE_GPUS) as usize;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    deployments
        .create(
            &PostParams::default(),
            &objects::inference_deployment(DEPLOYMENT, LOW_REPLICAS, INFERENCE_GPUS)?,
        )
        .await?;
    victims::wait_pods(
        cluster,
        NS,
        "role=inference",
        LOW_REPLICAS as usize,
        is_running,
        STEP,
    )
    .await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    jobs.create(
        &PostParams::default(),
        &objects::research_job("research", RESEARCH_PODS, true)?,
    )
    .await?;
    victims::wait_pods(
        cluster,
        NS,
        "role=research",
        research_full,
        is_running,
        STEP,
    )
    .await?;
    ensure!(
        victims::gpus_in_use(&client, NS).await? == total,
        "expected all {total} GPUs in use before the load rises"
    );

    // KEDA starts polling: the low load keeps the replicas where they are.
    let driver = Driver::start(
        cluster,
        &driver_bin,
        dir,
        &scaler.grpc_addr,
        &prom.address(),
    )?;
    let first = driver
        .wait_poll("a first successful poll", |p| p.ok())
        .await?;
    ensure!(
        first.desired == Some(LOW_REPLICAS),
        "the low load should ask for {LOW_REPLICAS} replicas: {first:?}"
    );
    ensure!(
        replicas(&deployments).await? == LOW_REPLICAS,
        "the driver changed the replicas at steady load"
    );

    // Load rises: replicas rise, the scheduler preempts research pods for them.
    let victim_watch = VictimWatch::start(&client, NS, STEP).await?;
    let t_rise = Instant::now();
    emu.set(0, |e| e.waiting = HIGH_LOAD);
    wait_replicas(cluster, &deployments, HIGH_REPLICAS).await?;
    let to_scaled = t_rise.elapsed();
    victims::wait_pods(
        cluster,
        NS,
        "role=inference",
        HIGH_REPLICAS as usize,
        is_bound,
        STEP,
    )
    .await?;
    let to_bound = t_rise.elapsed();
    let needed = ((HIGH_REPLICAS - LOW_REPLICAS) as u32 * INFERENCE_GPUS) as usize;
    let research_left = research_full - needed;
    victims::wait_pods(
        cluster,
        NS,
        "role=research",
        research_left,
        is_running,
        STEP,
    )
    .await?;
    let n_victims = victim_watch.wait_research(needed, STEP).await?;
    ensure!(
        victim_watch.inference() == 0,
        "{} inference pods were preempted",
        victim_watch.inference()
    );
    ensure!(
        victims::gpus_in_use(&client, NS).await? <= total,
        "GPUs over-committed after preemption"
    );
    eprintln!(
        "keda: load {LOW_LOAD}->{HIGH_LOAD} waiting: replicas {LOW_REPLICAS}->{HIGH_REPLICAS} set in {:.2} s, \
         all inference pods bound in {:.2} s; {n_victims} research pods preempted",
        to_scaled.as_secs_f64(),
        to_bound.as_secs_f64()
    );

    // Prometheus dies: the scaler answers UNAVAILABLE (never a zero) and nothing is reduced.
    let before_kill = driver.polls()?.len();
    let early: Vec<Poll> = driver.polls()?.into_iter().filter(|p| !p.ok()).collect();
    ensure!(
        early.is_empty(),
        "polls failed while Prometheus was up: {early:?}"
    );
    let t_kill = Instant::now();
    prom.kill()?;
    let first_error = driver
        .wait_poll_after(before_kill, "an error from GetMetrics", |p| {
            p.rpc.as_deref() == Some("GetMetrics")
        })
        .await?;
    let to_error = t_kill.elapsed();
    ensure!(
        first_error.code.as_deref() == Some("Unavailable"),
        "expected UNAVAILABLE while Prometheus is down: {first_error:?}"
    );
    let errors = wait::until(
        &format!("{OUTAGE_POLLS} polls answered with errors"),
        STEP,
        || async {
            driver.check_running()?;
            let after: Vec<Poll> = driver.polls()?.split_off(before_kill);
            let errors = after.iter().filter(|p| p.code.is_some()).count();
            Ok(if errors >= OUTAGE_POLLS {
                Check::Done(after)
            } else {
                Check::Pending(format!("{errors} errors in {} polls", after.len()))
            })
        },
    )
    .await?;
    let reduced: Vec<&Poll> = errors
        .iter()
        .filter(|p| p.action.as_deref() == Some("scale"))
        .collect();
    ensure!(
        reduced.is_empty(),
        "the driver scaled while Prometheus was down: {reduced:?}"
    );
    ensure!(
        errors
            .iter()
            .filter(|p| p.code.is_some())
            .all(
                |p| p.code.as_deref() == Some("Unavailable") && p.action.as_deref() == Some("keep")
            ),
        "every failed poll should be UNAVAILABLE and keep the replicas: {errors:?}"
    );
    ensure!(
        replicas(&deployments).await? == HIGH_REPLICAS,
        "replicas changed while Prometheus was down"
    );
    let bound = objects::pods(&client, NS, "role=inference")
        .await?
        .values()
        .filter(|p| is_bound(p))
        .count();
    ensure!(
        bound == HIGH_REPLICAS as usize,
        "{bound} inference pods bound during the outage, expected {HIGH_REPLICAS}"
    );
    let error_polls = errors.iter().filter(|p| p.code.is_some()).count();

    // Prometheus comes back (same data directory): answers recover at the same demand.
    let t_restart = Instant::now();
    let restarted_at = SystemTime::now();
    prom.restart()?;
    prom.wait_ready().await?;
    let polls_at_restart = driver.polls()?.len();
    let recovered = driver
        .wait_poll_after(
            polls_at_restart,
            "a successful poll after the restart",
            |p| p.ok(),
        )
        .await?;
    let to_recover = t_restart.elapsed();
    ensure!(
        recovered.desired == Some(HIGH_REPLICAS),
        "after recovery the demand should still be {HIGH_REPLICAS} replicas: {recovered:?}"
    );
    prom.wait_fresh_scrape(restarted_at).await?;
    let to_fresh = t_restart.elapsed();
    eprintln!(
        "keda: Prometheus killed: first UNAVAILABLE after {:.2} s, {error_polls} failed polls kept \
         {HIGH_REPLICAS} replicas; restarted: answers back in {:.2} s (from its WAL), first new \
         scrape after {:.2} s",
        to_error.as_secs_f64(),
        to_recover.as_secs_f64(),
        to_fresh.as_secs_f64()
    );

    // Load drops: replicas fall, the waiting research pods take the freed GPUs.
    let t_drop = Instant::now();
    emu.set(0, |e| e.waiting = LOW_LOAD);
    wait_replicas(cluster, &deployments, LOW_REPLICAS).await?;
    let to_down = t_drop.elapsed();
    victims::wait_pods(
        cluster,
        NS,
        "role=inference",
        LOW_REPLICAS as usize,
        is_running,
        STEP,
    )
    .await?;
    victims::wait_pods(
        cluster,
        NS,
        "role=research",
        research_full,
        is_running,
        STEP,
    )
    .await?;
    let to_research = t_drop.elapsed();
    let research = objects::pods(&client, NS, "role=research").await?;
    ensure!(
        research
            .values()
            .filter(|p| is_running(p))
            .all(|p| objects::node_of(p).is_some_and(|n| n.starts_with("gpu-"))),
        "a research pod runs outside the GPU pool"
    );
    ensure!(
        victims::gpus_in_use(&client, NS).await? == total,
        "expected all {total} GPUs in use again"
    );
    eprintln!(
        "keda: load {HIGH_LOAD}->{LOW_LOAD} waiting: replicas {HIGH_REPLICAS}->{LOW_REPLICAS} set in {:.2} s, \
         {research_full} research pods running again in {:.2} s",
        to_down.as_secs_f64(),
        to_research.as_secs_f64()
    );

    let polls = driver.polls()?;
    let late: Vec<&Poll> = polls[polls_at_restart..]
        .iter()
        .skip_while(|p| !p.ok())
        .filter(|p| !p.ok())
        .collect();
    ensure!(
        late.is_empty(),
        "polls failed after Prometheus recovered: {late:?}"
    );
    let mut durations: Vec<f64> = polls
        .iter()
        .filter(|p| p.ok())
        .filter_map(|p| p.duration_ms)
        .collect();
    durations.sort_by(f64::total_cmp);
    // Exactly two writes over the whole run, up then down: nothing moved during the outage.
    let writes: Vec<Option<i32>> = polls
        .iter()
        .filter(|p| p.action.as_deref() == Some("scale"))
        .map(|p| p.desired)
        .collect();
    ensure!(
        writes == [Some(HIGH_REPLICAS), Some(LOW_REPLICAS)],
        "expected the scale writes {HIGH_REPLICAS} then {LOW_REPLICAS}, got {writes:?}"
    );
    let scales = writes.len();
    // As KEDA: the metric spec was read once (nightshift's one metric, target 100), and every
    // answered poll read an activity, true under load (activationThreshold 0).
    let specs = driver.events("spec")?;
    ensure!(
        specs.len() == 1
            && specs[0]["metric"] == "vllm-demand"
            && specs[0]["target"].as_f64() == Some(100.0),
        "expected one GetMetricSpec answer (vllm-demand, target 100): {specs:?}"
    );
    ensure!(
        polls
            .iter()
            .filter(|p| p.ok())
            .all(|p| p.active == Some(true) && p.value.is_some_and(|v| v > 0.0)),
        "an answered poll without activity or value: {polls:?}"
    );
    ensure!(
        polls.iter().all(|p| p
            .desired
            .is_none_or(|d| (MIN_REPLICAS..=MAX_REPLICAS).contains(&d))),
        "a decision outside [{MIN_REPLICAS}, {MAX_REPLICAS}]"
    );
    eprintln!(
        "keda: {} polls (GetMetrics + IsActive + scale read), {scales} scale writes, poll p50 {:.1} ms, max {:.1} ms",
        polls.len(),
        percentile(&durations, 0.5),
        durations.last().copied().unwrap_or(0.0)
    );
    driver.stop();
    Ok(())
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The driver binary: `NIGHTSHIFT_E2E_KEDA_DRIVER`, else where `build-keda-driver.sh` puts it.
fn find_driver() -> Result<PathBuf> {
    let path = match std::env::var_os("NIGHTSHIFT_E2E_KEDA_DRIVER").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => {
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/build-keda-driver.sh");
            let out = std::process::Command::new("bash")
                .arg(&script)
                .arg("--print-bin")
                .output()
                .with_context(|| format!("running {}", script.display()))?;
            ensure!(
                out.status.success(),
                "{} --print-bin failed: {}",
                script.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    ensure!(
        path.is_file(),
        "the KEDA driver {} is missing: build it with `bash tests/e2e/build-keda-driver.sh` \
         (needs Go; `bash .ci/test` does this) or point NIGHTSHIFT_E2E_KEDA_DRIVER at it",
        path.display()
    );
    Ok(path)
}

/// The `nightshift scaler` binary on free loopback ports, without a Kubernetes connection (the
/// Prometheus source does not need one).
struct Scaler {
    process: Mutex<Process>,
    grpc_addr: String,
    admin_addr: String,
}

impl Scaler {
    fn start(dir: &Path) -> Result<Self> {
        let grpc_addr = format!("127.0.0.1:{}", free_port()?);
        let admin_addr = format!("127.0.0.1:{}", free_port()?);
        let args = vec![
            "scaler".to_string(),
            format!("--scaler-addr={grpc_addr}"),
            format!("--admin-addr={admin_addr}"),
        ];
        let process = Process::spawn_with_env(
            "nightshift-scaler",
            Path::new(env!("CARGO_BIN_EXE_nightshift")),
            &args,
            // Plain text logs without colour codes: they end up in a file.
            &[
                ("NIGHTSHIFT_LOG", "info".to_string()),
                ("NO_COLOR", "1".to_string()),
            ],
            dir,
        )?;
        Ok(Self {
            process: Mutex::new(process),
            grpc_addr,
            admin_addr,
        })
    }

    async fn wait_ready(&self) -> Result<()> {
        let url = format!("http://{}/readyz", self.admin_addr);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()?;
        wait::http_ok("nightshift scaler /readyz", &http, &url, STEP, || {
            self.process
                .lock()
                .map_err(|_| anyhow!("poisoned"))?
                .check_running()
        })
        .await
    }
}

/// One polling round of the driver, as it logged it.
#[derive(Debug, Clone, Default, serde::Deserialize)]
struct Poll {
    value: Option<f64>,
    active: Option<bool>,
    desired: Option<i32>,
    action: Option<String>,
    rpc: Option<String>,
    code: Option<String>,
    error: Option<String>,
    duration_ms: Option<f64>,
}

impl Poll {
    /// The scaler answered and the decision was applied or kept.
    fn ok(&self) -> bool {
        self.error.is_none() && self.desired.is_some()
    }
}

/// The KEDA-protocol driver (tests/e2e/keda-driver), logging one JSON line per decision.
struct Driver {
    process: Mutex<Process>,
    log: PathBuf,
}

impl Driver {
    fn start(
        cluster: &Cluster,
        bin: &Path,
        dir: &Path,
        scaler: &str,
        prometheus: &str,
    ) -> Result<Self> {
        let (server, ca, token) = kubeconfig_parts(&cluster.kubeconfig)?;
        let token_file = dir.join("driver.token");
        std::fs::write(&token_file, token)?;
        let mut args = vec![
            format!("--scaler={scaler}"),
            format!("--name={DEPLOYMENT}"),
            format!("--namespace={NS}"),
            format!("--deployment={DEPLOYMENT}"),
            format!("--min={MIN_REPLICAS}"),
            format!("--max={MAX_REPLICAS}"),
            format!("--interval={POLLING_INTERVAL}"),
            format!("--server={server}"),
            format!("--ca-file={ca}"),
            format!("--token-file={}", token_file.display()),
        ];
        for (k, v) in [
            ("serverAddress", prometheus.to_string()),
            ("model", MODEL.to_string()),
            ("waitingTarget", WAITING_TARGET.to_string()),
        ] {
            args.push(format!("--metadata={k}={v}"));
        }
        let process = Process::spawn("keda-driver", bin, &args, dir)?;
        Ok(Self {
            log: process.log_path().to_path_buf(),
            process: Mutex::new(process),
        })
    }

    fn check_running(&self) -> Result<()> {
        self.process
            .lock()
            .map_err(|_| anyhow!("driver process lock poisoned"))?
            .check_running()
    }

    /// Every poll logged so far, in order.
    fn polls(&self) -> Result<Vec<Poll>> {
        Ok(self
            .events("poll")?
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect())
    }

    /// Every logged line of the given `event` kind (`spec`, `poll`, `stop`), in order.
    fn events(&self, kind: &str) -> Result<Vec<Value>> {
        let text = std::fs::read_to_string(&self.log)?;
        Ok(text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["event"] == kind)
            .collect())
    }

    async fn wait_poll(&self, what: &str, f: impl Fn(&Poll) -> bool) -> Result<Poll> {
        self.wait_poll_after(0, what, f).await
    }

    /// Waits for a poll, among those after the first `skip`, that satisfies `f`.
    async fn wait_poll_after(
        &self,
        skip: usize,
        what: &str,
        f: impl Fn(&Poll) -> bool,
    ) -> Result<Poll> {
        let f = &f;
        wait::until(what, STEP, || async {
            self.check_running()?;
            let polls = self.polls()?;
            Ok(match polls.iter().skip(skip).find(|p| f(p)) {
                Some(p) => Check::Done(p.clone()),
                None => Check::Pending(format!("last poll: {:?}", polls.last())),
            })
        })
        .await
    }

    fn stop(&self) {
        if let Ok(mut p) = self.process.lock() {
            p.kill();
        }
    }
}

/// Server URL, CA file and token of the cluster's admin kubeconfig (written by the harness).
fn kubeconfig_parts(path: &Path) -> Result<(String, String, String)> {
    let text = std::fs::read_to_string(path)?;
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .map(|v| v.trim().to_string())
            .ok_or_else(|| anyhow!("no {key} in {}", path.display()))
    };
    Ok((
        field("server:")?,
        field("certificate-authority:")?,
        field("token:")?,
    ))
}

async fn replicas(deployments: &Api<Deployment>) -> Result<i32> {
    let d = deployments.get(DEPLOYMENT).await?;
    d.spec
        .and_then(|s| s.replicas)
        .ok_or_else(|| anyhow!("deployment {DEPLOYMENT} has no spec.replicas"))
}

/// Waits until the stored Deployment asks for `want` replicas.
async fn wait_replicas(cluster: &Cluster, deployments: &Api<Deployment>, want: i32) -> Result<()> {
    wait::until(
        &format!("{NS}/{DEPLOYMENT} spec.replicas = {want}"),
        STEP,
        || async {
            cluster.check_processes()?;
            let r = replicas(deployments).await?;
            Ok(if r == want {
                Check::Done(())
            } else {
                Check::Pending(format!("spec.replicas = {r}"))
            })
        },
    )
    .await
}
