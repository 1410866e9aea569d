#!/usr/bin/env python3
"""Writes the fuzz targets' seed inputs from the repository's real samples.

Run after changing a sample: `python3 fuzz/seeds/make-seeds.py [path/to/nightshift]` (the
binary, when given, prints the default scenario for the scenario seed). The output is committed,
small on purpose: the fuzzer grows its own corpus under fuzz/corpus/, which is not committed.
"""
import copy
import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.dirname(__file__)


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(os.path.join(d, name), mode) as f:
        f.write(data)


def review(pod, namespace="research", operation="CREATE"):
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }, indent=1)


# Admission: the research Job's pod template as the API server defaults it, plus variants.
with open(os.path.join(ROOT, "manifests/examples/research/job.yaml")) as f:
    job = yaml.safe_load(f)
template = job["spec"]["template"]
pod = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": dict(template["metadata"], generateName="sft-llama-8b-", namespace="research"),
    "spec": dict(template["spec"], priority=0, preemptionPolicy="PreemptLowerPriority",
                 schedulerName="default-scheduler",
                 tolerations=[{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                               "effect": "NoExecute", "tolerationSeconds": 300}]),
}
write("admission", "job-pod.json", review(pod))
cpu = copy.deepcopy(pod)
for c in cpu["spec"]["containers"]:
    c["resources"] = {"requests": {"cpu": "2"}}
cpu["metadata"]["labels"]["nightshift.io/research"] = "true"
write("admission", "cpu-pod-labelled.json", review(cpu, namespace="team-a"))
affine = copy.deepcopy(pod)
affine["spec"]["affinity"] = {"nodeAffinity": {
    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu.type", "operator": "In", "values": ["h100"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}]},
    "preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [
            {"key": "zone", "operator": "Exists"}]}}]}}
affine["spec"]["priorityClassName"] = "nightshift-inference"
affine["spec"]["terminationGracePeriodSeconds"] = 600
affine["spec"]["initContainers"] = [{"name": "fetch", "image": "x",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
write("admission", "affinity-pod.json", review(affine))
write("admission", "update.json", review(pod, operation="UPDATE"))
# Found by fuzzing: entries no Pod has, in a list the review skips as text (docs/fuzzing.md).
mistyped = copy.deepcopy(pod)
mistyped["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}, {"name": True}]
write("admission", "mistyped-env.json", review(mistyped))
huge = copy.deepcopy(pod)
huge["spec"]["containers"][0]["env"] = [{"name": "A", "value": "HUGE"}]
write("admission", "huge-number.json", review(huge).replace('"HUGE"', "73e33300"))

# Exposition: a vLLM /metrics excerpt (two engines of one model; old and new KV-cache names).
write("exposition", "vllm-metrics.txt", """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 9.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.4375
vllm:gpu_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.21
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.234567e+06
vllm:generation_tokens_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 40.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 52.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 52.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.5
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1234.5
""")

# Prometheus HTTP API answers: a family query's vector, a scalar, a matrix, an error.
series = lambda pod, v: {"metric": {"namespace": "inference", "model_name": "llama-3.1-70b",
                                    "pod": pod}, "value": [1764518400.123, v]}
write("prometheus_answer", "vector.json", json.dumps({"status": "success", "data": {
    "resultType": "vector", "result": [series("vllm-llama-0", "3"), series("vllm-llama-1", "0.5")]}}))
write("prometheus_answer", "empty-vector.json",
      json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}))
write("prometheus_answer", "scalar.json",
      json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [1764518400, "2.5"]}}))
write("prometheus_answer", "matrix.json", json.dumps({"status": "success", "data": {
    "resultType": "matrix", "result": [{"metric": {"pod": "a"}, "values": [[1, "1"], [2, "NaN"]]}]}}))
write("prometheus_answer", "error.json", json.dumps({
    "status": "error", "errorType": "bad_data", "error": "parse error at char 4"}))

# Trigger metadata: the examples' triggers, the ScaledObject's namespace on the first line.
with open(os.path.join(ROOT, "manifests/examples/vllm/scaledobject.yaml")) as f:
    so = yaml.safe_load(f)
for i, trig in enumerate(so["spec"]["triggers"]):
    lines = [so["metadata"]["namespace"]] + [f"{k}: {v}" for k, v in trig["metadata"].items()]
    write("trigger_metadata", f"example-{i}.txt", "\n".join(lines) + "\n")
write("trigger_metadata", "prometheus.txt", """inference
scalerAddress: nightshift.nightshift-system.svc:6000
serverAddress: http://prometheus.monitoring:9090
model: llama-3.1-70b
namespaceLabel: namespace
podLabel: pod
metricLabels: job=vllm,cluster=a
rateWindow: 2m
timeout: 3s
waitingTarget: 5
generationTokensTarget: 800
customHeaders: X-Scope-OrgID=team-a
username: u
password: p
emptyResult: error
""")
write("trigger_metadata", "endpoints-query.txt", """inference
endpoints: 10.0.0.1:8000,10.0.0.2:8000
scheme: http
metricsPath: /metrics
query: sum(vllm:num_requests_waiting)
queryTarget: 4
activationThreshold: 0.5
""")

# Trace: the head of the bundled Azure trace, and a few lines out of order.
with open(os.path.join(ROOT, "data/traces/azure-llm-2023-conv.csv")) as f:
    head = [next(f) for _ in range(25)]
write("trace_csv", "azure-head.csv", "".join(head))
write("trace_csv", "unordered.csv", head[0] + head[5] + "\n" + head[2] + head[9])

# Scenario: every field at its default (as `nightshift simulate --print-config` prints it), and
# a partial override as a user writes one.
if len(sys.argv) > 1:
    default = subprocess.run([sys.argv[1], "simulate", "--print-config"], check=True,
                             capture_output=True, text=True).stdout
    write("scenario_toml", "default.toml", default)
write("scenario_toml", "override.toml", """\
[run]
days = 1.5
seed = 42

[envelope]
hourly = [0.2, 0.2, 0.2, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0, 3.5, 4.0, 4.0, 4.0, 4.0, 3.5, 3.0, 2.5, 2.0,
          1.5, 1.0, 0.8, 0.5, 0.3, 0.2]

[pool]
nodes = 4
""")
