//! The researchers' view at the target size: 1,000 nodes × 8 GPUs, 20,000 pods, research in 50
//! namespaces, 100 recent preemptions, a full week of history (10,080 samples) and a week of
//! demand and replicas for 50 inference services.
//!
//! `cargo bench --bench view -- --warm-up-time 1 --measurement-time 3`
//! Targets: page ≤ 5 ms, JSON ≤ 2 ms (from the view data); building the view data from the
//! controller is measured too.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use jiff::Timestamp;
use kube::runtime::watcher;
use nightshift::{
    core::vocabulary::Vocabulary,
    pool::{
        controller::{Controller, LendingPolicy, Metrics},
        history::{CAPACITY, SAMPLE_SECONDS, Sample},
        windows::Windows,
    },
    test_support::fixtures::{node, pod},
    view::{
        html,
        model::{self, HistoryOrigin, Timeline},
        services::{POINTS, STEP, ServiceKey, Services},
    },
};

const NODES: usize = 1_000;
const GPUS_PER_NODE: u64 = 8;
const PODS: usize = 20_000;
const NAMESPACES: usize = 50;
const PREEMPTED: usize = 100;
const SERVICES: usize = 50;

fn node_name(i: usize) -> String {
    format!("gpu-node-{i:04}.pool.example.internal")
}

/// Per node (20 pods): 2 inference pods of 2 GPUs, 1 research pod of 2 GPUs, 1 waiting research
/// pod, 16 GPU-less pods.
fn loaded() -> Controller {
    let now = Timestamp::now();
    let mut c = Controller::new(
        LendingPolicy {
            vocabulary: Vocabulary::default(),
            headroom: 64,
            windows: Windows::default(),
        },
        Metrics::default(),
    );
    c.on_node_event(watcher::Event::Init);
    for i in 0..NODES {
        c.on_node_event(watcher::Event::InitApply(
            node(&node_name(i), GPUS_PER_NODE).build(),
        ));
    }
    c.on_node_event(watcher::Event::InitDone);
    c.on_pod_event(watcher::Event::Init, now);
    for i in 0..PODS {
        let slot = i / NODES;
        let team = format!("team-{:02}", i % NAMESPACES);
        let name = format!("workload-{slot:02}-{i:06}-abcde");
        let p = match slot {
            0 | 1 => pod("inference", &name).on(&node_name(i % NODES)).gpus(2),
            2 => pod(&team, &name)
                .on(&node_name(i % NODES))
                .gpus(2)
                .research(),
            3 => pod(&team, &name).unbound().gpus(2).research(),
            _ => pod("services", &name).on(&node_name(i % NODES)),
        };
        c.on_pod_event(watcher::Event::InitApply(p.build()), now);
    }
    c.on_pod_event(watcher::Event::InitDone, now);
    let started = now
        .checked_sub(jiff::SignedDuration::from_secs(3600))
        .expect("ts");
    for i in 0..PREEMPTED {
        let p = pod(
            &format!("team-{:02}", i % NAMESPACES),
            &format!("victim-{i}"),
        )
        .on(&node_name(i))
        .gpus(1)
        .research()
        .started(started);
        c.on_pod_event(watcher::Event::Apply(p.clone().build()), now);
        c.on_pod_event(
            watcher::Event::Apply(p.disrupted("PreemptionByScheduler", now).build()),
            now,
        );
    }
    let first = now.as_second() - CAPACITY as i64 * SAMPLE_SECONDS;
    for i in 0..CAPACITY as i64 {
        c.record_sample(Sample {
            at: first + i * SAMPLE_SECONDS,
            inference: 4000,
            research: 2000 + (i % 1440) as u32,
            free: 1936 - (i % 1440) as u32,
            headroom: 64,
        });
    }
    c.reconcile(now, tokio::time::Instant::now());
    c
}

/// A full week of 5-minute points for each of [`SERVICES`] services, demand following a day.
fn services(now: Timestamp) -> Services {
    let mut s = Services::new();
    let first = now.as_second() - POINTS as i64 * STEP;
    for n in 0..SERVICES {
        let key = ServiceKey {
            namespace: format!("inference-{}", n % 5),
            name: format!("model-{n}"),
        };
        for i in 0..POINTS as i64 {
            let hour = (i * STEP / 3600 % 24) as f64;
            let demand = 4.0 + 3.0 * (hour / 24.0 * std::f64::consts::TAU).sin();
            s.record(&key, first + i * STEP, demand, demand.ceil());
        }
    }
    s
}

fn benches(c: &mut Criterion) {
    let controller = loaded();
    let now = Timestamp::now();
    let services = services(now);
    let origin = HistoryOrigin::SinceStart {
        at: now,
        rebuild_failed: None,
    };
    let timeline = Timeline {
        pool: controller.history(),
        services: &services,
        origin: &origin,
    };
    let view = model::build(&controller.status(now), timeline, None);
    let html = html::render(&view);
    let json = serde_json::to_string(&view).expect("json");
    eprintln!(
        "view: {} nodes, {} namespaces, {} preemptions, {} + {} chart points, {} services × {} \
         points ({} KiB of service history); page {} KiB, JSON {} KiB",
        view.nodes.len(),
        view.namespaces.len(),
        view.preemptions.len(),
        view.charts.day.len(),
        view.charts.week.len(),
        view.charts.services.len(),
        view.charts.services.first().map_or(0, |s| s.week.len()),
        services.heap_bytes() / 1024,
        html.len() / 1024,
        json.len() / 1024
    );
    c.bench_function("view/page_1000_nodes", |b| {
        b.iter(|| black_box(html::render(black_box(&view))))
    });
    c.bench_function("view/json_1000_nodes", |b| {
        b.iter(|| black_box(serde_json::to_vec(black_box(&view)).expect("json")))
    });
    c.bench_function("view/build_from_controller_20000_pods", |b| {
        b.iter(|| {
            let report = controller.status(now);
            black_box(model::build(&report, timeline, None))
        })
    });
}

criterion_group!(view, benches);
criterion_main!(view);
