//! GPU-pool accounting at the target size: 1,000 nodes × 8 GPUs, 20,000 pods.
//!
//! `cargo bench --bench pool -- --warm-up-time 1 --measurement-time 3`
//! Targets: full recount ≤ 5 ms, one pod event ≤ 50 µs, ledger memory ≤ 100 MiB.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use nightshift::{
    core::vocabulary::Vocabulary,
    pool::{
        accounting::{Ledger, NodeFacts, PodFacts, node_facts, pod_facts},
        controller::{Controller, LendingPolicy, Metrics},
        marks,
        windows::Windows,
    },
    test_support::fixtures::{node, pod},
};

const NODES: usize = 1_000;
const GPUS_PER_NODE: u64 = 8;
const PODS: usize = 20_000;

fn node_name(i: usize) -> String {
    format!("gpu-node-{i:04}.pool.example.internal")
}

/// A realistic mix per node (20 pods): 2 inference pods of 2 GPUs, 1 research pod of 2 GPUs,
/// 1 finished research pod, 16 GPU-less pods (daemons, sidecar services).
fn pod_object(i: usize) -> Pod {
    let node = node_name(i % NODES);
    let slot = i / NODES;
    let name = format!("workload-{slot:02}-{i:06}-abcde");
    let ns = if slot < 2 { "inference" } else { "research" };
    let p = pod(ns, &name).on(&node);
    match slot {
        0 | 1 => p.gpus(2),
        2 => p.gpus(2).research(),
        3 => p.gpus(2).research().phase("Succeeded"),
        _ => p,
    }
    .build()
}

fn cluster() -> (Vec<NodeFacts>, Vec<PodFacts>) {
    let names = Vocabulary::default();
    let nodes = (0..NODES)
        .map(|i| node_facts(&node(&node_name(i), GPUS_PER_NODE).build(), &names))
        .collect();
    let pods = (0..PODS)
        .map(|i| pod_facts(&pod_object(i), &names))
        .collect();
    (nodes, pods)
}

fn loaded_ledger() -> Ledger {
    let (nodes, pods) = cluster();
    let mut l = Ledger::new();
    l.replace_nodes(nodes);
    l.replace_pods(pods);
    l
}

fn rss_bytes() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    // Linux x86-64 page size.
    Some(pages * 4096)
}

fn memory_figure() {
    let before = rss_bytes();
    let l = loaded_ledger();
    let after = rss_bytes();
    let t = l.totals();
    println!(
        "pool memory: ledger of {NODES} nodes and {} pods ≈ {:.1} MiB (estimated heap), \
         RSS growth {} MiB; totals protected={} lent={} free={}",
        l.pod_count(),
        l.approx_heap_bytes() as f64 / (1 << 20) as f64,
        match (before, after) {
            (Some(b), Some(a)) => format!("{:.1}", a.saturating_sub(b) as f64 / (1 << 20) as f64),
            _ => "?".to_string(),
        },
        t.protected,
        t.lent,
        t.free,
    );
    black_box(l);
}

fn benches(c: &mut Criterion) {
    memory_figure();
    let now = Timestamp::from_second(2_000_000_000).unwrap_or(Timestamp::UNIX_EPOCH);

    let mut ledger = loaded_ledger();
    c.bench_function("pool/full_recount_1000_nodes_20000_pods", |b| {
        b.iter(|| {
            ledger.recount();
            black_box(ledger.totals())
        })
    });

    let (_, pods) = cluster();
    c.bench_function("pool/full_relist_replace_20000_pods", |b| {
        b.iter_batched(
            || pods.clone(),
            |p| {
                ledger.replace_pods(p);
                black_box(ledger.totals())
            },
            BatchSize::LargeInput,
        )
    });

    c.bench_function("pool/plan_and_diff_1000_nodes", |b| {
        b.iter(|| {
            let plan = marks::plan(&ledger, 16, true);
            black_box(marks::diff(&ledger, &plan))
        })
    });

    // One pod event end to end: facts from the Pod object, ledger update, disruption check.
    let mut controller = Controller::new(
        LendingPolicy {
            vocabulary: Vocabulary::default(),
            headroom: 16,
            windows: Windows::default(),
        },
        Metrics::default(),
    );
    controller.on_node_event(watcher::Event::Init);
    for i in 0..NODES {
        controller.on_node_event(watcher::Event::InitApply(
            node(&node_name(i), GPUS_PER_NODE).build(),
        ));
    }
    controller.on_node_event(watcher::Event::InitDone);
    controller.on_pod_event(watcher::Event::Init, now);
    for i in 0..PODS {
        controller.on_pod_event(watcher::Event::InitApply(pod_object(i)), now);
    }
    controller.on_pod_event(watcher::Event::InitDone, now);
    let small = pod("research", "job-x")
        .on(&node_name(7))
        .gpus(1)
        .research()
        .build();
    let big = pod("research", "job-x")
        .on(&node_name(7))
        .gpus(4)
        .research()
        .build();
    let mut flip = false;
    c.bench_function("pool/incremental_pod_event", |b| {
        b.iter_batched(
            || {
                flip = !flip;
                if flip { small.clone() } else { big.clone() }
            },
            |p| controller.on_pod_event(watcher::Event::Apply(p), now),
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(pool, benches);
criterion_main!(pool);
