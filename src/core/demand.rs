//! Composite inference demand: vLLM's own signals, each normalised by its per-replica target,
//! combined so that the most saturated signal drives scaling.
//!
//! Pure: no I/O, no clocks, and nothing of the crate above it. The live scaler and the simulator
//! both call [`compute`], so what the simulator measures is what production decides; the sources
//! read metrics per [`Signal`], the one name of each signal across the crate.
//!
//! # Formula
//!
//! For every configured signal `s` with a per-replica target `t_s` and a total `x_s` summed over
//! the service's pods:
//!
//! ```text
//! ratio_s  = x_s / t_s                    (replicas that signal alone asks for)
//! replicas = max_s ratio_s                (the most saturated signal wins)
//! value    = replicas × METRIC_TARGET     (reported to KEDA with target METRIC_TARGET)
//! ```
//!
//! The HPA computes `ceil(value / METRIC_TARGET) = ceil(replicas)` for `AverageValue` metrics,
//! which is the number of replicas needed to bring every signal back to its target.

use serde::Serialize;

/// Target reported in `GetMetricSpec`. Demand is a fractional replica count; scaling it by 100
/// keeps 0.01-replica resolution in KEDA's integer field (used by KEDA before 2.17, which has no
/// float field) while `ceil(value / target)` stays exactly `ceil(replicas)`.
pub const METRIC_TARGET: f64 = 100.0;

/// Fraction of a replica's learned capacity (see [`crate::core::capacity`]) a trigger scales its
/// token rates against by default: 0.6 keeps replicas out of the saturated regime where queueing
/// delay grows without bound, with the headroom a new replica's start-up needs to absorb a ramp.
pub const DEFAULT_UTILIZATION: f64 = 0.6;

/// `waitingTarget` of a trigger with learned capacity that sets none: vLLM production-stack's
/// default of 5 waiting requests per replica, so the service scales on its queue before any
/// capacity is learned (which is what produces the first saturated samples).
pub const LEARNED_WAITING_TARGET: f64 = 5.0;

/// Default window over which token counters become rates (a trigger's `rateWindow`): four
/// Prometheus scrapes at the usual 15 s interval, the minimum for a stable `rate()`.
pub const DEFAULT_RATE_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// A vLLM signal nightshift can scale on; one metric family the sources read for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Signal {
    /// Requests queued in vLLM's scheduler (`vllm:num_requests_waiting`).
    Waiting,
    /// Requests being processed (`vllm:num_requests_running`).
    Running,
    /// KV-cache use, a 0–1 fraction per pod (`vllm:kv_cache_usage_perc`, formerly
    /// `vllm:gpu_cache_usage_perc`).
    KvCache,
    /// Generated tokens per second (`rate(vllm:generation_tokens_total)`).
    GenerationTokens,
    /// Prompt tokens per second (`rate(vllm:prompt_tokens_total)`): the load of prefill-heavy
    /// services (long prompts, short outputs), where the queue stays empty and few tokens are
    /// generated until every replica is saturated.
    PromptTokens,
}

impl Signal {
    /// Every signal, in reporting order.
    pub const ALL: [Signal; 5] = [
        Signal::Waiting,
        Signal::Running,
        Signal::KvCache,
        Signal::GenerationTokens,
        Signal::PromptTokens,
    ];

    /// The name used in explanations and JSON (`kvCache`).
    pub fn name(self) -> &'static str {
        match self {
            Signal::Waiting => "waiting",
            Signal::Running => "running",
            Signal::KvCache => "kvCache",
            Signal::GenerationTokens => "generationTokens",
            Signal::PromptTokens => "promptTokens",
        }
    }

    /// The ScaledObject metadata key holding this signal's per-replica target (`kvCacheTarget`).
    pub fn target_key(self) -> &'static str {
        match self {
            Signal::Waiting => "waitingTarget",
            Signal::Running => "runningTarget",
            Signal::KvCache => "kvCacheTarget",
            Signal::GenerationTokens => "generationTokensTarget",
            Signal::PromptTokens => "promptTokensTarget",
        }
    }

    /// The name of the signal's metric family in source metrics' labels and in empty-result
    /// errors (`kv_cache`).
    pub fn family(self) -> &'static str {
        match self {
            Signal::Waiting => "waiting",
            Signal::Running => "running",
            Signal::KvCache => "kv_cache",
            Signal::GenerationTokens => "generation_tokens",
            Signal::PromptTokens => "prompt_tokens",
        }
    }
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One value per signal: targets, totals, and the sources' readings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PerSignal<T> {
    pub waiting: T,
    pub running: T,
    pub kv_cache: T,
    pub generation_tokens: T,
    pub prompt_tokens: T,
}

impl<T> PerSignal<T> {
    /// The value of one signal.
    pub fn get(&self, signal: Signal) -> &T {
        match signal {
            Signal::Waiting => &self.waiting,
            Signal::Running => &self.running,
            Signal::KvCache => &self.kv_cache,
            Signal::GenerationTokens => &self.generation_tokens,
            Signal::PromptTokens => &self.prompt_tokens,
        }
    }

    /// The value of one signal, to change it.
    pub fn get_mut(&mut self, signal: Signal) -> &mut T {
        match signal {
            Signal::Waiting => &mut self.waiting,
            Signal::Running => &mut self.running,
            Signal::KvCache => &mut self.kv_cache,
            Signal::GenerationTokens => &mut self.generation_tokens,
            Signal::PromptTokens => &mut self.prompt_tokens,
        }
    }
}

/// Per-replica targets: the load one replica should carry. `None` = signal not used.
pub type Targets = PerSignal<Option<f64>>;

impl Targets {
    /// The signals that have a target.
    pub fn configured(&self) -> impl Iterator<Item = Signal> + '_ {
        Signal::ALL.into_iter().filter(|s| self.get(*s).is_some())
    }
}

/// Signal totals over the pods of one inference service.
///
/// Counts and token rates are summed over pods (and over vLLM engines within a pod). KV-cache use
/// is a fraction per pod (engines of one pod averaged), summed over pods: `Σ kv / target` is then
/// the number of replicas that keeps every pod's cache at the target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    /// Pods that reported.
    pub pods: usize,
    /// Each signal's total, if it was read.
    #[serde(flatten)]
    pub signals: PerSignal<Option<f64>>,
}

/// One signal's share of a decision.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Term {
    pub signal: Signal,
    /// The total read from the source.
    pub total: f64,
    /// The per-replica target.
    pub target: f64,
    /// `total / target`: replicas this signal alone asks for.
    pub ratio: f64,
}

/// The outcome of [`compute`]: demand in replicas and how it was reached.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// Replicas needed (fractional); `ceil` of it is what the HPA will ask for.
    pub replicas: f64,
    /// The signal with the highest ratio; `None` when every ratio is zero.
    pub driver: Option<Signal>,
    /// Every configured signal, in [`Signal::ALL`] order.
    pub terms: Vec<Term>,
}

impl Decision {
    /// The value reported in `GetMetrics` (float field), paired with [`METRIC_TARGET`].
    pub fn metric_value(&self) -> f64 {
        round_noise(self.replicas * METRIC_TARGET)
    }

    /// The value for KEDA's integer field: rounded up, so integer-only KEDA versions never ask
    /// for fewer replicas than the float value would.
    pub fn metric_value_int(&self) -> i64 {
        let v = self.metric_value().ceil();
        if v >= i64::MAX as f64 {
            i64::MAX
        } else {
            v as i64
        }
    }

    /// Whether the service should be active (scaled from zero): demand above the threshold,
    /// which is expressed in replicas like the demand itself.
    pub fn is_active(&self, activation_threshold: f64) -> bool {
        self.replicas > activation_threshold
    }
}

/// Why a demand cannot be computed. Each of these must become an explicit error to KEDA, never a
/// zero: a zero would scale inference down while it may be under load.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DemandError {
    #[error("no signal is configured: set at least one per-replica target")]
    NoTargets,
    #[error("target for {signal} must be a finite number above zero, got {target}")]
    BadTarget { signal: Signal, target: f64 },
    #[error("no reading for {signal}: the source returned no value for it")]
    MissingSignal { signal: Signal },
    #[error("reading for {signal} is {value}, which is not a finite non-negative number")]
    BadValue { signal: Signal, value: f64 },
}

/// Rounds away floating-point noise (e.g. `11.0 / 5.0 * 100.0 = 220.00000000000003`) so that it
/// never makes the HPA's `ceil` ask for one replica more. A billionth of a replica is far below
/// any meaningful load difference.
fn round_noise(x: f64) -> f64 {
    const SCALE: f64 = 1e9;
    (x * SCALE).round() / SCALE
}

/// Computes demand from signal totals and per-replica targets.
pub fn compute(totals: &Totals, targets: &Targets) -> Result<Decision, DemandError> {
    let mut terms = Vec::with_capacity(Signal::ALL.len());
    for signal in targets.configured() {
        let target = targets.get(signal).unwrap_or_default();
        if !(target.is_finite() && target > 0.0) {
            return Err(DemandError::BadTarget { signal, target });
        }
        let total = totals
            .signals
            .get(signal)
            .ok_or(DemandError::MissingSignal { signal })?;
        if !(total.is_finite() && total >= 0.0) {
            return Err(DemandError::BadValue {
                signal,
                value: total,
            });
        }
        terms.push(Term {
            signal,
            total,
            target,
            ratio: round_noise(total / target),
        });
    }
    if terms.is_empty() {
        return Err(DemandError::NoTargets);
    }
    let mut replicas = 0.0;
    let mut driver = None;
    for term in &terms {
        if term.ratio > replicas {
            replicas = term.ratio;
            driver = Some(term.signal);
        }
    }
    Ok(Decision {
        replicas,
        driver,
        terms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(w: Option<f64>, r: Option<f64>, kv: Option<f64>, tok: Option<f64>) -> Targets {
        Targets {
            waiting: w,
            running: r,
            kv_cache: kv,
            generation_tokens: tok,
            prompt_tokens: None,
        }
    }

    fn totals(w: Option<f64>, r: Option<f64>, kv: Option<f64>, tok: Option<f64>) -> Totals {
        Totals {
            pods: 2,
            signals: targets(w, r, kv, tok),
        }
    }

    struct Case {
        name: &'static str,
        totals: Totals,
        targets: Targets,
        replicas: f64,
        driver: Option<Signal>,
    }

    #[test]
    fn demand_table() {
        let cases = [
            Case {
                name: "idle service asks for nothing",
                totals: totals(Some(0.0), Some(0.0), Some(0.0), Some(0.0)),
                targets: targets(Some(5.0), Some(64.0), Some(0.8), Some(2000.0)),
                replicas: 0.0,
                driver: None,
            },
            Case {
                name: "queue-bound model scales on waiting requests",
                totals: totals(Some(30.0), Some(100.0), Some(0.6), None),
                targets: targets(Some(5.0), Some(64.0), Some(0.8), None),
                replicas: 6.0,
                driver: Some(Signal::Waiting),
            },
            Case {
                name: "kv-bound model scales on cache use while the queue is empty",
                totals: totals(Some(0.0), Some(20.0), Some(2.85), None),
                targets: targets(Some(5.0), Some(64.0), Some(0.75), None),
                replicas: 3.8,
                driver: Some(Signal::KvCache),
            },
            Case {
                name: "token throughput alone",
                totals: totals(None, None, None, Some(5000.0)),
                targets: targets(None, None, None, Some(2000.0)),
                replicas: 2.5,
                driver: Some(Signal::GenerationTokens),
            },
            Case {
                name: "unused signals need no reading",
                totals: totals(None, Some(96.0), None, None),
                targets: targets(None, Some(64.0), None, None),
                replicas: 1.5,
                driver: Some(Signal::Running),
            },
            Case {
                name: "ties go to the first signal in reporting order",
                totals: totals(Some(10.0), Some(128.0), None, None),
                targets: targets(Some(5.0), Some(64.0), None, None),
                replicas: 2.0,
                driver: Some(Signal::Waiting),
            },
        ];
        for case in cases {
            let d = compute(&case.totals, &case.targets)
                .unwrap_or_else(|e| panic!("{}: {e}", case.name));
            assert!(
                (d.replicas - case.replicas).abs() < 1e-9,
                "{}: replicas {} != {}",
                case.name,
                d.replicas,
                case.replicas
            );
            assert_eq!(d.driver, case.driver, "{}", case.name);
            assert_eq!(
                d.terms.len(),
                case.targets.configured().count(),
                "{}",
                case.name
            );
        }
    }

    #[test]
    fn a_configured_signal_without_reading_is_an_error_not_zero() {
        let err = compute(
            &totals(Some(3.0), None, None, None),
            &targets(Some(5.0), Some(64.0), None, None),
        )
        .expect_err("missing running must fail");
        assert_eq!(
            err,
            DemandError::MissingSignal {
                signal: Signal::Running
            }
        );
    }

    #[test]
    fn bad_values_and_targets_are_rejected() {
        assert!(matches!(
            compute(
                &totals(Some(f64::NAN), None, None, None),
                &targets(Some(5.0), None, None, None)
            ),
            Err(DemandError::BadValue { .. })
        ));
        assert!(matches!(
            compute(
                &totals(Some(-1.0), None, None, None),
                &targets(Some(5.0), None, None, None)
            ),
            Err(DemandError::BadValue { .. })
        ));
        assert!(matches!(
            compute(
                &totals(Some(1.0), None, None, None),
                &targets(Some(0.0), None, None, None)
            ),
            Err(DemandError::BadTarget { .. })
        ));
        assert!(matches!(
            compute(
                &totals(Some(1.0), None, None, None),
                &targets(Some(f64::INFINITY), None, None, None)
            ),
            Err(DemandError::BadTarget { .. })
        ));
        assert_eq!(
            compute(&Totals::default(), &Targets::default()),
            Err(DemandError::NoTargets)
        );
    }

    #[test]
    fn hpa_rule_on_reported_value_gives_replicas_needed() {
        let d = compute(
            &totals(Some(11.0), None, None, None),
            &targets(Some(5.0), None, None, None),
        )
        .expect("valid");
        // 11 waiting at 5 per replica: 2.2 replicas → the HPA asks for 3.
        assert_eq!((d.metric_value() / METRIC_TARGET).ceil(), 3.0);
        assert_eq!(d.metric_value_int(), 220);
        assert_eq!((d.metric_value_int() as f64 / METRIC_TARGET).ceil(), 3.0);
    }

    #[test]
    fn integer_value_rounds_up_never_down() {
        let d = compute(
            &totals(Some(1.0), None, None, None),
            &targets(Some(3.0), None, None, None),
        )
        .expect("valid");
        assert_eq!(d.metric_value_int(), 34);
    }

    #[test]
    fn activation_compares_replicas_to_the_threshold() {
        let d = compute(
            &totals(Some(1.0), None, None, None),
            &targets(Some(5.0), None, None, None),
        )
        .expect("valid");
        assert!(d.is_active(0.0));
        assert!(!d.is_active(0.2));
        let idle = compute(
            &totals(Some(0.0), None, None, None),
            &targets(Some(5.0), None, None, None),
        )
        .expect("valid");
        assert!(!idle.is_active(0.0));
    }

    proptest::proptest! {
        #[test]
        fn demand_is_the_maximum_ratio_and_never_below_any(
            w in 0.0f64..1e6, r in 0.0f64..1e6, kv in 0.0f64..1e3, tok in 0.0f64..1e7,
            tw in 0.1f64..100.0, tr in 0.1f64..500.0, tkv in 0.05f64..1.0, ttok in 1.0f64..1e5,
        ) {
            let d = compute(
                &totals(Some(w), Some(r), Some(kv), Some(tok)),
                &targets(Some(tw), Some(tr), Some(tkv), Some(ttok)),
            ).expect("valid inputs");
            for t in &d.terms {
                proptest::prop_assert!(d.replicas >= t.ratio);
            }
            proptest::prop_assert!(d.terms.iter().any(|t| t.ratio == d.replicas) || d.replicas == 0.0);
            proptest::prop_assert!(d.metric_value_int() as f64 >= d.metric_value());
        }
    }
}
