//! The monitoring example's alerts and dashboard: every alert of the PrometheusRule is complete
//! (a `for:`, a severity, what to do) and passes its `promtool test rules` unit tests, and every
//! dashboard query over the GPU pool counts each fact once, although each of nightshift's
//! replicas exports the same pool figures.
//!
//! promtool comes from `$NIGHTSHIFT_PROMTOOL`, else `PATH` (Debian's `prometheus` package, which
//! `.ci/test` installs). Without it these tests fail with instructions. They read the files
//! themselves, not a rendering, so they need no kustomize.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::{Value, json};

use crate::{promql, render::manifests_dir};

/// Environment variable naming the promtool binary.
const PROMTOOL_ENV: &str = "NIGHTSHIFT_PROMTOOL";
/// The rules file the alert tests name in `rule_files` (promtool reads plain rule files, not a
/// PrometheusRule).
const RULES_FILE: &str = "nightshift-rules.yaml";
/// Pool metrics: every replica exports the same figures.
const POOL_PREFIX: &str = "nightshift_pool_";
/// Labels that tell nightshift's replicas apart in Prometheus (target labels).
const REPLICA_LABELS: [&str; 2] = ["instance", "pod"];
/// What the promtool tests write for Grafana's `$__range` (a stat panel over the last hour).
const RANGE: &str = "1h";

/// The alerts the example must ship.
const REQUIRED_ALERTS: [&str; 6] = [
    "NightshiftScalerErrors",
    "KedaCannotReachScaler",
    "NightshiftCertificateExpiringSoon",
    "NightshiftPreemptionStorm",
    "NightshiftNoPoolLeader",
    "NightshiftSpareMarksStale",
];

fn monitoring_dir() -> PathBuf {
    manifests_dir().join("examples/monitoring")
}

fn read(name: &str) -> String {
    let path = monitoring_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml(name: &str) -> Value {
    serde_yaml_ng::from_str(&read(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Finds promtool: `$NIGHTSHIFT_PROMTOOL`, then `PATH`; a missing binary fails the test.
fn promtool() -> PathBuf {
    if let Some(path) = std::env::var_os(PROMTOOL_ENV) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{PROMTOOL_ENV}={} does not name a file",
            path.display()
        );
        return path;
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("promtool"))
                .find(|candidate| candidate.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "promtool not found, so the alerts and dashboard queries cannot be tested. \
                 Install it (`apt-get install prometheus` on Debian; `bash .ci/test` does), or \
                 set {PROMTOOL_ENV}=/path/to/promtool."
            )
        })
}

/// Runs promtool with `args` in `dir` and fails with its output unless it succeeds.
fn run_promtool(dir: &Path, args: &[&str]) {
    let promtool = promtool();
    let output = Command::new(&promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", promtool.display()));
    assert!(
        output.status.success(),
        "promtool {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The PrometheusRule's rule groups.
fn rule_groups() -> Value {
    let rule = yaml("prometheusrule.yaml");
    assert_eq!(rule["kind"], "PrometheusRule");
    let groups = rule["spec"]["groups"].clone();
    assert!(
        groups.as_array().is_some_and(|g| !g.is_empty()),
        "PrometheusRule without spec.groups"
    );
    groups
}

/// Every alerting rule of the PrometheusRule.
fn alerts() -> Vec<Value> {
    rule_groups()
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["alert"].is_string())
        .collect()
}

/// A temp dir holding the PrometheusRule's groups as a plain rules file, and `tests` copied
/// beside it (test files name their rule files relative to themselves).
fn promtool_dir(tests: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = serde_yaml_ng::to_string(&json!({ "groups": rule_groups() })).expect("YAML");
    std::fs::write(dir.path().join(RULES_FILE), rules).expect("write rules");
    std::fs::write(dir.path().join(tests), read(tests)).expect("write tests");
    dir
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let dir = promtool_dir("prometheusrule-tests.yaml");
    run_promtool(dir.path(), &["check", "rules", RULES_FILE]);
    run_promtool(dir.path(), &["test", "rules", "prometheusrule-tests.yaml"]);
}

#[test]
fn every_alert_says_how_bad_and_what_to_do_and_is_tested_firing_and_quiet() {
    let tests = yaml("prometheusrule-tests.yaml");
    assert_eq!(tests["rule_files"], json!([RULES_FILE]));
    let cases: Vec<&Value> = tests["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .collect();
    let alerts = alerts();
    let names: BTreeSet<&str> = alerts.iter().filter_map(|a| a["alert"].as_str()).collect();
    for required in REQUIRED_ALERTS {
        assert!(names.contains(required), "no alert {required}");
    }
    for alert in &alerts {
        let name = alert["alert"].as_str().expect("name");
        assert!(alert["for"].is_string(), "{name}: no `for:`");
        assert!(
            matches!(
                alert["labels"]["severity"].as_str(),
                Some("critical" | "warning")
            ),
            "{name}: severity must be critical or warning"
        );
        for annotation in ["summary", "description"] {
            assert!(
                alert["annotations"][annotation]
                    .as_str()
                    .is_some_and(|t| !t.trim().is_empty()),
                "{name}: no {annotation}"
            );
        }
        let of_this: Vec<&&Value> = cases.iter().filter(|c| c["alertname"] == name).collect();
        let fires = |c: &&&Value| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
        assert!(of_this.iter().any(fires), "{name}: no test where it fires");
        assert!(
            of_this.iter().any(|c| !fires(c)),
            "{name}: no test where it stays quiet"
        );
    }
}

/// The dashboard's query expressions.
fn dashboard_queries() -> Vec<String> {
    let dashboard: Value =
        serde_json::from_str(&read("grafana-dashboard.json")).expect("dashboard is JSON");
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(String::from))
        .collect()
}

/// Why `expr` would count a pool figure more than once, if it would.
fn replicas_counted_twice(expr: &str) -> Option<String> {
    for selector in promql::selectors(expr, POOL_PREFIX) {
        let leader_filtered = selector.group.contains("nightshift_pool_leader == 1")
            && selector.group.contains(" and on");
        if leader_filtered || selector.group.trim() == "nightshift_pool_leader == 1" {
            continue;
        }
        let one_replica = selector
            .aggregation
            .as_ref()
            .is_some_and(|a| a.op == "max" && REPLICA_LABELS.iter().all(|l| a.grouping.merges(l)));
        if !one_replica {
            return Some(format!(
                "{} is aggregated by {:?}: every replica exports it, so it needs `max` over \
                 {REPLICA_LABELS:?} (or a filter on the leader), never a sum",
                selector.metric, selector.aggregation
            ));
        }
    }
    None
}

#[test]
fn the_replica_check_accepts_max_and_the_leader_and_refuses_sums() {
    for good in [
        "max by (state) (nightshift_pool_gpus)",
        "max(nightshift_pool_spare_nodes)",
        "sum(max by (reason) (increase(nightshift_pool_preemptions_total[1h])))",
        "max without (instance, pod) (nightshift_pool_gpus)",
        "sum(nightshift_pool_gpus and on (instance) (nightshift_pool_leader == 1))",
    ] {
        assert_eq!(replicas_counted_twice(good), None, "{good}");
    }
    for bad in [
        "sum(nightshift_pool_gpus)",
        "sum by (state) (nightshift_pool_gpus)",
        "nightshift_pool_gpus",
        "max without (instance) (nightshift_pool_gpus)",
        "max by (pod) (nightshift_pool_gpus)",
        "sum(increase(nightshift_pool_lent_gpu_seconds_total[1h])) / 3600",
        "sum(rate(nightshift_pool_preemptions_total[15m])) * 3600",
    ] {
        assert!(replicas_counted_twice(bad).is_some(), "{bad}");
    }
}

#[test]
fn dashboard_pool_queries_take_one_replicas_figure() {
    let pool: Vec<String> = dashboard_queries()
        .into_iter()
        .filter(|q| q.contains(POOL_PREFIX))
        .collect();
    assert!(pool.len() >= 5, "pool panels missing: {pool:?}");
    for query in &pool {
        if let Some(why) = replicas_counted_twice(query) {
            panic!("dashboard query {query}: {why}");
        }
    }
}

#[test]
fn dashboard_pool_queries_show_one_replicas_figure_in_promtool() {
    let tests = yaml("grafana-dashboard-tests.yaml");
    let tested: BTreeSet<&str> = tests["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .flat_map(|t| t["promql_expr_test"].as_array().into_iter().flatten())
        .filter_map(|c| c["expr"].as_str())
        .collect();
    for query in dashboard_queries()
        .iter()
        .filter(|q| q.contains(POOL_PREFIX))
    {
        let query = query.replace("$__range", RANGE);
        assert!(
            tested.contains(query.as_str()),
            "dashboard query {query} has no promql_expr_test in grafana-dashboard-tests.yaml"
        );
    }
    let dir = promtool_dir("grafana-dashboard-tests.yaml");
    run_promtool(
        dir.path(),
        &["test", "rules", "grafana-dashboard-tests.yaml"],
    );
}
