//! End-to-end tests on a real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler,
//! kube-controller-manager, kwok fake nodes), built by `tests/e2e/scripts/build-control-plane.sh`.
//!
//! Layout: this file is the runner (the list of scenarios, their selection, one control plane
//! for the run); `harness/` is the environment the scenarios drive (the control plane, KEDA,
//! the nightshift binary, Prometheus and the vLLM emulator, waits, object builders);
//! `scenarios/` holds one module per scenario; `scripts/` builds and fetches what the harness
//! runs (the control plane's and KEDA's binaries, the CRDs), outside cargo.
//!
//! This is its own test runner (`harness = false`): one control plane is started for the whole
//! run and the scenarios run one after the other against it (they share the GPU pool), each in
//! its own namespace, which it deletes when done. Dropping the control plane kills every process
//! and removes every temporary directory; component logs are kept when a scenario failed.
//!
//! Arguments: substrings that select scenarios by name (as `cargo test NAME` passes them);
//! `--list` lists them; other flags of the standard harness are accepted and ignored.
//! `NIGHTSHIFT_E2E_SKIP=1` skips the whole suite deliberately; without it, missing binaries are
//! an error, never a silent pass.

mod harness;
mod scenarios;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use harness::cluster::{self, Cluster};
use scenarios::{
    admission, chaos, failure, gate, harvest, keda_loop, keda_push, notice, packing, preemption,
    rbac, scrape, takeover,
};

type Scenario = fn(Arc<Cluster>) -> BoxFuture<'static, anyhow::Result<()>>;

/// Upper bound for one scenario, so that a hang fails the run instead of blocking CI.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(600);

/// Every scenario, in the order they run.
fn scenarios() -> Vec<(&'static str, Scenario)> {
    vec![
        (
            "harvest_research_pods_are_preempted_for_inference_and_return",
            |c| Box::pin(harvest::run(c)),
        ),
        (
            "admission_research_pods_are_stored_marked_through_the_real_chain",
            |c| Box::pin(admission::run(c)),
        ),
        (
            "failure_webhook_down_rotation_and_restart_are_handled",
            |c| Box::pin(failure::run(c)),
        ),
        (
            "rbac_nightshift_works_with_the_base_service_account_rules",
            |c| Box::pin(rbac::run(c)),
        ),
        (
            "gate_research_binds_only_to_spare_gpus_within_lending_windows",
            |c| Box::pin(gate::run(c)),
        ),
        (
            "packing_profile_keeps_whole_nodes_free_for_inference",
            |c| Box::pin(packing::run(c)),
        ),
        (
            "preemption_the_simulators_scheduler_model_decides_as_kube_scheduler",
            |c| Box::pin(preemption::run(c)),
        ),
        (
            "scrape_discovers_pods_from_endpointslices_and_follows_them",
            |c| Box::pin(scrape::run(c)),
        ),
        ("chaos_apiserver_restart_during_lending_converges", |c| {
            Box::pin(chaos::run_restart(c))
        }),
        (
            "chaos_partitioned_nightshift_steps_down_and_takes_the_lease_back",
            |c| Box::pin(chaos::run_partition(c)),
        ),
        (
            "takeover_standby_takes_the_lease_and_the_webhook_service_keeps_admitting",
            |c| Box::pin(takeover::run(c)),
        ),
        // Last: the first scenario that needs KEDA starts it, and it then runs to the end.
        (
            "loop_keda_hpa_scale_inference_over_research_with_fallback",
            |c| Box::pin(keda_loop::run(c)),
        ),
        ("keda_push_stream_wakes_a_service_scaled_to_zero", |c| {
            Box::pin(keda_push::run(c))
        }),
        ("notice_warns_research_before_the_scheduler_preempts", |c| {
            Box::pin(notice::run(c))
        }),
    ]
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filters: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let all = scenarios();
    if args.iter().any(|a| a == "--list") {
        for (name, _) in &all {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let selected: Vec<(&str, Scenario)> = all
        .iter()
        .copied()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f)))
        .collect();
    let filtered_out = all.len() - selected.len();
    if selected.is_empty() {
        println!(
            "\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; {filtered_out} filtered out\n"
        );
        return ExitCode::SUCCESS;
    }
    if std::env::var("NIGHTSHIFT_E2E_SKIP").is_ok_and(|v| v == "1") {
        eprintln!("e2e: NIGHTSHIFT_E2E_SKIP=1: end-to-end tests skipped on purpose");
        println!(
            "\ntest result: ok. 0 passed; 0 failed; {} ignored; 0 measured; {filtered_out} filtered out\n",
            selected.len()
        );
        return ExitCode::SUCCESS;
    }
    nightshift::install_crypto_provider();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("e2e: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let (passed, failed) = rt.block_on(run(selected));
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed; 0 ignored; 0 measured; {filtered_out} filtered out; finished in {:.2}s\n",
        if failed == 0 { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn run(selected: Vec<(&'static str, Scenario)>) -> (usize, usize) {
    println!("\nrunning {} tests", selected.len());
    let bin_dir = match cluster::find_bin_dir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("e2e: {e:#}");
            for (name, _) in &selected {
                println!("test {name} ... FAILED");
            }
            return (0, selected.len());
        }
    };
    let cluster = match Cluster::start(bin_dir).await {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("e2e: the control plane did not start: {e:#}");
            for (name, _) in &selected {
                println!("test {name} ... FAILED");
            }
            return (0, selected.len());
        }
    };
    let (mut passed, mut failed) = (0, 0);
    for (name, scenario) in selected {
        let t = Instant::now();
        let task = tokio::spawn(scenario(cluster.clone()));
        let abort = task.abort_handle();
        let outcome = match tokio::time::timeout(SCENARIO_TIMEOUT, task).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(format!("{e:#}")),
            Ok(Err(join)) => Err(format!("panicked: {join}")),
            Err(_) => {
                abort.abort();
                Err(format!("did not finish within {SCENARIO_TIMEOUT:?}"))
            }
        };
        match outcome {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok ({:.1} s)", t.elapsed().as_secs_f64());
            }
            Err(msg) => {
                failed += 1;
                println!(
                    "test {name} ... FAILED ({:.1} s)",
                    t.elapsed().as_secs_f64()
                );
                eprintln!("---- {name} ----\n{msg}");
                cluster.mark_failed();
            }
        }
    }
    if failed > 0 {
        cluster.print_log_tails();
    }
    // Stop every process now; the directories go when the last reference is dropped (at the
    // latest when the runtime drops aborted tasks).
    cluster.stop();
    drop(cluster);
    (passed, failed)
}
