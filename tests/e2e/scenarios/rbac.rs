//! RBAC: nightshift runs with a token of the base manifests' ServiceAccount (TokenRequest API,
//! `kubectl create token`), bound to the base ClusterRole and leader-election Role and nothing
//! else, and every component works: the webhook's caches sync and it mutates pods, the pool
//! controller takes the Lease and writes spare marks, the scaler discovers a Service's
//! EndpointSlices, a research pod gets nightshift's `Lent` Event when it binds and `Preempted`
//! when the scheduler preempts it, the Job of research pods preempted with it gets one `Lent` and
//! one `Preempted` Event for its pods, a research pod that no spare GPU can take (inference
//! holds them all) gets a `NoSpareGPUs` Event, and so does its Job, and no API call is refused
//! (`Forbidden`) in its log.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use nightshift::scaler::service::proto::{
    GetMetricsRequest, ScaledObjectRef, external_scaler_client::ExternalScalerClient,
};
use serde_json::json;

use crate::harness::binary::{
    self, NAMESPACE, Nightshift, Registration, SPARE, SPARE_GPUS, Workspace, kubectl_ok,
    remove_spare_marks,
};
use crate::harness::cluster::{Cluster, GPU_NODES, GPUS_PER_NODE, POOL_LABEL};
use crate::harness::crds::{apply_crds, crd_dir};
use crate::harness::deploy::{forbidden_lines, service_account_kubeconfig, wait_webhook_active};
use crate::harness::objects::{self, is_bound, is_running, node_of};
use crate::harness::research::{assert_marked, create_pod, research_pod};
use crate::harness::victims;
use crate::harness::wait::{self, Check};

const NS: &str = "e2e-rbac";
/// Not a research namespace: its pod is inference, which preempts research.
const INFERENCE_NS: &str = "e2e-rbac-inference";
const SERVICE_ACCOUNT: &str = "nightshift";
const LEASE: &str = "nightshift-pool";
/// The reporting controller of nightshift's Events (the scheduler reports `Preempted` too).
const REPORTER: &str = "nightshift-pool";
/// A research Job whose pods run next to `under-rbac`, preempted with it.
const JOB: &str = "rbac-job";
const JOB_PODS: i32 = 2;
/// A research pod created once inference holds every GPU: it waits.
const WAITING: &str = "waits-for-gpus";
/// Far above the second the pool controller needs to write marks after its caches sync.
const STEP: Duration = Duration::from_secs(60);
/// A port nothing listens on, for the webhook URL until nightshift reports its real one (no
/// research pod is created in between).
const PLACEHOLDER_PORT: u16 = 9;

pub async fn run(cluster: Arc<Cluster>) -> Result<()> {
    let c = &*cluster;
    let result = scenario(c).await;
    // The Job goes first (see the harvest scenario: a namespace deleted under a running Indexed
    // Job keeps its pods for minutes).
    let job = match Api::<Job>::namespaced(c.client.clone(), NS)
        .delete(JOB, &DeleteParams::background())
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other.map(|_| ()).context("deleting the research Job"),
    };
    result
        .and(job)
        .and(binary::delete_namespace_now(c, NS).await)
        .and(binary::delete_namespace_now(c, INFERENCE_NS).await)
}

async fn scenario(c: &Cluster) -> Result<()> {
    let ws = Workspace::new()?;
    let _registration = Registration::new(c);
    // The overlay creates the ServiceAccount and its bindings; the webhook URL is set again
    // once nightshift has reported its port.
    ws.apply_local_overlay(c, PLACEHOLDER_PORT)?;
    // Start from nothing nightshift wrote before: no spare marks, no Lease.
    remove_spare_marks(c)?;
    kubectl_ok(
        c,
        &[
            "-n",
            NAMESPACE,
            "delete",
            "lease",
            LEASE,
            "--ignore-not-found",
        ],
        None,
    )?;

    let kubeconfig = service_account_kubeconfig(c, &ws)?;
    let sa = format!("system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}");
    // The token really is the ServiceAccount's, with the base rules and no more.
    let whoami = kubectl_ok(
        c,
        &[
            &format!("--kubeconfig={}", kubeconfig.display()),
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
        None,
    )?;
    ensure!(whoami.trim() == sa, "the token authenticates as {whoami}");
    for (verb, resource, allowed) in [
        ("watch", "namespaces", true),
        ("patch", "nodes", true),
        ("list", "endpointslices.discovery.k8s.io", true),
        ("create", "pods", false),
        ("patch", "pods", true),
        ("delete", "pods", false),
        ("update", "nodes", false),
        ("get", "secrets", false),
        ("create", "events.events.k8s.io", true),
        ("patch", "events.events.k8s.io", true),
        ("delete", "events.events.k8s.io", false),
        ("list", "events.events.k8s.io", false),
    ] {
        let out = c.kubectl(&["auth", "can-i", verb, resource, "-A", "--as", &sa], None)?;
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
        ensure!(
            (answer == "yes") == allowed,
            "{sa} can-i {verb} {resource}: {answer}, expected {}",
            if allowed { "yes" } else { "no" }
        );
    }

    let t = Instant::now();
    let mut ns = Nightshift::start(c, "nightshift-rbac", &kubeconfig, &ws.certs(), 0).await?;
    ws.apply_local_overlay(c, ns.webhook.port())?;
    ns.wait_ready().await?;
    eprintln!(
        "rbac: nightshift as {sa} ready (all caches synced) {:.2} s after start",
        t.elapsed().as_secs_f64()
    );

    // Pool controller: takes the Lease (create, then get/update) and writes the spare marks.
    let nodes: Api<Node> = Api::all(c.client.clone());
    let marked = wait::until(
        "spare marks on every GPU node, written by nightshift under the ServiceAccount",
        STEP,
        || {
            let running = ns.check_running();
            let nodes = nodes.clone();
            async move {
                running?;
                let list = nodes
                    .list(&ListParams::default().labels(POOL_LABEL))
                    .await?;
                let marked: Vec<(String, String)> = list
                    .items
                    .iter()
                    .filter_map(|n| {
                        let l = n.metadata.labels.as_ref()?;
                        Some((l.get(SPARE)?.clone(), l.get(SPARE_GPUS)?.clone()))
                    })
                    .collect();
                Ok(if marked.len() == GPU_NODES as usize {
                    Check::Done(marked)
                } else {
                    Check::Pending(format!("{} of {GPU_NODES} nodes marked", marked.len()))
                })
            }
        },
    )
    .await
    .with_context(|| format!("end of nightshift's log:\n{}", ns.log_tail(30)))?;
    for (spare, gpus) in &marked {
        ensure!(
            (spare == "true" || spare == "false") && gpus.parse::<u32>().is_ok(),
            "malformed spare marks {spare:?}/{gpus:?}"
        );
    }
    let lease = Api::<Lease>::namespaced(c.client.clone(), NAMESPACE)
        .get(LEASE)
        .await
        .context("the pool controller's Lease")?;
    ensure!(
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .is_some(),
        "the Lease has no holder: {lease:?}"
    );
    let status: serde_json::Value = serde_json::from_str(&ns.admin_get("/status").await?)?;
    ensure!(
        status["leader"] == true && status["synced"] == true,
        "/status: leader {}, synced {}",
        status["leader"],
        status["synced"]
    );

    // Webhook: namespace and PriorityClass caches (list/watch) and a namespace read (get).
    c.create_namespace(NS, json!({"nightshift.io/research": "true"}))
        .await?;
    wait_webhook_active(c, NS).await?;
    let pod = create_pod(&c.client, NS, research_pod("under-rbac", &[])).await?;
    assert_marked(&pod, true).context("research pod mutated by nightshift under RBAC")?;
    research_events_on_pods_and_their_job(c, &mut ns).await?;

    // Scaler: a trigger naming a Service makes it list/watch that Service's EndpointSlices.
    // The pods behind it are kwok's (nothing answers on their addresses), so the call itself
    // fails; what matters is that the API server let nightshift look.
    let services: Api<Service> = Api::namespaced(c.client.clone(), NS);
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "vllm"},
        "spec": {"selector": {"app": "vllm"}, "ports": [{"name": "http", "port": 8000}]},
    }))?;
    services.create(&PostParams::default(), &svc).await?;
    let mut scaler = ExternalScalerClient::connect(format!("http://{}", ns.scaler)).await?;
    let answer = scaler
        .get_metrics(GetMetricsRequest {
            scaled_object_ref: Some(ScaledObjectRef {
                name: "vllm".into(),
                namespace: NS.into(),
                scaler_metadata: [("service", "vllm"), ("waitingTarget", "1")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }),
            metric_name: "vllm-demand".into(),
        })
        .await;
    let answer = match answer {
        Ok(r) => format!("ok: {:?}", r.into_inner()),
        Err(s) => format!("{:?}: {}", s.code(), s.message()),
    };
    eprintln!("rbac: scaler GetMetrics for a Service trigger: {answer}");
    ensure!(
        !answer.to_lowercase().contains("forbidden"),
        "the scaler was refused: {answer}"
    );

    // Pool controller, reclaim notices: it lists the ScaledObjects and reads a nightshift
    // trigger's scale target. KEDA is not running yet: its CRD is applied as KEDA's start
    // applies it (server-side, so that the later apply is the same one).
    scaled_object_seen(c, &sa).await?;

    // The Lease is renewed (update) within a few seconds: wait for one renewal so that every
    // leader-election verb has been used.
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), NAMESPACE);
    let first = lease.metadata.resource_version.clone();
    wait::until("a renewal of the pool controller's Lease", STEP, || async {
        let l = leases.get(LEASE).await?;
        Ok(if l.metadata.resource_version != first {
            Check::Done(())
        } else {
            Check::Pending(format!("resourceVersion {first:?}"))
        })
    })
    .await?;

    ns.check_running()?;
    rbac_matches_audit(c, &sa).await?;
    let log = ns.log();
    let refused = forbidden_lines(&ns);
    ensure!(
        refused.is_empty(),
        "nightshift under the ServiceAccount was refused API calls:\n{}",
        refused.join("\n")
    );
    eprintln!(
        "rbac: webhook, pool controller and scaler work with the base ClusterRole/Role; \
         {} log lines, no Forbidden",
        log.lines().count()
    );
    Ok(())
}

/// Applies KEDA's ScaledObject CRD, a Deployment of no replica and a ScaledObject whose
/// nightshift trigger names the scaler's Service, and waits until nightshift (as `sa`) has read
/// the Deployment, the last call of a reclaim-notice pass, in the API server's audit log.
async fn scaled_object_seen(c: &Cluster, sa: &str) -> Result<()> {
    let crd = crd_dir()?.join("keda.sh_scaledobjects.yaml");
    apply_crds(c, &[crd])?;
    let deployment = objects::inference_deployment("vllm", 0, 4)?;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(c.client.clone(), NS);
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;
    let so = json!({
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": {"name": "vllm", "namespace": NS},
        "spec": {
            "scaleTargetRef": {"name": "vllm"},
            "triggers": [{"type": "external", "metadata": {
                "scalerAddress": "nightshift.nightshift-system:9090",
                "service": "vllm", "waitingTarget": "1",
            }}],
        },
    });
    kubectl_ok(c, &["apply", "-f", "-"], Some(&so.to_string()))?;
    let t = Instant::now();
    wait::until(
        "nightshift reading the ScaledObject's scale target",
        STEP,
        || async {
            let text = std::fs::read_to_string(&c.audit_log)?;
            let read = text.lines().any(|l| {
                l.contains(sa)
                    && l.contains("\"resource\":\"deployments\"")
                    && l.contains("\"verb\":\"get\"")
            });
            Ok(if read {
                Check::Done(())
            } else {
                Check::Pending("no read of the Deployment yet".into())
            })
        },
    )
    .await?;
    eprintln!(
        "rbac: ScaledObject listed and its Deployment read {:.2} s after it was created",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// nightshift's Events in the list about the `kind` named `name`, with `reason`.
fn ours<'a>(list: &'a [Event], kind: &str, name: &str, reason: &str) -> Vec<&'a Event> {
    list.iter()
        .filter(|e| {
            let regarding = e.regarding.as_ref();
            e.reason.as_deref() == Some(reason)
                && e.reporting_controller.as_deref() == Some(REPORTER)
                && regarding.and_then(|r| r.kind.as_deref()) == Some(kind)
                && regarding.and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect()
}

/// Waits until nightshift has recorded an Event of each `(kind, name, reason)`; returns the
/// first of each, in order.
async fn wait_events(
    ns: &mut Nightshift,
    events: &Api<Event>,
    what: &str,
    wanted: &[(&str, &str, &str)],
) -> Result<Vec<Event>> {
    wait::until(what, STEP, || {
        let running = ns.check_running();
        let events = events.clone();
        async move {
            running?;
            let list = events.list(&ListParams::default()).await?.items;
            let found: Vec<Option<&Event>> = wanted
                .iter()
                .map(|(kind, name, reason)| ours(&list, kind, name, reason).first().copied())
                .collect();
            Ok(if found.iter().all(Option::is_some) {
                Check::Done(found.into_iter().flatten().cloned().collect())
            } else {
                let missing: Vec<String> = wanted
                    .iter()
                    .zip(&found)
                    .filter(|(_, f)| f.is_none())
                    .map(|((kind, name, reason), _)| format!("{reason} on {kind} {name}"))
                    .collect();
                Check::Pending(format!("missing {}", missing.join(", ")))
            })
        }
    })
    .await
    .with_context(|| format!("end of nightshift's log:\n{}", ns.log_tail(30)))
}

/// The research pod `under-rbac` (one GPU) runs, and the `JOB_PODS` pods of a research Job
/// pinned to its node; an inference pod that only that node may take and that needs the whole
/// node makes the scheduler preempt all of them. The pool leader records a `Lent` Event when
/// each pod binds and a `Preempted` Event naming the node and the work lost, and one of each on
/// the Job for its pods together. Then inference takes every other GPU of the pool: a new
/// research pod waits and is told `NoSpareGPUs`, and so is the Job, whose replacement pods wait.
async fn research_events_on_pods_and_their_job(c: &Cluster, ns: &mut Nightshift) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let victim = wait::until("the research pod under-rbac running", STEP, || async {
        let p = pods.get("under-rbac").await?;
        Ok(match node_of(&p) {
            Some(node) if is_running(&p) => Check::Done((node.to_string(), p.metadata.uid.clone())),
            _ => Check::Pending("not running yet".into()),
        })
    })
    .await?;
    let (node, uid) = victim;
    let mut job = objects::indexed_research_job(JOB, JOB_PODS)?;
    if let Some(spec) = job.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        spec.node_selector
            .get_or_insert_with(Default::default)
            .insert("kubernetes.io/hostname".into(), node.clone());
    }
    let job = Api::<Job>::namespaced(c.client.clone(), NS)
        .create(&PostParams::default(), &job)
        .await
        .context("creating the research Job")?;
    let job_uid = job.metadata.uid.clone();
    let job_pods = format!("job-name={JOB}");
    victims::wait_pods(c, NS, &job_pods, JOB_PODS as usize, is_running, STEP).await?;

    objects::ensure_priority_classes(&c.client).await?;
    c.create_namespace(INFERENCE_NS, json!({})).await?;
    let t = Instant::now();
    create_pod(
        &c.client,
        INFERENCE_NS,
        objects::pinned_inference_pod("takes-the-node", &node, GPUS_PER_NODE),
    )
    .await?;
    let events: Api<Event> = Api::namespaced(c.client.clone(), NS);
    let found = wait_events(
        ns,
        &events,
        "nightshift's Lent and Preempted Events on the research pod",
        &[
            ("Pod", "under-rbac", "Lent"),
            ("Pod", "under-rbac", "Preempted"),
        ],
    )
    .await?;
    let (lent, event) = (&found[0], &found[1]);
    ensure!(
        lent.type_.as_deref() == Some("Normal")
            && lent
                .note
                .as_deref()
                .is_some_and(|n| n.contains(&format!("inference node {node}"))),
        "unexpected Lent event: {lent:?}"
    );
    let note = event.note.clone().unwrap_or_default();
    ensure!(
        event.type_.as_deref() == Some("Warning")
            && event.regarding.as_ref().and_then(|r| r.uid.clone()) == uid
            && note.contains(&format!("on node {node}"))
            && note.contains("after running")
            // The pod runs about a second here: "about N GPU-minutes of work lost" or, at
            // 0 s, "no work lost".
            && note.contains("work lost"),
        "unexpected event: {event:?}"
    );
    eprintln!(
        "rbac: research pod preempted on {node}; nightshift's Event {:.2} s after the inference \
         pod was created: {note}",
        t.elapsed().as_secs_f64()
    );

    // The Job is told of its pods together: one Lent and one Preempted Event for both.
    let found = wait_events(
        ns,
        &events,
        "nightshift's Lent and Preempted Events on the research Job",
        &[("Job", JOB, "Lent"), ("Job", JOB, "Preempted")],
    )
    .await?;
    let (lent, preempted) = (&found[0], &found[1]);
    for e in [lent, preempted] {
        let regarding = e.regarding.clone().unwrap_or_default();
        ensure!(
            regarding.uid == job_uid && regarding.api_version.as_deref() == Some("batch/v1"),
            "the Event does not regard the Job {JOB}: {e:?}"
        );
    }
    let lent_note = lent.note.clone().unwrap_or_default();
    ensure!(
        lent.type_.as_deref() == Some("Normal")
            && lent_note.starts_with(&format!("{JOB_PODS} pods of this Job bound to spare GPUs"))
            && lent_note.contains(&format!("(1 GPU of {node})")),
        "unexpected Lent event on the Job: {lent:?}"
    );
    let preempted_note = preempted.note.clone().unwrap_or_default();
    ensure!(
        preempted.type_.as_deref() == Some("Warning")
            && preempted_note.starts_with(&format!(
                "{JOB_PODS} pods of this Job preempted by the scheduler for inference"
            ))
            && preempted_note.contains(&format!("on {node} after running")),
        "unexpected Preempted event on the Job: {preempted:?}"
    );
    let list = events.list(&ListParams::default()).await?.items;
    for reason in ["Lent", "Preempted"] {
        let n = ours(&list, "Job", JOB, reason).len();
        ensure!(
            n == 1,
            "{n} {reason} Events on the Job for its {JOB_PODS} pods, not one"
        );
    }
    eprintln!(
        "rbac: the Job's Events {:.2} s after the inference pod was created: {lent_note} / \
         {preempted_note}",
        t.elapsed().as_secs_f64()
    );

    // The researchers' view of the running binary lists the preemption for the namespace.
    let view: serde_json::Value =
        serde_json::from_str(&ns.view_get(&format!("/api/view?namespace={NS}")).await?)?;
    let listed = view["preemptions"].as_array().is_some_and(|ps| {
        ps.iter()
            .any(|p| p["pod"] == "under-rbac" && p["node"] == *node)
    });
    ensure!(
        listed,
        "the view does not list the preemption: {}",
        view["preemptions"]
    );
    let page = ns.view_get(&format!("/?namespace={NS}")).await?;
    ensure!(
        page.contains("under-rbac") && page.contains("research of e2e-rbac"),
        "the page does not show the preemption"
    );

    // Inference takes every other GPU of the pool; then a research pod has nowhere to go.
    let t = Instant::now();
    for other in (0..GPU_NODES)
        .map(|i| format!("gpu-{i}"))
        .filter(|n| *n != node)
    {
        create_pod(
            &c.client,
            INFERENCE_NS,
            objects::pinned_inference_pod(&format!("takes-{other}"), &other, GPUS_PER_NODE),
        )
        .await?;
    }
    victims::wait_pods(
        c,
        INFERENCE_NS,
        "role=inference",
        GPU_NODES as usize,
        is_bound,
        STEP,
    )
    .await?;
    create_pod(&c.client, NS, research_pod(WAITING, &[])).await?;
    let found = wait_events(
        ns,
        &events,
        "nightshift's NoSpareGPUs Events on the waiting research pod and its Job",
        &[("Pod", WAITING, "NoSpareGPUs"), ("Job", JOB, "NoSpareGPUs")],
    )
    .await?;
    let (waiting, job_waiting) = (&found[0], &found[1]);
    let note = waiting.note.clone().unwrap_or_default();
    ensure!(
        waiting.type_.as_deref() == Some("Normal")
            && note.starts_with("Waiting for spare GPUs: every lendable GPU is in use ("),
        "unexpected NoSpareGPUs event: {waiting:?}"
    );
    let pod = pods.get(WAITING).await?;
    ensure!(
        node_of(&pod).is_none(),
        "{WAITING} was bound to {:?} although inference holds every GPU",
        node_of(&pod)
    );
    let job_note = job_waiting.note.clone().unwrap_or_default();
    ensure!(
        job_note.contains(&format!(" of this Job: {JOB}-"))
            && job_note.contains("every lendable GPU"),
        "unexpected NoSpareGPUs event on the Job: {job_waiting:?}"
    );
    eprintln!(
        "rbac: inference holds every GPU; {WAITING} told why {:.2} s after inference filled the \
         pool: {note}; on the Job: {job_note}",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Rules the base grants, as (API group, resource, verb).
type Grant = (String, String, String);

/// Compares the API calls nightshift made (the API server's audit log) with the rules of the
/// base ClusterRole and Role: no call was refused, every call is granted by those rules, and
/// every granted verb was used, except those that only a situation this scenario does not
/// create needs.
async fn rbac_matches_audit(c: &Cluster, sa: &str) -> Result<()> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
    use std::collections::BTreeSet;
    /// A namespace is read directly only when a pod arrives before the namespace is in the
    /// webhook's cache (created a moment before): not forced here.
    /// An Event is patched only when the same one repeats within minutes (kube's recorder
    /// counts it in a series): one preemption per pod does not.
    /// A reclaim notice (pods and pods/status patched) needs a research pod the scheduler is
    /// about to preempt: the notice scenario gives one, under the same ServiceAccount, and
    /// asserts nothing of nightshift's was refused. A StatefulSet scale target is not made here.
    const NOT_EXERCISED: &[(&str, &str, &str)] = &[
        ("", "namespaces", "get"),
        ("events.k8s.io", "events", "patch"),
        ("", "pods", "patch"),
        ("", "pods/status", "patch"),
        ("apps", "statefulsets", "get"),
    ];

    let expand = |rules: Option<Vec<PolicyRule>>| -> BTreeSet<Grant> {
        let mut out = BTreeSet::new();
        for r in rules.unwrap_or_default() {
            for g in r.api_groups.clone().unwrap_or_default() {
                for res in r.resources.clone().unwrap_or_default() {
                    for v in &r.verbs {
                        out.insert((g.clone(), res.clone(), v.clone()));
                    }
                }
            }
        }
        out
    };
    let mut granted = expand(
        Api::<ClusterRole>::all(c.client.clone())
            .get(SERVICE_ACCOUNT)
            .await?
            .rules,
    );
    granted.extend(expand(
        Api::<Role>::namespaced(c.client.clone(), NAMESPACE)
            .get("nightshift-leader-election")
            .await?
            .rules,
    ));

    let text = std::fs::read_to_string(&c.audit_log)
        .with_context(|| format!("reading {}", c.audit_log.display()))?;
    let mut used = BTreeSet::new();
    let mut refused = Vec::new();
    let mut calls = 0;
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        // The test's own `kubectl auth whoami` with the token is not nightshift's.
        let by_kubectl = e["userAgent"]
            .as_str()
            .is_some_and(|a| a.starts_with("kubectl"));
        if e["user"]["username"] != sa || e["objectRef"].is_null() || by_kubectl {
            continue;
        }
        calls += 1;
        let call: Grant = (
            e["objectRef"]["apiGroup"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            e["objectRef"]["resource"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            e["verb"].as_str().unwrap_or("").to_string(),
        );
        if e["responseStatus"]["code"] == 403 {
            refused.push(format!("{call:?} {}", e["requestURI"]));
        }
        used.insert(call);
    }
    ensure!(
        refused.is_empty(),
        "the API server refused nightshift's calls: {refused:?}"
    );
    let beyond: Vec<&Grant> = used.iter().filter(|u| !granted.contains(*u)).collect();
    ensure!(
        beyond.is_empty(),
        "nightshift made calls its ClusterRole/Role do not grant (allowed only by some default \
         role, which a hardened cluster may not have): {beyond:?}"
    );
    let unused: Vec<&Grant> = granted
        .iter()
        .filter(|g| !used.contains(*g))
        .filter(|(g, r, v)| !NOT_EXERCISED.contains(&(g.as_str(), r.as_str(), v.as_str())))
        .collect();
    ensure!(
        unused.is_empty(),
        "granted but never used by nightshift in this run (remove them, or list why in \
         NOT_EXERCISED): {unused:?}; used: {used:?}"
    );
    let show = |set: &BTreeSet<Grant>| {
        set.iter()
            .map(|(g, r, v)| {
                if g.is_empty() {
                    format!("{v} {r}")
                } else {
                    format!("{v} {r}.{g}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "rbac: audit log: {calls} API calls by {sa}, none refused; used: {}; granted: {} \
         (namespaces get is for cache misses only)",
        show(&used),
        granted.len()
    );
    Ok(())
}
