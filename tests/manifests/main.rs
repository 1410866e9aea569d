//! The deployment manifests: every kustomization under `manifests/` renders with a real
//! kustomize, and the rendered objects keep the promises the deployment's safety rests on
//! (which pods the webhook sees, fail-closed admission, priorities, a locked-down Deployment,
//! least-privilege RBAC, certificates wired to the webhook configuration). The monitoring
//! example's alerts and dashboard queries are tested with promtool ([`monitoring`]).
//!
//! kustomize comes from `$NIGHTSHIFT_KUSTOMIZE` (`.ci/test` builds it). Without it these tests
//! fail with instructions, unless `NIGHTSHIFT_SKIP_MANIFEST_TESTS=1` is set.

mod examples;
mod monitoring;
mod promql;
mod render;
mod schema;
mod select;

use base64::Engine as _;
use nightshift::core::vocabulary::{
    INFERENCE_PRIORITY_CLASS, RESEARCH_LABEL, RESEARCH_PRIORITY_CLASS, TRUE,
};
use serde_json::Value;

use render::{Rendered, Workspace};
use select::{Labels, labels};

/// Namespaces whose pods must never be sent to the webhook.
const SYSTEM_NAMESPACES: [&str; 4] = [
    "kube-system",
    "kube-node-lease",
    "kube-public",
    "nightshift-system",
];

fn workspace() -> Option<Workspace> {
    Workspace::new()
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn every_kustomization_renders_to_named_objects() {
    let Some(ws) = workspace() else { return };
    let dirs = render::kustomization_dirs(ws.root());
    for expected in [
        "manifests/base",
        "manifests/overlays/self-signed",
        "manifests/overlays/cert-manager",
        "manifests/overlays/local",
    ] {
        assert!(
            dirs.iter().any(|d| d == expected),
            "{expected} missing from {dirs:?}"
        );
    }
    for dir in &dirs {
        let rendered = ws.render(dir);
        assert!(!rendered.objects.is_empty(), "{dir} renders nothing");
        for object in &rendered.objects {
            assert!(
                object["apiVersion"].is_string(),
                "{dir}: object without apiVersion: {object}"
            );
            assert!(
                object["kind"].is_string(),
                "{dir}: object without kind: {object}"
            );
            assert!(
                object["metadata"]["name"].is_string(),
                "{dir}: object without name: {object}"
            );
            if let Some(errors) = schema::check(object) {
                assert!(
                    errors.is_empty(),
                    "{dir}: {} {} does not match the Kubernetes API: {errors:#?}",
                    object["kind"],
                    object["metadata"]["name"]
                );
            }
        }
    }
}

/// Which webhook entries of the configuration a pod CREATE would be sent to.
fn webhooks_called<'a>(
    config: &'a Value,
    namespace: &str,
    namespace_labels: &[(&str, &str)],
    pod_labels: &[(&str, &str)],
) -> Vec<&'a str> {
    // The API server labels every namespace with its own name.
    let mut ns_labels: Labels = labels(namespace_labels);
    ns_labels.insert("kubernetes.io/metadata.name".into(), namespace.into());
    let pod_labels = labels(pod_labels);
    config["webhooks"]
        .as_array()
        .expect("webhooks")
        .iter()
        .filter(|w| {
            select::matches(&w["namespaceSelector"], &ns_labels)
                && select::matches(&w["objectSelector"], &pod_labels)
        })
        .map(|w| w["name"].as_str().expect("webhook name"))
        .collect()
}

#[test]
fn webhook_is_sent_research_pods_once_and_nothing_else() {
    let Some(ws) = workspace() else { return };
    let base = ws.render("manifests/base");
    let config = base.get("MutatingWebhookConfiguration", "nightshift");
    let research = [("nightshift.io/research", "true")];

    // Research namespace, any pod (a pod cannot opt out).
    for pod in [
        &[][..],
        &research[..],
        &[("nightshift.io/research", "false")][..],
    ] {
        assert_eq!(
            webhooks_called(config, "team-a", &research, pod).len(),
            1,
            "{pod:?}"
        );
    }
    // Labelled pod in an ordinary namespace.
    assert_eq!(webhooks_called(config, "default", &[], &research).len(), 1);
    // Ordinary pods in ordinary namespaces.
    assert!(webhooks_called(config, "default", &[], &[]).is_empty());
    assert!(
        webhooks_called(
            config,
            "serving",
            &[("nightshift.io/research", "false")],
            &[]
        )
        .is_empty()
    );
    // System namespaces: never, even when mislabelled.
    for ns in SYSTEM_NAMESPACES {
        assert!(
            webhooks_called(config, ns, &research, &research).is_empty(),
            "{ns}"
        );
        assert!(
            webhooks_called(config, ns, &[], &research).is_empty(),
            "{ns}"
        );
    }
}

#[test]
fn webhook_handles_only_pod_creation_and_fails_closed() {
    let Some(ws) = workspace() else { return };
    let base = ws.render("manifests/base");
    let config = base.get("MutatingWebhookConfiguration", "nightshift");
    let webhooks = config["webhooks"].as_array().expect("webhooks");
    assert!(!webhooks.is_empty());
    for w in webhooks {
        let name = &w["name"];
        assert_eq!(strings(&w["admissionReviewVersions"]), ["v1"], "{name}");
        assert_eq!(w["sideEffects"], "None", "{name}");
        assert_eq!(
            w["failurePolicy"], "Fail",
            "{name}: research pods must not slip through"
        );
        assert_eq!(w["reinvocationPolicy"], "IfNeeded", "{name}");
        let timeout = w["timeoutSeconds"].as_u64().expect("timeoutSeconds set");
        assert!(
            (1..=5).contains(&timeout),
            "{name}: timeout {timeout}s is not small"
        );
        let rules = w["rules"].as_array().expect("rules");
        assert_eq!(rules.len(), 1, "{name}");
        assert_eq!(strings(&rules[0]["operations"]), ["CREATE"], "{name}");
        assert_eq!(strings(&rules[0]["resources"]), ["pods"], "{name}");
        assert_eq!(strings(&rules[0]["apiGroups"]), [""], "{name}");
        assert_eq!(strings(&rules[0]["apiVersions"]), ["v1"], "{name}");
        let service = &w["clientConfig"]["service"];
        assert_eq!(service["name"], "nightshift", "{name}");
        assert_eq!(service["namespace"], "nightshift-system", "{name}");
        assert_eq!(service["path"], "/mutate", "{name}");
        assert_eq!(service["port"], 443, "{name}");
    }
}

#[test]
fn admission_policy_requires_the_research_class_on_research_pods() {
    let Some(ws) = workspace() else { return };
    let base = ws.render("manifests/base");
    let policy = base.get("ValidatingAdmissionPolicy", "nightshift-research-priority");
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    assert_eq!(policy["spec"]["paramKind"]["kind"], "PriorityClass");
    assert_eq!(
        policy["spec"]["paramKind"]["apiVersion"],
        "scheduling.k8s.io/v1"
    );
    let rules = &policy["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(strings(&rules["operations"]), ["CREATE"]);
    assert_eq!(strings(&rules["resources"]), ["pods"]);
    // The webhook's rule: the research class, or a class no higher that never preempts.
    let text = policy.to_string();
    for needle in [
        "params.metadata.name",
        "object.spec.priority <= params.value",
        "preemptionPolicy == 'Never'",
    ] {
        assert!(text.contains(needle), "policy does not mention {needle}");
    }
    let excluded = &policy["spec"]["matchConstraints"]["namespaceSelector"];
    for ns in SYSTEM_NAMESPACES {
        assert!(
            !select::matches(excluded, &labels(&[("kubernetes.io/metadata.name", ns)])),
            "{ns} must be excluded"
        );
    }
    // Research namespaces and research pod labels, each through its own binding: only research
    // pods are checked, and a missing research class denies research pods only.
    let research = labels(&[("nightshift.io/research", "true")]);
    let plain = labels(&[("app", "vllm")]);
    for (name, selector) in [
        (
            "nightshift-research-priority-namespaces",
            "namespaceSelector",
        ),
        ("nightshift-research-priority-pods", "objectSelector"),
    ] {
        let binding = base.get("ValidatingAdmissionPolicyBinding", name);
        assert_eq!(
            binding["spec"]["policyName"],
            "nightshift-research-priority"
        );
        assert_eq!(strings(&binding["spec"]["validationActions"]), ["Deny"]);
        assert_eq!(binding["spec"]["paramRef"]["name"], "nightshift-research");
        assert_eq!(
            binding["spec"]["paramRef"]["parameterNotFoundAction"],
            "Deny"
        );
        let sel = &binding["spec"]["matchResources"][selector];
        assert!(select::matches(sel, &research), "{name} selects research");
        assert!(
            !select::matches(sel, &plain),
            "{name} leaves other pods alone"
        );
    }
}

#[test]
fn priority_classes_put_research_below_everything_and_inference_above_it() {
    let Some(ws) = workspace() else { return };
    let base = ws.render("manifests/base");
    let research = base.get("PriorityClass", "nightshift-research");
    let inference = base.get("PriorityClass", "nightshift-inference");
    let research_value = research["value"].as_i64().expect("research value");
    let inference_value = inference["value"].as_i64().expect("inference value");
    assert!(
        research_value < 0,
        "research must be below pods without a class (0)"
    );
    assert_eq!(research["preemptionPolicy"], "Never");
    assert!(inference_value > 0);
    // User-defined classes may not exceed one billion.
    assert!(inference_value <= 1_000_000_000);
    assert_eq!(inference["preemptionPolicy"], "PreemptLowerPriority");
    for class in [research, inference] {
        assert_eq!(class["globalDefault"], false);
    }
}

/// Every `nightshift.io/...` label key written anywhere in `object`.
fn nightshift_label_keys(object: &Value) -> Vec<String> {
    let text = object.to_string();
    text.match_indices("nightshift.io/")
        .map(|(i, _)| {
            let rest = &text[i..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "./-_".contains(c)))
                .unwrap_or(rest.len());
            rest[..end].to_string()
        })
        .collect()
}

/// The single-quoted string literals of a CEL expression.
fn cel_literals(expression: &Value) -> Vec<&str> {
    expression
        .as_str()
        .expect("CEL expression")
        .split('\'')
        .skip(1)
        .step_by(2)
        .collect()
}

/// The admission objects name the research label and the PriorityClasses exactly as the
/// binary's defaults do, so that an unconfigured nightshift and its manifests agree.
#[test]
fn admission_objects_use_the_default_vocabulary() {
    let Some(ws) = workspace() else { return };
    let base = ws.render("manifests/base");

    let mut classes: Vec<&str> = base
        .all("PriorityClass")
        .into_iter()
        .map(|c| c["metadata"]["name"].as_str().expect("name"))
        .collect();
    classes.sort_unstable();
    let mut expected = [RESEARCH_PRIORITY_CLASS, INFERENCE_PRIORITY_CLASS];
    expected.sort_unstable();
    assert_eq!(classes, expected);

    let config = base.get("MutatingWebhookConfiguration", "nightshift");
    for w in config["webhooks"].as_array().expect("webhooks") {
        let name = &w["name"];
        let research: Vec<&Value> = w["namespaceSelector"]["matchExpressions"]
            .as_array()
            .expect("namespace matchExpressions")
            .iter()
            .filter(|e| e["key"] != "kubernetes.io/metadata.name")
            .collect();
        assert_eq!(research.len(), 1, "{name}: {research:?}");
        assert_eq!(research[0]["key"], RESEARCH_LABEL, "{name}");
        assert_eq!(strings(&research[0]["values"]), [TRUE], "{name}");
        if let Some(pod_labels) = w["objectSelector"]["matchLabels"].as_object() {
            assert_eq!(
                pod_labels.iter().collect::<Vec<_>>(),
                [(&RESEARCH_LABEL.to_string(), &Value::from(TRUE))],
                "{name}"
            );
        }
    }
    let keys = nightshift_label_keys(config);
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k == RESEARCH_LABEL), "{keys:?}");

    // The admission policy: research pods are selected by its bindings (research namespaces,
    // research pod labels) and the research class is its parameter.
    let policy = base.get("ValidatingAdmissionPolicy", "nightshift-research-priority");
    let validations = policy["spec"]["validations"]
        .as_array()
        .expect("validations");
    let class_literals: Vec<&str> = validations
        .iter()
        .flat_map(|v| cel_literals(&v["expression"]))
        .filter(|l| l.starts_with("nightshift"))
        .collect();
    assert!(
        class_literals.is_empty(),
        "the class comes from the parameter, not a literal: {class_literals:?}"
    );
    for v in validations {
        for message in [&v["message"], &v["messageExpression"]] {
            let text = message.as_str().unwrap_or_default();
            for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
                assert!(
                    !word.starts_with("nightshift-") || word == RESEARCH_PRIORITY_CLASS,
                    "the admission policy's message names {word:?}: {text}"
                );
            }
        }
    }
    assert!(nightshift_label_keys(policy).is_empty());
    for (name, selector) in [
        (
            "nightshift-research-priority-namespaces",
            "namespaceSelector",
        ),
        ("nightshift-research-priority-pods", "objectSelector"),
    ] {
        let binding = base.get("ValidatingAdmissionPolicyBinding", name);
        assert_eq!(
            binding["spec"]["paramRef"]["name"], RESEARCH_PRIORITY_CLASS,
            "{name}"
        );
        let labels = binding["spec"]["matchResources"][selector]["matchLabels"]
            .as_object()
            .expect("matchLabels");
        assert_eq!(
            labels.iter().collect::<Vec<_>>(),
            [(&RESEARCH_LABEL.to_string(), &Value::from(TRUE))],
            "{name}"
        );
    }
}

fn the_container(deployment: &Value) -> &Value {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 1);
    &containers[0]
}

fn container_port(container: &Value, name: &str) -> u64 {
    container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port named {name}"))
}

#[test]
fn deployment_is_highly_available_and_locked_down() {
    let Some(ws) = workspace() else { return };
    let base = ws.render("manifests/base");
    let deployment = base.get("Deployment", "nightshift");
    assert_eq!(deployment["metadata"]["namespace"], "nightshift-system");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "nightshift");
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert!(
        pod["affinity"]["podAntiAffinity"].is_object(),
        "replicas must spread"
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );

    let container = the_container(deployment);
    let sc = &container["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    for kind in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                container["resources"][kind][resource].is_string(),
                "{kind}.{resource}"
            );
        }
    }
    assert!(
        container["image"]
            .as_str()
            .expect("image")
            .contains("nightshift")
    );
    assert_eq!(strings(&container["args"]), ["run"]);

    assert_eq!(container_port(container, "grpc"), 6000);
    assert_eq!(container_port(container, "webhook"), 8443);
    assert_eq!(container_port(container, "admin"), 8080);
    assert_eq!(container_port(container, "view"), 8090);
    // Liveness over the scaler's gRPC health service, readiness over every component's /readyz
    // served on the webhook's HTTPS port.
    assert_eq!(container["livenessProbe"]["grpc"]["port"], 6000);
    let readiness = &container["readinessProbe"]["httpGet"];
    assert_eq!(readiness["path"], "/readyz");
    assert_eq!(readiness["port"], "webhook");
    assert_eq!(readiness["scheme"], "HTTPS");
    assert!(container["startupProbe"].is_object());

    // nightshift's own exclusion list matches the webhook configuration's.
    let env = |name: &str| {
        container["env"]
            .as_array()
            .expect("env")
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("no env {name}"))
            .clone()
    };
    let excluded = env("NIGHTSHIFT_WEBHOOK_EXCLUDED_NAMESPACES");
    let mut excluded: Vec<&str> = excluded["value"]
        .as_str()
        .expect("value")
        .split(',')
        .collect();
    excluded.sort();
    let mut system = SYSTEM_NAMESPACES.to_vec();
    system.sort();
    assert_eq!(excluded, system);
    // The certificate files are where the TLS Secret is mounted.
    let mount = container["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["name"] == "webhook-tls")
        .expect("webhook-tls mount")["mountPath"]
        .as_str()
        .expect("mountPath")
        .to_string();
    for (var, file) in [
        ("NIGHTSHIFT_WEBHOOK_CERT", "tls.crt"),
        ("NIGHTSHIFT_WEBHOOK_KEY", "tls.key"),
    ] {
        assert_eq!(env(var)["value"], format!("{mount}/{file}"));
    }
    assert_eq!(
        env("NIGHTSHIFT_POOL_LEASE_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );

    let pdb = base.get("PodDisruptionBudget", "nightshift");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
}

#[test]
fn service_exposes_scaler_webhook_admin_and_view_ports() {
    let Some(ws) = workspace() else { return };
    let base = ws.render("manifests/base");
    let service = base.get("Service", "nightshift");
    let deployment = base.get("Deployment", "nightshift");
    let container = the_container(deployment);
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["template"]["metadata"]["labels"]
    );
    let ports = service["spec"]["ports"].as_array().expect("ports");
    let mut seen: Vec<(u64, u64)> = ports
        .iter()
        .map(|p| {
            let port = p["port"].as_u64().expect("port");
            let target = match &p["targetPort"] {
                Value::String(name) => container_port(container, name),
                other => other.as_u64().expect("targetPort"),
            };
            (port, target)
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [(443, 8443), (6000, 6000), (8080, 8080), (8090, 8090)]
    );
}

#[test]
fn rbac_reads_cluster_state_and_writes_only_node_labels_notices_and_its_lease() {
    let Some(ws) = workspace() else { return };
    let base = ws.render("manifests/base");
    let role = base.get("ClusterRole", "nightshift");
    let mut grants: Vec<(String, String, Vec<String>)> = Vec::new();
    for rule in role["rules"].as_array().expect("rules") {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                let mut verbs: Vec<String> = strings(&rule["verbs"])
                    .into_iter()
                    .map(String::from)
                    .collect();
                verbs.sort();
                grants.push((group.into(), resource.into(), verbs));
            }
        }
    }
    grants.sort();
    let expect = |g: &str, r: &str, v: &[&str]| {
        (
            g.to_string(),
            r.to_string(),
            v.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(
        grants,
        [
            expect("", "namespaces", &["get", "list", "watch"]),
            expect("", "nodes", &["list", "patch", "watch"]),
            expect("", "pods", &["list", "watch"]),
            expect("", "pods", &["patch"]),
            expect("", "pods/status", &["patch"]),
            expect("apps", "deployments", &["get"]),
            expect("apps", "statefulsets", &["get"]),
            expect("discovery.k8s.io", "endpointslices", &["list", "watch"]),
            expect("events.k8s.io", "events", &["create", "patch"]),
            expect("keda.sh", "scaledobjects", &["list"]),
            expect("scheduling.k8s.io", "priorityclasses", &["list", "watch"]),
        ]
    );

    let lease_role = base.get("Role", "nightshift-leader-election");
    assert_eq!(lease_role["metadata"]["namespace"], "nightshift-system");
    let rules = lease_role["rules"].as_array().expect("rules");
    assert_eq!(rules.len(), 2);
    assert!(rules.iter().all(|r| strings(&r["resources"]) == ["leases"]));
    assert_eq!(strings(&rules[0]["verbs"]), ["create"]);
    assert_eq!(strings(&rules[1]["verbs"]), ["get", "update"]);
    // The one Lease the pool controller uses (its --pool-lease-name default).
    assert_eq!(strings(&rules[1]["resourceNames"]), ["nightshift-pool"]);

    for (kind, name) in [
        ("ClusterRoleBinding", "nightshift"),
        ("RoleBinding", "nightshift-leader-election"),
    ] {
        let subjects = &base.get(kind, name)["subjects"];
        assert_eq!(subjects[0]["name"], "nightshift", "{kind}");
        assert_eq!(subjects[0]["namespace"], "nightshift-system", "{kind}");
    }
}

#[test]
fn network_policy_admits_scaler_from_keda_admin_from_monitoring_and_view_from_ingress() {
    let Some(ws) = workspace() else { return };
    let base = ws.render("manifests/base");
    let policy = base.get("NetworkPolicy", "nightshift");
    let ingress = policy["spec"]["ingress"].as_array().expect("ingress");
    let sources_of = |port: u64| -> Vec<String> {
        ingress
            .iter()
            .filter(|rule| {
                rule["ports"]
                    .as_array()
                    .is_some_and(|ports| ports.iter().any(|p| p["port"] == port))
            })
            .flat_map(|rule| match rule["from"].as_array() {
                None => vec!["<anywhere>".to_string()],
                Some(from) => from
                    .iter()
                    .map(|peer| {
                        peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                            .as_str()
                            .unwrap_or("<other>")
                            .to_string()
                    })
                    .collect(),
            })
            .collect()
    };
    assert_eq!(sources_of(6000), ["keda"]);
    assert_eq!(sources_of(8080), ["monitoring"]);
    assert_eq!(sources_of(8090), ["ingress-nginx"]);
    assert_eq!(
        sources_of(8443),
        ["<anywhere>"],
        "the API server calls the webhook"
    );
}

#[test]
fn network_policy_namespaces_are_configurable_by_an_overlay() {
    let Some(ws) = workspace() else { return };
    ws.write(
        "custom/kustomization.yaml",
        r#"resources: [../manifests/overlays/cert-manager]
patches:
  - target: {kind: NetworkPolicy, name: nightshift}
    patch: |-
      - op: replace
        path: /spec/ingress/0/from/0/namespaceSelector/matchLabels/kubernetes.io~1metadata.name
        value: keda-system
      - op: replace
        path: /spec/ingress/1/from/0/namespaceSelector/matchLabels/kubernetes.io~1metadata.name
        value: observability
"#,
    );
    let rendered = ws.render("custom");
    let ingress = &rendered.get("NetworkPolicy", "nightshift")["spec"]["ingress"];
    let ns = |i: usize| ingress[i]["from"][0]["namespaceSelector"]["matchLabels"].clone();
    assert_eq!(ns(0)["kubernetes.io/metadata.name"], "keda-system");
    assert_eq!(ns(1)["kubernetes.io/metadata.name"], "observability");
}

fn decoded_ca_bundles(rendered: &Rendered) -> Vec<String> {
    let config = rendered.get("MutatingWebhookConfiguration", "nightshift");
    config["webhooks"]
        .as_array()
        .expect("webhooks")
        .iter()
        .map(|w| {
            let encoded: String = w["clientConfig"]["caBundle"]
                .as_str()
                .unwrap_or_else(|| panic!("{} has no caBundle", w["name"]))
                .split_whitespace()
                .collect();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .expect("caBundle is base64");
            String::from_utf8(bytes).expect("caBundle is PEM text")
        })
        .collect()
}

#[test]
fn self_signed_overlay_mounts_the_generated_certificate_and_trusts_its_ca() {
    let Some(ws) = workspace() else { return };
    let certs = ws.generate_certs("manifests/overlays/self-signed/certs");
    let rendered = ws.render("manifests/overlays/self-signed");

    for bundle in decoded_ca_bundles(&rendered) {
        assert_eq!(bundle, certs.ca_pem);
    }
    let secrets = rendered.all("Secret");
    assert_eq!(secrets.len(), 1);
    let secret = secrets[0];
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(secret["metadata"]["namespace"], "nightshift-system");
    let mut keys: Vec<&String> = secret["data"].as_object().expect("data").keys().collect();
    keys.sort();
    assert_eq!(keys, ["ca.crt", "tls.crt", "tls.key"]);

    // The Deployment mounts that Secret under its content-hashed name, so new certificates roll
    // the pods on the next apply.
    let deployment = rendered.get("Deployment", "nightshift");
    let volumes = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes");
    let tls = volumes
        .iter()
        .find(|v| v["name"] == "webhook-tls")
        .expect("webhook-tls volume");
    assert_eq!(tls["secret"]["secretName"], secret["metadata"]["name"]);
}

#[test]
fn cert_manager_overlay_injects_the_ca_of_the_mounted_certificate() {
    let Some(ws) = workspace() else { return };
    let rendered = ws.render("manifests/overlays/cert-manager");
    let config = rendered.get("MutatingWebhookConfiguration", "nightshift");
    let source = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        .as_str()
        .expect("inject-ca-from annotation");
    let (namespace, name) = source.split_once('/').expect("namespace/name");
    let certificate = rendered.get("Certificate", name);
    assert_eq!(certificate["metadata"]["namespace"], namespace);
    assert!(
        strings(&certificate["spec"]["dnsNames"]).contains(&"nightshift.nightshift-system.svc")
    );
    let issuer = certificate["spec"]["issuerRef"]["name"]
        .as_str()
        .expect("issuer");
    assert!(
        rendered.has("Issuer", issuer),
        "issuer {issuer} is not part of the overlay"
    );

    let deployment = rendered.get("Deployment", "nightshift");
    let volumes = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes");
    let tls = volumes
        .iter()
        .find(|v| v["name"] == "webhook-tls")
        .expect("webhook-tls volume");
    assert_eq!(
        tls["secret"]["secretName"],
        certificate["spec"]["secretName"]
    );
    assert!(
        rendered.all("Secret").is_empty(),
        "cert-manager creates the Secret"
    );
}

#[test]
fn local_overlay_calls_a_url_and_runs_no_workload_in_the_cluster() {
    let Some(ws) = workspace() else { return };
    let rendered = ws.render("manifests/overlays/local");
    let config = rendered.get("MutatingWebhookConfiguration", "nightshift");
    for w in config["webhooks"].as_array().expect("webhooks") {
        assert_eq!(w["clientConfig"]["url"], "https://127.0.0.1:8443/mutate");
        assert!(w["clientConfig"]["service"].is_null());
        assert_eq!(w["failurePolicy"], "Fail");
    }
    for kind in [
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
    ] {
        assert!(
            rendered.all(kind).is_empty(),
            "local overlay must not create a {kind}"
        );
    }
    // Everything the binary needs to run under the ServiceAccount is still there.
    for (kind, name) in [
        ("Namespace", "nightshift-system"),
        ("ServiceAccount", "nightshift"),
        ("ClusterRole", "nightshift"),
        ("ClusterRoleBinding", "nightshift"),
        ("Role", "nightshift-leader-election"),
        ("PriorityClass", "nightshift-research"),
        ("PriorityClass", "nightshift-inference"),
        ("ValidatingAdmissionPolicy", "nightshift-research-priority"),
    ] {
        assert!(
            rendered.has(kind, name),
            "local overlay lacks {kind} {name}"
        );
    }
}

/// The way the end-to-end tests use the local overlay: a kustomization of their own wraps it,
/// sets the port they listen on and fills caBundle from their generated CA. No Secret reaches
/// the cluster (the CA file is local configuration only).
#[test]
fn local_overlay_takes_a_ca_and_port_from_a_wrapping_kustomization() {
    let Some(ws) = workspace() else { return };
    let certs = ws.generate_certs("e2e/certs");
    // kustomize refuses absolute paths to other kustomizations: the path is relative.
    ws.write(
        "e2e/kustomization.yaml",
        &format!(
            r#"resources: ["{}"]
secretGenerator:
  - name: e2e-webhook-ca
    files: [ca.crt=certs/ca.crt]
    options:
      disableNameSuffixHash: true
      annotations:
        config.kubernetes.io/local-config: "true"
replacements:
  - source: {{kind: Secret, name: e2e-webhook-ca, fieldPath: "data.[ca.crt]"}}
    targets:
      - select: {{kind: MutatingWebhookConfiguration, name: nightshift}}
        fieldPaths: ["webhooks.*.clientConfig.caBundle"]
        options: {{create: true}}
patches:
  - target: {{kind: MutatingWebhookConfiguration, name: nightshift}}
    patch: |-
      - {{op: replace, path: /webhooks/0/clientConfig/url, value: "https://127.0.0.1:41443/mutate"}}
      - {{op: replace, path: /webhooks/1/clientConfig/url, value: "https://127.0.0.1:41443/mutate"}}
"#,
            "../manifests/overlays/local"
        ),
    );
    let rendered = ws.render("e2e");
    for bundle in decoded_ca_bundles(&rendered) {
        assert_eq!(bundle, certs.ca_pem);
    }
    let config = rendered.get("MutatingWebhookConfiguration", "nightshift");
    assert_eq!(
        config["webhooks"][0]["clientConfig"]["url"],
        "https://127.0.0.1:41443/mutate"
    );
    assert!(rendered.all("Secret").is_empty());
}

/// The schema check itself catches what it claims to: a misspelled field, a field at the wrong
/// level, a wrong type. (Runs without kustomize.)
#[test]
fn schema_check_reports_unknown_and_mistyped_fields() {
    let good = serde_json::json!({
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "x"},
        "value": -1000,
        "preemptionPolicy": "Never"
    });
    assert_eq!(schema::check(&good), Some(vec![]));

    let mut typo = good.clone();
    typo["preemptionPolicyy"] = "Never".into();
    let errors = schema::check(&typo).expect("known kind");
    assert!(
        errors.iter().any(|e| e.contains("preemptionPolicyy")),
        "{errors:?}"
    );

    let mut wrong_type = good.clone();
    wrong_type["value"] = "low".into();
    assert!(!schema::check(&wrong_type).expect("known kind").is_empty());

    let custom = serde_json::json!({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject"});
    assert_eq!(schema::check(&custom), None);
}

/// Every NIGHTSHIFT_* variable the Deployment sets is an option of `nightshift run` (a renamed
/// flag would otherwise be silently ignored in the cluster).
#[test]
fn deployment_environment_names_only_options_of_nightshift_run() {
    use clap::CommandFactory;
    // Options of the GPU-pool controller: `nightshift run` reads them once the pool controller is
    // part of it; until then they are inert.
    const POOL_OPTIONS: [&str; 2] = [
        "NIGHTSHIFT_POOL_LEASE_NAMESPACE",
        "NIGHTSHIFT_POOL_IDENTITY",
    ];

    let Some(ws) = workspace() else { return };
    let base = ws.render("manifests/base");
    let container = the_container(base.get("Deployment", "nightshift"));
    let cli = nightshift::cli::Cli::command();
    let run = cli.find_subcommand("run").expect("run subcommand");
    let known: Vec<String> = cli
        .get_arguments()
        .chain(run.get_arguments())
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect();
    let pool_known = POOL_OPTIONS.iter().any(|o| known.iter().any(|k| k == o));
    for var in container["env"].as_array().expect("env") {
        let name = var["name"].as_str().expect("name");
        if !name.starts_with("NIGHTSHIFT_") || (!pool_known && POOL_OPTIONS.contains(&name)) {
            continue;
        }
        assert!(
            known.iter().any(|k| k == name),
            "{name} is not an option of `nightshift run`"
        );
    }
}
