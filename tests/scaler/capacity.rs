//! Learned capacity over real gRPC: a trigger with no targets scales on its queue until
//! requests wait behind every pod, learns what a replica sustains then, and scales token rates
//! against that capacity afterwards.

use std::time::Duration;

use nightshift::scaler::explain::Explanation;

use crate::{
    emulator::{Behaviour, Emulator},
    harness::{NAMESPACE, ScalerUnderTest, eventually, get_metrics, scaled_object},
};

/// Per pod while saturated: prompt and generated tokens per second.
const PROMPT: f64 = 3000.0;
const GENERATED: f64 = 600.0;

fn close(a: f64, b: f64, relative: f64) -> bool {
    (a - b).abs() <= relative * b.abs()
}

fn explained(s: &ScalerUnderTest) -> Option<Explanation> {
    s.scaler.decisions().get(NAMESPACE, "llama")
}

#[tokio::test]
async fn the_default_trigger_learns_capacity_while_requests_queue() {
    // Two pods of one engine, producing tokens at the saturated pace from the start: only the
    // queue says whether they are saturated.
    let pods = [
        Emulator::start("llama", 1, false).await,
        Emulator::start("llama", 1, false).await,
    ];
    for pod in &pods {
        pod.set(0, |e| {
            e.prompt_tokens_per_second = PROMPT;
            e.generation_tokens_per_second = GENERATED;
        });
    }
    // One request waiting in all: under one per pod, so not saturated.
    pods[0].set(0, |e| e.waiting = 1.0);
    let s = ScalerUnderTest::start(Duration::from_millis(50)).await;
    let mut c = s.client().await;
    let endpoints = format!("{},{}", pods[0].endpoint(), pods[1].endpoint());
    let so = scaled_object(
        "llama",
        &[
            ("endpoints", &endpoints),
            ("model", "llama"),
            ("rateWindow", "1s"),
        ],
    );

    // Before any saturation: the waiting target of 5 alone decides (1 / 5 = 0.2 replicas).
    let v = get_metrics(&mut c, &so).await.expect("metrics");
    assert_eq!(v.metric_value, 20, "{v:?}");
    let e = explained(&s).expect("explained");
    let view = e.capacity.expect("capacity explained");
    assert_eq!(
        (view.samples, view.per_replica, view.targets),
        (0, None, None)
    );
    assert_eq!(view.utilization, 0.6);
    assert!(view.state.starts_with("learning"), "{}", view.state);
    let signals: Vec<&str> = e.terms.iter().map(|t| t.signal).collect();
    assert_eq!(signals, ["waiting"]);

    // Requests wait behind every pod: each evaluation is a saturated sample.
    for pod in &pods {
        pod.set(0, |e| e.waiting = 4.0);
    }
    // Rates over a 1 s window move by a few per cent when the machine pauses this test for
    // tens of milliseconds between a pod's answer and its reading; the learner's quantile
    // settles on the true pace as saturated samples keep coming, so this polls until it has.
    let learned = eventually(
        Duration::from_secs(15),
        "the saturated pace learned",
        || {
            let (mut c, so) = (c.clone(), so.clone());
            let s = &s;
            async move {
                get_metrics(&mut c, &so).await.ok()?;
                let view = explained(s)?.capacity?;
                let learned = view.per_replica?;
                (view.samples >= 8
                    && close(learned.prompt, PROMPT, 0.03)
                    && close(learned.generated, GENERATED, 0.03))
                .then_some(learned)
            }
        },
    )
    .await;

    // The queue empties (first everywhere, so no mixed reading is saturated), then the pods
    // run at half the pace: 2 × PROMPT / 2 over 0.6 × PROMPT per replica = 1.67 replicas.
    for pod in &pods {
        pod.set(0, |e| e.waiting = 0.0);
    }
    let samples = eventually(Duration::from_secs(15), "an unsaturated reading", || {
        let (mut c, so) = (c.clone(), so.clone());
        let s = &s;
        async move {
            get_metrics(&mut c, &so).await.ok()?;
            let e = explained(s)?;
            let queue = e.terms.iter().find(|t| t.signal == "waiting")?.raw;
            let view = e.capacity?;
            (queue == 0.0 && !view.sampled).then_some(view.samples)
        }
    })
    .await;
    for pod in &pods {
        pod.set(0, |e| {
            e.prompt_tokens_per_second = PROMPT / 2.0;
            e.generation_tokens_per_second = GENERATED / 2.0;
        });
    }
    let want = 2.0 * (PROMPT / 2.0) / (0.6 * learned.prompt) * 100.0;
    eventually(
        Duration::from_secs(15),
        "demand from the learned capacity",
        || {
            let (mut c, so) = (c.clone(), so.clone());
            async move {
                let v = get_metrics(&mut c, &so).await.ok()?;
                close(v.metric_value_float, want, 0.02).then_some(())
            }
        },
    )
    .await;
    let e = explained(&s).expect("explained");
    let view = e.capacity.clone().expect("capacity");
    // The emptied queue added no sample, and the targets are 0.6 × the capacity.
    assert_eq!(view.samples, samples, "{view:?}");
    assert!(!view.sampled);
    let targets = view.targets.expect("targets");
    assert!(
        close(targets.prompt, 0.6 * learned.prompt, 1e-9),
        "{view:?}"
    );
    let prompt = e
        .terms
        .iter()
        .find(|t| t.signal == "promptTokens")
        .expect("prompt term");
    assert!(close(prompt.target, targets.prompt, 1e-9), "{e:?}");
    assert!(close(prompt.raw, PROMPT, 0.03), "{e:?}");
    assert!(e.terms.iter().any(|t| t.signal == "generationTokens"));
    let json = serde_json::to_value(&e).expect("json");
    assert!(
        json["capacity"]["perReplica"]["prompt"].is_number(),
        "{json}"
    );
    let metrics = s.metrics_text();
    assert!(
        metrics.contains(
            "nightshift_scaler_learned_capacity_tokens_per_second{namespace=\"team-a\",scaled_object=\"llama\",kind=\"generated\"}"
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn hand_set_token_targets_win_over_learned_ones() {
    let pod = Emulator::start("llama", 1, false).await;
    pod.set(0, |e| {
        e.waiting = 3.0;
        e.prompt_tokens_per_second = PROMPT;
        e.generation_tokens_per_second = GENERATED;
    });
    let s = ScalerUnderTest::start(Duration::from_millis(50)).await;
    let c = s.client().await;
    let so = scaled_object(
        "llama",
        &[
            ("endpoints", &pod.endpoint()),
            ("model", "llama"),
            ("rateWindow", "1s"),
            ("capacity", "learned"),
            ("capacityUtilization", "0.5"),
            ("waitingTarget", "10"),
            ("promptTokensTarget", "100"),
        ],
    );
    // Polled until the learned target settles, as in the test above: one rate read while the
    // machine paused can be a few per cent off.
    let e = eventually(
        Duration::from_secs(15),
        "a learned generated target",
        || {
            let (mut c, so) = (c.clone(), so.clone());
            let s = &s;
            async move {
                get_metrics(&mut c, &so).await.ok()?;
                let e = explained(s)?;
                let learned = e.terms.iter().find(|t| t.signal == "generationTokens")?;
                close(learned.target, 0.5 * GENERATED, 0.03).then_some(e)
            }
        },
    )
    .await;
    let view = e.capacity.clone().expect("capacity");
    assert_eq!(view.hand_set, ["promptTokens"]);
    assert_eq!(view.utilization, 0.5);
    let target = |signal: &str| {
        e.terms
            .iter()
            .find(|t| t.signal == signal)
            .map(|t| t.target)
    };
    assert_eq!(target("promptTokens"), Some(100.0));
    assert_eq!(target("waiting"), Some(10.0));
    let generated = target("generationTokens").expect("learned");
    let per_replica = view.per_replica.expect("learned");
    assert!(close(generated, 0.5 * per_replica.generated, 1e-9), "{e:?}");
    // Prompt tokens at 3000/s against the hand-set 100 per replica: 30 replicas.
    assert_eq!(e.driver, Some("promptTokens"));
}

#[tokio::test]
async fn a_failed_read_stays_an_error_and_teaches_nothing() {
    let pod = Emulator::start("llama", 1, false).await;
    pod.set(0, |e| {
        e.waiting = 3.0;
        e.prompt_tokens_per_second = PROMPT;
    });
    pod.behave(Behaviour::ServerError);
    let s = ScalerUnderTest::start(Duration::from_millis(10)).await;
    let mut c = s.client().await;
    let so = scaled_object(
        "llama",
        &[("endpoints", &pod.endpoint()), ("model", "llama")],
    );
    let e = get_metrics(&mut c, &so)
        .await
        .expect_err("no demand from a dead pod");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    let explained = explained(&s).expect("explained");
    assert!(explained.error.is_some());
    assert_eq!(explained.capacity, None);
    assert!(
        !s.metrics_text()
            .contains("nightshift_scaler_learned_capacity_tokens_per_second{"),
        "nothing learned"
    );
}
