//! Cost of one admission review: the pure `mutate()` on a realistic 10 KB pod (as the review reads
//! it), the whole review (parse, mutate, encode) without the network, and beside them the parse's
//! own floor: only tokenizing the review's JSON text (nothing built), then the review's parse;
//! and the whole review again as a server meets it, with 4 MiB of memory touched, the thread
//! asleep 0.5 ms (`NIGHTSHIFT_BENCH_IDLE_US`), or the thread spinning as long, before each, and
//! the parse and its tokenizing after the same sleep (only the review or the step timed; these
//! lines take about ten times their measurement time).
//!
//! `cargo bench --bench webhook -- --warm-up-time 1 --measurement-time 3`

/// The allocator the `nightshift` binary ships with (`src/main.rs`), so that the review is
/// measured as it runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "support/busy.rs"]
mod busy;
#[path = "support/caches.rs"]
mod caches;
#[path = "support/pod.rs"]
mod pod;
#[path = "support/stats.rs"]
mod stats;

use std::{
    collections::BTreeMap,
    hint::black_box,
    sync::Arc,
    time::{Duration, Instant},
};

use criterion::{Criterion, criterion_group, criterion_main};
use nightshift::{
    test_support,
    webhook::{
        mutate::{MutationPolicy, PriorityClassInfo, mutate},
        pod_fields::AdmittedPod,
        review::parse,
    },
};

fn benches(c: &mut Criterion) {
    let doc = pod::realistic_pod();
    let size = serde_json::to_vec(&doc).map(|v| v.len()).unwrap_or(0);
    eprintln!("pod JSON: {size} bytes");
    // As the review reads it: the fields the decision uses, from the JSON text.
    let pod = AdmittedPod::from_json(&doc.to_string()).expect("pod");
    let policy = MutationPolicy::default();
    let classes: BTreeMap<String, PriorityClassInfo> = [(
        "nightshift-research".to_string(),
        PriorityClassInfo {
            value: -1000,
            preemption_policy: "Never".into(),
        },
    )]
    .into();
    let ns: BTreeMap<String, String> =
        [("nightshift.io/research".to_string(), "true".to_string())].into();

    c.bench_function("mutate 10KB pod", |b| {
        b.iter(|| mutate(black_box(&pod), "research", &ns, &policy, &classes).expect("ok"))
    });

    let body = serde_json::to_vec(&pod::admission_review(doc)).expect("review");
    let reviewer = test_support::webhook::reviewer(
        policy,
        Arc::new(test_support::webhook::research_cluster()),
    );
    // The parse's floor: the same text checked as JSON and nothing built, as `review::parse`
    // reads it (as text, once checked to be UTF-8).
    let text = std::str::from_utf8(&body).expect("UTF-8");
    c.bench_function("tokenize 10KB review (nothing built)", |b| {
        b.iter(|| sonic_rs::from_str::<serde::de::IgnoredAny>(black_box(text)).expect("JSON"))
    });
    c.bench_function("parse 10KB review (review::parse)", |b| {
        b.iter(|| parse(black_box(&body)).expect("review"))
    });

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    c.bench_function("review 10KB pod (parse, mutate, encode)", |b| {
        b.to_async(&rt)
            .iter(|| async { reviewer.review(black_box(&body)).await })
    });

    // The same review as a server meets it, only the review timed: after the transport's work
    // has pushed its data out of the caches, and on a core back from idle.
    let mut junk = vec![0u8; EVICTING_BYTES];
    c.bench_function("review 10KB pod, 4 MiB touched before each", |b| {
        b.iter_custom(|iters| {
            timed_after(
                iters,
                || caches::touch(&mut junk),
                || rt.block_on(reviewer.review(black_box(&body))),
            )
        })
    });
    let idle = Duration::from_micros(stats::env_or(
        "NIGHTSHIFT_BENCH_IDLE_US",
        IDLE_BETWEEN_REVIEWS_US,
    ));
    after_sleep(c, idle, "review 10KB pod", || {
        rt.block_on(reviewer.review(black_box(&body)))
    });
    // The same interval with the thread busy instead: what the review loses to time passing
    // on the machine, apart from what its core's idle costs it.
    after_wait(c, idle, Wait::Spinning, "review 10KB pod", || {
        rt.block_on(reviewer.review(black_box(&body)))
    });
    // Which of the review's steps the idle makes dearer: its parse, and the parse's tokenizing
    // alone, after the same sleep.
    after_sleep(c, idle, "parse 10KB review (review::parse)", || {
        parse(black_box(&body)).expect("review")
    });
    after_sleep(c, idle, "tokenize 10KB review (nothing built)", || {
        sonic_rs::from_str::<serde::de::IgnoredAny>(black_box(text)).expect("JSON")
    });
}

/// Times `routine` alone, each call after the thread slept `idle`, the core idle meanwhile.
fn after_sleep<T>(c: &mut Criterion, idle: Duration, what: &str, routine: impl FnMut() -> T) {
    after_wait(c, idle, Wait::Asleep, what, routine);
}

/// How the thread spends the interval before each timed call.
#[derive(Clone, Copy)]
enum Wait {
    /// Sleeping: its core idles.
    Asleep,
    /// Spinning on the clock ([`busy::spin`]): its core never idles.
    Spinning,
}

/// Times `routine` alone, each call after the thread waited `interval` as `wait` says.
fn after_wait<T>(
    c: &mut Criterion,
    interval: Duration,
    wait: Wait,
    what: &str,
    mut routine: impl FnMut() -> T,
) {
    let (state, before): (_, fn(Duration)) = match wait {
        Wait::Asleep => ("asleep", std::thread::sleep),
        Wait::Spinning => ("spinning", busy::spin),
    };
    let name = format!(
        "{what}, the thread {state} {} µs before each",
        interval.as_micros()
    );
    c.bench_function(&name, |b| {
        b.iter_custom(|iters| timed_after(iters, || before(interval), &mut routine))
    });
}

/// More than the second-level cache of the machines measured, so that a review after it reads
/// its code and data from farther away, as after the transport's work in a server.
const EVICTING_BYTES: usize = 4 << 20;

/// The time between two requests at the load bench's 2,000 reviews/s, in µs: the server's core
/// idles this long or somewhat longer between wake-ups. `NIGHTSHIFT_BENCH_IDLE_US` overrides it.
const IDLE_BETWEEN_REVIEWS_US: u64 = 500;

/// Runs `before` then `routine` `iters` times and returns the time spent in `routine` alone.
fn timed_after<T>(
    iters: u64,
    mut before: impl FnMut(),
    mut routine: impl FnMut() -> T,
) -> Duration {
    let mut spent = Duration::ZERO;
    for _ in 0..iters {
        before();
        let start = Instant::now();
        black_box(routine());
        spent += start.elapsed();
    }
    spent
}

criterion_group!(webhook, benches);
criterion_main!(webhook);
