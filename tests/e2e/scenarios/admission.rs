//! Mutation through the real admission chain: the nightshift binary runs outside the cluster,
//! its webhook is registered through `manifests/overlays/local`, and the assertions are on the
//! objects as the API server STORED them, after the built-in `Priority` plugin re-checked the
//! webhook's JSON Patch and the ValidatingAdmissionPolicy checked the final state.
//!
//! Also: every rendered kustomization (base, overlays) and example is validated by the API
//! server's schemas with `kubectl apply --dry-run=server`, custom kinds against the projects'
//! real CRDs (fetched by `tests/e2e/scripts/fetch-crds.sh`, installed by `harness::crds`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::harness::binary::{self, NAMESPACE, Workspace, kubectl_ok};
use crate::harness::cluster::Cluster;
use crate::harness::crds::{apply_crds, crd_dir};
use crate::harness::deploy::{deploy, wait_webhook_active};
use crate::harness::objects::{self, RESEARCH_VALUE, is_running};
use crate::harness::research::{
    assert_marked, assert_untouched, create_pod, get_pod, gpu_container, research_pod,
};
use crate::harness::wait::{self, Check};

const RESEARCH_NS: &str = "e2e-admission-research";
const PLAIN_NS: &str = "e2e-admission-plain";
const RESEARCH_LABEL: &str = "nightshift.io/research";
/// A class of a research pod's own, below the research class and never preempting: kept.
const SCAVENGER_CLASS: &str = "e2e-scavenger";
/// Below the research class but preempting: replaced by the research class.
const LOW_PREEMPTING_CLASS: &str = "e2e-low-preempting";
/// How long the controllers and the scheduler get for each step (they take about a second).
const STEP: Duration = Duration::from_secs(120);
/// Pods created one after another to measure admission latency through the webhook.
const LATENCY_SAMPLES: usize = 20;

pub async fn run(cluster: Arc<Cluster>) -> Result<()> {
    let c = &*cluster;
    let result = scenario(c).await;
    let cleanup = binary::delete_namespaces_now(c, &[RESEARCH_NS, PLAIN_NS]).await;
    result.and(cleanup)
}

async fn scenario(c: &Cluster) -> Result<()> {
    let client = c.client.clone();
    let (ws, mut ns, _registration) = deploy(c, "nightshift-admission").await?;
    c.create_namespace(RESEARCH_NS, json!({RESEARCH_LABEL: "true"}))
        .await?;
    c.create_namespace(PLAIN_NS, json!({})).await?;
    let active = wait_webhook_active(c, RESEARCH_NS).await?;
    eprintln!(
        "admission: webhook registered through the local overlay, answering after {:.2} s",
        active.as_secs_f64()
    );

    // A research GPU pod: the consistent priority triple, pool affinity and toleration, the lent
    // label, and the scheduler can place it on the pool.
    let pod = create_pod(&client, RESEARCH_NS, research_pod("gpu-research", &[])).await?;
    assert_marked(&pod, true).context("research GPU pod in a research namespace")?;
    wait_pod(c, RESEARCH_NS, "gpu-research", |p| {
        is_running(p) && objects::node_of(p).is_some_and(|n| n.starts_with("gpu-"))
    })
    .await
    .context("the mutated research pod must run on the GPU pool")?;

    // A pod that opts out with the label in a research namespace is still research.
    let pod = create_pod(
        &client,
        RESEARCH_NS,
        research_pod("opt-out", &[(RESEARCH_LABEL, "false")]),
    )
    .await?;
    assert_marked(&pod, true).context("a pod cannot opt out in a research namespace")?;

    // The user's own placement is kept: the pool requirement is ANDed into each of their
    // (ORed) node selector terms, their tolerations stay and the pool's is appended.
    let mut placed = research_pod("own-placement", &[]);
    placed["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]},
            {"matchExpressions": [{"key": "type", "operator": "In", "values": ["kwok"]}]},
        ],
    }}});
    placed["spec"]["tolerations"] = json!([{"key": "example.com/dedicated", "operator": "Exists"}]);
    let pod = create_pod(&client, RESEARCH_NS, placed).await?;
    assert_marked(&pod, true).context("research pod with its own affinity and tolerations")?;
    let spec = serde_json::to_value(pod.spec.as_ref())?;
    let terms = &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    ensure!(
        terms.as_array().map_or(0, Vec::len) == 2
            && terms[0]["matchExpressions"][0]["key"] == "kubernetes.io/os"
            && terms[1]["matchExpressions"][0]["key"] == "type",
        "the user's node selector terms were not kept: {terms}"
    );
    ensure!(
        spec["tolerations"]
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["key"] == "example.com/dedicated")),
        "the user's toleration was dropped: {}",
        spec["tolerations"]
    );

    // A research pod asking for inference priority is overridden, with a warning to the user.
    let mut high = research_pod("asks-high", &[]);
    high["spec"]["priorityClassName"] = json!(objects::INFERENCE_CLASS);
    let out = c.kubectl(
        &["create", "-n", RESEARCH_NS, "-f", "-"],
        Some(&high.to_string()),
    )?;
    ensure!(
        out.status.success(),
        "creating a research pod with a high class failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        stderr.contains("Warning:")
            && stderr.contains(&format!(
                "priorityClassName \"{}\" replaced",
                objects::INFERENCE_CLASS
            )),
        "kubectl did not show the webhook's override warning; stderr: {stderr}"
    );
    let pod = get_pod(&client, RESEARCH_NS, "asks-high").await?;
    assert_marked(&pod, true).context("research pod that asked for nightshift-inference")?;

    // One rule for a research pod's own class, the webhook's and the admission policy's: a class
    // no higher than the research class that never preempts is kept; one that preempts is not.
    objects::ensure_priority_class(&client, SCAVENGER_CLASS, RESEARCH_VALUE - 4000, "Never")
        .await?;
    objects::ensure_priority_class(
        &client,
        LOW_PREEMPTING_CLASS,
        RESEARCH_VALUE - 4000,
        "PreemptLowerPriority",
    )
    .await?;
    let mut own = research_pod("own-lower-class", &[]);
    own["spec"]["priorityClassName"] = json!(SCAVENGER_CLASS);
    let pod = create_pod(&client, RESEARCH_NS, own).await?;
    let spec = pod.spec.as_ref().context("pod without spec")?;
    ensure!(
        spec.priority_class_name.as_deref() == Some(SCAVENGER_CLASS)
            && spec.priority == Some(RESEARCH_VALUE - 4000)
            && spec.preemption_policy.as_deref() == Some("Never"),
        "a research pod's own lower, non-preempting class must be kept: class {:?}, priority \
         {:?}, preemptionPolicy {:?}",
        spec.priority_class_name,
        spec.priority,
        spec.preemption_policy
    );
    let mut preempting = research_pod("own-preempting-class", &[]);
    preempting["spec"]["priorityClassName"] = json!(LOW_PREEMPTING_CLASS);
    let pod = create_pod(&client, RESEARCH_NS, preempting).await?;
    assert_marked(&pod, true).context("research pod whose own low class preempts")?;

    // A CPU-only research pod: low priority and the label, but no GPU-pool placement.
    let mut cpu = research_pod("cpu-research", &[]);
    cpu["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100m"}});
    let pod = create_pod(&client, RESEARCH_NS, cpu).await?;
    assert_marked(&pod, false).context("CPU-only research pod")?;

    // A pod labelled for research in an ordinary namespace goes through the second webhook.
    let pod = create_pod(
        &client,
        PLAIN_NS,
        research_pod("labelled", &[(RESEARCH_LABEL, "true")]),
    )
    .await?;
    assert_marked(&pod, true).context("pod labelled research in an ordinary namespace")?;

    // Not research: untouched.
    let pod = create_pod(&client, PLAIN_NS, research_pod("plain", &[])).await?;
    assert_untouched(&pod).context("ordinary pod in an ordinary namespace")?;
    // kube-system is never sent, even with the research label.
    let pod = create_pod(
        &client,
        "kube-system",
        research_pod("e2e-labelled-system", &[(RESEARCH_LABEL, "true")]),
    )
    .await?;
    let system_untouched = assert_untouched(&pod);
    let _ = Api::<Pod>::namespaced(client.clone(), "kube-system")
        .delete("e2e-labelled-system", &Default::default())
        .await;
    system_untouched.context("research-labelled pod in kube-system")?;

    // Pods created by controllers: a Job and a Deployment in the research namespace.
    let jobs: Api<Job> = Api::namespaced(client.clone(), RESEARCH_NS);
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "parallelism": 2, "completions": 2, "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app": "train"}},
                "spec": {"restartPolicy": "Never", "containers": [gpu_container()]},
            },
        },
    }))?;
    jobs.create(&PostParams::default(), &job).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), RESEARCH_NS);
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "notebook"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "notebook"}},
            "template": {
                "metadata": {"labels": {"app": "notebook"}},
                "spec": {"containers": [gpu_container()]},
            },
        },
    }))?;
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;
    for app in ["train", "notebook"] {
        let pods = wait::until(
            &format!("2 running pods of {app} in {RESEARCH_NS}"),
            STEP,
            || async {
                c.check_processes()?;
                let pods = objects::pods(&client, RESEARCH_NS, &format!("app={app}")).await?;
                let running = pods.values().filter(|p| is_running(p)).count();
                Ok(if running == 2 {
                    Check::Done(pods)
                } else {
                    Check::Pending(format!("{running} running of {}", pods.len()))
                })
            },
        )
        .await?;
        for (name, pod) in &pods {
            assert_marked(pod, true)
                .with_context(|| format!("pod {name} created by the {app} controller"))?;
            ensure!(
                objects::node_of(pod).is_some_and(|n| n.starts_with("gpu-")),
                "pod {name} of {app} runs outside the GPU pool"
            );
        }
    }

    // Admission latency of research pods through the whole chain (webhook over HTTPS included).
    let mut latencies = Vec::with_capacity(LATENCY_SAMPLES);
    for i in 0..LATENCY_SAMPLES {
        let t = Instant::now();
        let pod = create_pod(
            &client,
            RESEARCH_NS,
            research_pod(&format!("latency-{i}"), &[]),
        )
        .await?;
        latencies.push(t.elapsed());
        assert_marked(&pod, true)?;
    }
    latencies.sort();
    eprintln!(
        "admission: {LATENCY_SAMPLES} research pods created one by one through the webhook: \
         p50 {:.1} ms, max {:.1} ms",
        ms(latencies[LATENCY_SAMPLES / 2]),
        ms(latencies[LATENCY_SAMPLES - 1])
    );
    let mutated = ns
        .metric("nightshift_webhook_admissions_total")
        .await
        .unwrap_or(0.0);
    eprintln!("admission: nightshift answered {mutated} admission reviews");
    ns.check_running()?;

    dry_run_manifests(c, &ws).await?;
    ns.check_running()?;
    Ok(())
}

async fn wait_pod(c: &Cluster, ns: &str, name: &str, ok: impl Fn(&Pod) -> bool) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let ok = &ok;
    wait::until(&format!("pod {ns}/{name}"), STEP, || {
        let pods = pods.clone();
        async move {
            c.check_processes()?;
            let p = pods.get(name).await?;
            Ok(if ok(&p) {
                Check::Done(())
            } else {
                Check::Pending(format!(
                    "phase {:?}, node {:?}",
                    p.status.as_ref().and_then(|s| s.phase.clone()),
                    objects::node_of(&p)
                ))
            })
        }
    })
    .await
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `kubectl apply --dry-run=server` of every rendered kustomization and example, custom kinds
/// against the projects' CRDs (installed for the check, removed after).
async fn dry_run_manifests(c: &Cluster, ws: &Workspace) -> Result<()> {
    let crd_dir = crd_dir()?;
    let mut crd_files: Vec<PathBuf> = std::fs::read_dir(&crd_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    crd_files.sort();
    ensure!(
        !crd_files.is_empty(),
        "no CRD files in {}",
        crd_dir.display()
    );
    let _crds = Crds {
        cluster: c,
        files: crd_files.clone(),
    };
    apply_crds(c, &crd_files)?;

    // The self-signed overlay renders only with certificates in its certs/ directory.
    binary::generate_certs(&ws.root().join("manifests/overlays/self-signed/certs"))?;
    let rendered = ws.root().join("rendered");
    let out = std::process::Command::new("bash")
        .arg(ws.root().join("manifests/render.sh"))
        .arg(&rendered)
        .env("NIGHTSHIFT_KUSTOMIZE", binary::kustomize()?)
        .output()?;
    ensure!(
        out.status.success(),
        "manifests/render.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(&rendered)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let expected = [
        "manifests_base.yaml",
        "manifests_overlays_local.yaml",
        "manifests_overlays_self-signed.yaml",
        "manifests_overlays_cert-manager.yaml",
        "manifests_examples_research.yaml",
        "manifests_examples_vllm.yaml",
        "manifests_examples_monitoring.yaml",
    ];
    for e in expected {
        ensure!(
            files.iter().any(|f| f.ends_with(e)),
            "render.sh did not produce {e}: {files:?}"
        );
    }

    // Namespaced objects need their namespace to exist even in a dry-run: create the ones the
    // examples use (nightshift-system exists: the local overlay created it).
    let mut namespaces = std::collections::BTreeSet::new();
    let mut kinds = std::collections::BTreeSet::new();
    for f in &files {
        for doc in documents(f)? {
            if let Some(n) = doc["metadata"]["namespace"].as_str() {
                namespaces.insert(n.to_string());
            }
            if doc["kind"] == "Namespace"
                && let Some(n) = doc["metadata"]["name"].as_str()
            {
                namespaces.insert(n.to_string());
            }
            kinds.insert(format!(
                "{}/{}",
                doc["apiVersion"].as_str().unwrap_or("?"),
                doc["kind"].as_str().unwrap_or("?")
            ));
        }
    }
    let existing: Vec<String> = kubectl_ok(c, &["get", "ns", "-o", "name"], None)?
        .lines()
        .map(|l| l.trim_start_matches("namespace/").to_string())
        .collect();
    let created: Vec<String> = namespaces
        .iter()
        .filter(|n| !existing.contains(n))
        .cloned()
        .collect();
    for n in &created {
        c.create_namespace(n, json!({})).await?;
    }
    let t = Instant::now();
    let mut failures = Vec::new();
    for f in &files {
        let out = c.kubectl(
            &["apply", "--dry-run=server", "-f", &f.display().to_string()],
            None,
        )?;
        if !out.status.success() {
            failures.push(format!(
                "{}: {}",
                f.file_name().unwrap_or_default().to_string_lossy(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    // Negative control: the same check refuses a custom object with a misspelt field, so the
    // CRD schemas really are enforced (kubectl's default field validation is Strict).
    let bogus = json!({
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": {"name": "bogus", "namespace": NAMESPACE},
        "spec": {"scaleTargetRef": {"name": "x"}, "triggers": [], "pollingIntervall": 5},
    });
    let out = c.kubectl(
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&bogus.to_string()),
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || !stderr.contains("pollingIntervall") {
        failures.push(format!(
            "a ScaledObject with an unknown field was not rejected: {stderr}"
        ));
    }
    let created: Vec<&str> = created.iter().map(String::as_str).collect();
    binary::delete_namespaces_now(c, &created).await?;
    if !failures.is_empty() {
        bail!(
            "server-side dry-run rejected rendered manifests:\n{}",
            failures.join("\n")
        );
    }
    eprintln!(
        "admission: server-side dry-run accepted {} rendered files in {:.1} s; kinds: {}",
        files.len(),
        t.elapsed().as_secs_f64(),
        kinds.into_iter().collect::<Vec<_>>().join(", ")
    );
    Ok(())
}

/// The parsed YAML documents of a file.
fn documents(path: &Path) -> Result<Vec<Value>> {
    use serde::Deserialize;
    let text = std::fs::read_to_string(path)?;
    let mut docs = Vec::new();
    for d in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = Value::deserialize(d).with_context(|| format!("parsing {}", path.display()))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

/// Deletes the CRDs installed for the dry-run when dropped.
struct Crds<'a> {
    cluster: &'a Cluster,
    files: Vec<PathBuf>,
}

impl Drop for Crds<'_> {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = self.cluster.kubectl(
                &[
                    "delete",
                    "--ignore-not-found",
                    "--wait=false",
                    "-f",
                    &f.display().to_string(),
                ],
                None,
            );
        }
    }
}
