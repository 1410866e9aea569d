//! The examples under `manifests/examples`: they render and agree with the base (names, ports,
//! priority classes, labels) and with the behaviour they promise.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::render::{Rendered, Workspace};

fn render(ws: &Workspace, example: &str) -> Rendered {
    ws.render(&format!("manifests/examples/{example}"))
}

fn pod_spec(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

fn scaler_trigger(scaled_object: &Value) -> &Value {
    scaled_object["spec"]["triggers"]
        .as_array()
        .expect("triggers")
        .iter()
        .find(|t| {
            t["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("external"))
        })
        .expect("an external trigger")
}

#[test]
fn vllm_example_runs_at_inference_priority_on_the_gpu_pool() {
    let Some(ws) = Workspace::new() else { return };
    let base = ws.render("manifests/base");
    let example = render(&ws, "vllm");
    let deployment = example.get("Deployment", "vllm-llama");
    let pod = pod_spec(deployment);
    let class = pod["priorityClassName"].as_str().expect("priority class");
    assert_eq!(class, "nightshift-inference");
    assert!(base.has("PriorityClass", class));
    let gpu = &pod["containers"][0]["resources"];
    assert_eq!(
        gpu["requests"]["nvidia.com/gpu"],
        gpu["limits"]["nvidia.com/gpu"]
    );
    assert!(gpu["limits"]["nvidia.com/gpu"].is_string());
    let term = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        [0]["matchExpressions"][0];
    assert_eq!(term["key"], "nightshift.io/pool");
    assert!(pod["tolerations"].as_array().is_some_and(|t| !t.is_empty()));
    let service = example.get("Service", "vllm-llama");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
}

#[test]
fn scaled_object_scales_the_vllm_deployment_through_nightshift_safely() {
    let Some(ws) = Workspace::new() else { return };
    let base = ws.render("manifests/base");
    let example = render(&ws, "vllm");
    let so = example.get("ScaledObject", "vllm-llama");
    let deployment = example.get("Deployment", "vllm-llama");
    assert_eq!(
        so["spec"]["scaleTargetRef"]["name"],
        deployment["metadata"]["name"]
    );
    assert_eq!(
        so["metadata"]["namespace"],
        deployment["metadata"]["namespace"]
    );

    let trigger = scaler_trigger(so);
    assert_eq!(trigger["type"], "external");
    // Fallback only works with AverageValue.
    assert_eq!(trigger["metricType"], "AverageValue");
    let service = base.get("Service", "nightshift");
    let grpc = service["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == "grpc")
        .expect("grpc port");
    assert_eq!(
        trigger["metadata"]["scalerAddress"],
        format!(
            "{}.{}.svc:{}",
            service["metadata"]["name"].as_str().expect("name"),
            service["metadata"]["namespace"]
                .as_str()
                .expect("namespace"),
            grpc["port"]
        )
    );
    for (key, value) in trigger["metadata"].as_object().expect("metadata") {
        assert!(
            value.is_string(),
            "metadata {key} must be a string, KEDA rejects others"
        );
    }

    let fallback = &so["spec"]["fallback"];
    assert!(
        fallback["failureThreshold"]
            .as_u64()
            .is_some_and(|n| n >= 1)
    );
    assert!(fallback["replicas"].as_u64().is_some_and(|n| n >= 1));
    let behavior = &so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"];
    let up = behavior["scaleUp"]["stabilizationWindowSeconds"]
        .as_u64()
        .expect("scaleUp window");
    let down = behavior["scaleDown"]["stabilizationWindowSeconds"]
        .as_u64()
        .expect("scaleDown window");
    assert_eq!(up, 0, "scale up at once");
    assert!(
        down >= 300,
        "scale down slowly: lending GPUs back costs a preemption later"
    );
}

/// The scenario that simulates the example's HPA behaviour says what the example says.
#[test]
fn the_simulated_example_behaviour_is_the_example_scaled_objects() {
    use nightshift::sim::config::{HpaPolicy, HpaPolicyKind, HpaSelect, Scenario};

    let Some(ws) = Workspace::new() else { return };
    let example = render(&ws, "vllm");
    let so = example.get("ScaledObject", "vllm-llama");
    let behavior = &so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"];
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data/scenarios/example-behaviour.toml"),
    )
    .expect("scenario file");
    let simulated = Scenario::from_toml(&text).expect("scenario").autoscaling;
    let rules = |direction: &str| {
        let rules = &behavior[direction];
        let select = match rules["selectPolicy"].as_str().unwrap_or("Max") {
            "Max" => HpaSelect::Max,
            "Min" => HpaSelect::Min,
            other => panic!("selectPolicy {other} is not simulated"),
        };
        let policies: Vec<HpaPolicy> = rules["policies"]
            .as_array()
            .expect("policies")
            .iter()
            .map(|p| HpaPolicy {
                kind: match p["type"].as_str().expect("type") {
                    "Pods" => HpaPolicyKind::Pods,
                    "Percent" => HpaPolicyKind::Percent,
                    other => panic!("policy type {other}"),
                },
                value: p["value"].as_f64().expect("value"),
                period_s: p["periodSeconds"].as_f64().expect("periodSeconds"),
            })
            .collect();
        let window = rules["stabilizationWindowSeconds"]
            .as_f64()
            .expect("window");
        (window, select, policies)
    };
    assert_eq!(
        rules("scaleUp"),
        (
            simulated.scale_up_window_s,
            simulated.scale_up_select,
            simulated.scale_up_policies
        )
    );
    assert_eq!(
        rules("scaleDown"),
        (
            simulated.scale_down_window_s,
            simulated.scale_down_select,
            simulated.scale_down_policies
        )
    );
}

#[test]
fn scaler_variants_change_only_the_trigger_they_are_about() {
    let Some(ws) = Workspace::new() else { return };
    let plain = render(&ws, "vllm");
    let plain_metadata = &scaler_trigger(plain.get("ScaledObject", "vllm-llama"))["metadata"];

    let push = render(&ws, "vllm-push");
    let trigger = scaler_trigger(push.get("ScaledObject", "vllm-llama"));
    assert_eq!(trigger["type"], "external-push");
    assert_eq!(&trigger["metadata"], plain_metadata);

    let prewarm = render(&ws, "vllm-prewarm");
    let so = prewarm.get("ScaledObject", "vllm-llama");
    let types: Vec<&str> = so["spec"]["triggers"]
        .as_array()
        .expect("triggers")
        .iter()
        .filter_map(|t| t["type"].as_str())
        .collect();
    assert_eq!(types, ["external", "cron"]);
    let cron = &so["spec"]["triggers"][1]["metadata"];
    for key in ["timezone", "start", "end", "desiredReplicas"] {
        assert!(cron[key].is_string(), "cron trigger lacks {key}");
    }

    let tls = render(&ws, "vllm-tls");
    let trigger = scaler_trigger(tls.get("ScaledObject", "vllm-llama"));
    assert_eq!(trigger["metadata"]["enableTLS"], "true");
    let auth_name = trigger["authenticationRef"]["name"]
        .as_str()
        .expect("authenticationRef");
    let auth = tls.get("TriggerAuthentication", auth_name);
    let mut params: Vec<&str> = auth["spec"]["secretTargetRef"]
        .as_array()
        .expect("secretTargetRef")
        .iter()
        .filter_map(|r| r["parameter"].as_str())
        .collect();
    params.sort();
    assert_eq!(params, ["caCert", "tlsClientCert", "tlsClientKey"]);
}

#[test]
fn research_job_survives_preemption_and_leaves_marking_to_nightshift() {
    let Some(ws) = Workspace::new() else { return };
    let research = render(&ws, "research");
    let namespace = research.get("Namespace", "research");
    assert_eq!(
        namespace["metadata"]["labels"]["nightshift.io/research"],
        "true"
    );

    let job = research.get("Job", "sft-llama-8b");
    assert_eq!(job["metadata"]["namespace"], "research");
    let rules = job["spec"]["podFailurePolicy"]["rules"]
        .as_array()
        .expect("rules");
    assert!(rules.iter().any(|r| {
        r["action"] == "Ignore"
            && r["onPodConditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "DisruptionTarget"))
    }));
    let pod = pod_spec(job);
    assert_eq!(
        pod["restartPolicy"], "Never",
        "podFailurePolicy requires it"
    );
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("grace period");
    assert!(
        (1..=30).contains(&grace),
        "inference waits for this on preemption"
    );
    // The webhook sets these; a hard-coded class would be overridden anyway.
    assert!(pod["priorityClassName"].is_null());
    assert!(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"].is_string());
}

#[test]
fn workflow_template_chains_the_research_steps_with_preemption_retries() {
    let Some(ws) = Workspace::new() else { return };
    let research = render(&ws, "research");
    let template = research.get("WorkflowTemplate", "llm-research-pipeline");
    let spec = &template["spec"];
    let templates = spec["templates"].as_array().expect("templates");
    let find = |name: &str| {
        templates
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no template {name}"))
    };
    let tasks = find(spec["entrypoint"].as_str().expect("entrypoint"))["dag"]["tasks"]
        .as_array()
        .expect("dag tasks");
    let order: Vec<(&str, Option<&str>)> = tasks
        .iter()
        .map(|t| {
            (
                t["name"].as_str().expect("task name"),
                t["depends"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            ("preprocess", None),
            ("pretrain", Some("preprocess")),
            ("sft", Some("pretrain")),
            ("rl", Some("sft")),
            ("eval", Some("rl")),
        ]
    );
    // Images come from parameters, never hard-coded in the steps.
    let parameters: Vec<&str> = spec["arguments"]["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for step in ["preprocess", "pretrain", "sft", "rl", "eval"] {
        assert!(
            parameters.contains(&format!("{step}-image").as_str()),
            "{step}-image"
        );
    }
    for name in ["step", "eval"] {
        let t = find(name);
        assert!(
            t["container"]["image"]
                .as_str()
                .expect("image")
                .starts_with("{{"),
            "{name}"
        );
        assert!(
            t["retryStrategy"]["limit"].is_string(),
            "{name} must retry preemptions"
        );
    }
    assert_eq!(
        spec["podMetadata"]["labels"]["nightshift.io/research"],
        "true"
    );
    assert!(spec["artifactRepositoryRef"].is_object());
}

/// A container that runs the example trainer: mounted from the ConfigMap, its checkpoint port the
/// one the pod's annotation declares.
fn assert_runs_the_example_trainer(
    what: &str,
    container: &Value,
    volumes: &Value,
    annotations: &Value,
) {
    let command: Vec<&str> = container["command"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no command"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(command, ["python", "/opt/trainer/trainer.py"], "{what}");
    let mount = container["volumeMounts"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["mountPath"] == "/opt/trainer"))
        .unwrap_or_else(|| panic!("{what}: trainer not mounted"));
    let volume = volumes
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == mount["name"]))
        .unwrap_or_else(|| panic!("{what}: no volume {}", mount["name"]));
    assert_eq!(volume["configMap"]["name"], "research-trainer", "{what}");
    let env = |name: &str| {
        container["env"]
            .as_array()
            .and_then(|e| e.iter().find(|e| e["name"] == name))
            .map(|e| e["value"].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(
        env("CHECKPOINT_PORT"),
        annotations[nightshift::core::vocabulary::CHECKPOINT_PORT_ANNOTATION],
        "{what}: the trainer listens where nightshift will call"
    );
    assert!(env("CHECKPOINT_DIR").is_string(), "{what}");
    // The webhook sets the notice file; a value here would point elsewhere.
    assert!(
        env(nightshift::core::vocabulary::NOTICE_FILE_ENV).is_null(),
        "{what}"
    );
}

#[test]
fn research_examples_run_the_trainer_that_checkpoints_on_notices() {
    let Some(ws) = Workspace::new() else { return };
    let research = render(&ws, "research");
    let config_map = research.get("ConfigMap", "research-trainer");
    assert_eq!(config_map["metadata"]["namespace"], "research");
    let script = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("manifests/examples/research/trainer.py"),
    )
    .expect("trainer.py");
    assert_eq!(config_map["data"]["trainer.py"], script.as_str());

    let job = research.get("Job", "sft-llama-8b");
    let template = &job["spec"]["template"];
    assert_runs_the_example_trainer(
        "Job",
        &template["spec"]["containers"][0],
        &template["spec"]["volumes"],
        &template["metadata"]["annotations"],
    );

    let workflow = research.get("WorkflowTemplate", "llm-research-pipeline");
    let step = workflow["spec"]["templates"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == "step"))
        .expect("step template");
    assert_runs_the_example_trainer(
        "WorkflowTemplate step",
        &step["container"],
        &workflow["spec"]["volumes"],
        &step["metadata"]["annotations"],
    );
}

#[test]
fn monitoring_scrapes_the_admin_port_and_the_dashboard_charts_nightshift_metrics() {
    let Some(ws) = Workspace::new() else { return };
    let base = ws.render("manifests/base");
    let monitoring = render(&ws, "monitoring");
    let monitor = monitoring.get("ServiceMonitor", "nightshift");
    let port = monitor["spec"]["endpoints"][0]["port"]
        .as_str()
        .expect("port name");
    assert_eq!(
        monitor["spec"]["endpoints"][0]["honorLabels"], true,
        "nightshift's own namespace label must survive the scrape"
    );
    let service = base.get("Service", "nightshift");
    assert!(
        service["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .any(|p| p["name"] == port && p["port"] == 8080)
    );
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(&service["metadata"]["labels"][key], value, "label {key}");
    }

    let config_map = monitoring.get("ConfigMap", "nightshift-dashboard");
    assert_eq!(config_map["metadata"]["labels"]["grafana_dashboard"], "1");
    let dashboard: Value = serde_json::from_str(
        config_map["data"]["nightshift.json"]
            .as_str()
            .expect("dashboard JSON"),
    )
    .expect("dashboard is JSON");
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(String::from))
        .collect();
    assert!(!exprs.is_empty());
    for metric in [
        "nightshift_scaler_demand_replicas",
        "nightshift_pool_gpus",
        "nightshift_pool_preemptions_total",
        "nightshift_pool_lent_gpu_seconds_total",
        "nightshift_webhook_admission_duration_seconds_bucket",
    ] {
        assert!(
            exprs.iter().any(|e| e.contains(metric)),
            "no panel charts {metric}"
        );
    }
}

/// What KEDA sends nightshift for every external trigger of every example ScaledObject: the
/// ScaledObject's namespace and name, and the trigger's whole metadata map (KEDA passes its own
/// keys such as `scalerAddress` and `enableTLS` along with nightshift's).
pub fn example_scaler_requests(ws: &Workspace) -> Vec<(String, String, BTreeMap<String, String>)> {
    let mut requests = Vec::new();
    for example in ["vllm", "vllm-push", "vllm-prewarm", "vllm-tls"] {
        let rendered = render(ws, example);
        for so in rendered.all("ScaledObject") {
            let trigger = scaler_trigger(so);
            let metadata = trigger["metadata"]
                .as_object()
                .expect("metadata")
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().expect("string value").to_string()))
                .collect();
            requests.push((
                so["metadata"]["namespace"]
                    .as_str()
                    .expect("namespace")
                    .to_string(),
                so["metadata"]["name"].as_str().expect("name").to_string(),
                metadata,
            ));
        }
    }
    requests
}

#[test]
fn every_example_trigger_names_the_scaler_and_a_target() {
    let Some(ws) = Workspace::new() else { return };
    let requests = example_scaler_requests(&ws);
    assert_eq!(requests.len(), 4);
    for (namespace, name, metadata) in &requests {
        assert!(metadata.contains_key("scalerAddress"), "{namespace}/{name}");
        assert!(
            metadata.keys().any(|k| k.ends_with("Target")),
            "{namespace}/{name}: no per-replica target"
        );
    }
}

/// No drift between the examples and the code: the metadata of every example trigger, exactly as
/// KEDA sends it (its own keys included), parses with the scaler's own parser.
#[test]
fn example_scaled_object_metadata_parses_with_the_scalers_parser() {
    let Some(ws) = Workspace::new() else { return };
    for (namespace, name, metadata) in example_scaler_requests(&ws) {
        let raw: nightshift::scaler::metadata::Table = metadata.into_iter().collect();
        match nightshift::scaler::metadata::parse(&raw, &namespace) {
            Ok(config) => assert!(
                config.capacity.is_some(),
                "{namespace}/{name}: the examples learn their token capacity"
            ),
            Err(e) => panic!("{namespace}/{name}: {e}"),
        }
    }
}
