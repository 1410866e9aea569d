//! A realistic research pod of about 10 KB, as the API server sends it to webhooks: defaulted
//! fields, many environment variables, volumes, and a `last-applied-configuration` annotation.

use serde_json::{Value, json};

pub fn realistic_pod() -> Value {
    let env: Vec<Value> = (0..40)
        .map(|i| json!({"name": format!("TRAINING_PARAMETER_{i:02}"), "value": format!("s3://research-bucket/experiments/run-{i:04}/checkpoint")}))
        .collect();
    let mounts: Vec<Value> = (0..6)
        .map(|i| json!({"name": format!("data-{i}"), "mountPath": format!("/mnt/data-{i}"), "readOnly": i % 2 == 0}))
        .collect();
    let volumes: Vec<Value> = (0..6)
        .map(|i| json!({"name": format!("data-{i}"), "persistentVolumeClaim": {"claimName": format!("dataset-shard-{i}")}}))
        .collect();
    let container = |name: &str, gpus: &str| {
        json!({
            "name": name,
            "image": "registry.example.com/research/trainer@sha256:4f2a9c0e1d5b7a3c6e8f0a2b4c6d8e0f1a3b5c7d9e1f3a5b7c9d1e3f5a7b9c1d",
            "command": ["python", "-m", "trainer.main"],
            "args": ["--config", "/etc/trainer/config.yaml", "--resume", "--log-every", "50"],
            "env": env,
            "resources": {
                "limits": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": gpus},
                "requests": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": gpus}
            },
            "volumeMounts": mounts,
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
            "imagePullPolicy": "IfNotPresent"
        })
    };
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "sft-llama-7b-step-3-",
            "namespace": "research",
            "labels": {
                "app.kubernetes.io/name": "trainer",
                "workflows.argoproj.io/workflow": "sft-llama-7b",
                "workflows.argoproj.io/completed": "false",
                "team": "foundation-models"
            },
            "annotations": {
                "workflows.argoproj.io/node-name": "sft-llama-7b.train(0)",
                "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(1500)
            },
            "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "sft-llama-7b", "uid": "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4", "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "containers": [container("main", "8"), container("sidecar", "0")],
            "volumes": volumes,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 300,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "research-runner",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "fsGroup": 1000},
            "schedulerName": "default-scheduler",
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a", "zone-b"]}]}
            ]}}},
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ],
            "priority": 0,
            "preemptionPolicy": "PreemptLowerPriority",
            "enableServiceLinks": true
        }
    })
}

pub fn admission_review(pod: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "research",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:argo:argo-workflow-controller"},
            "object": pod,
            "dryRun": false
        }
    })
}
