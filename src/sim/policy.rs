//! The policies compared and the HorizontalPodAutoscaler that turns a metric into replicas.
//!
//! The nightshift policy calls [`crate::core::demand::compute`] — the function the live scaler
//! answers KEDA with — on signal totals built the way its sources report them. The other
//! policies are what users run instead: a static fleet, a fixed night window, and KEDA's
//! Prometheus scaler on the waiting-queue length.

use std::collections::VecDeque;

use serde::Serialize;

use super::config::{AutoscalingConfig, HpaPolicyKind, HpaSelect, NightWindowConfig};
use crate::core::demand::{self, Decision, DemandError, Targets, Totals};

/// Which scaling policy a run uses.
///
/// The nightshift policies differ in two properties, each a switch of the live product:
/// [`ScalingPolicy::forecasts`] (the trigger's `forecast: daily`, off unless set) and
/// [`ScalingPolicy::notices`] (the pool controller's `--pool-notices`, on unless switched off).
/// [`ScalingPolicy::Nightshift`] is nightshift as shipped: both at their defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ScalingPolicy {
    StaticPeak,
    NightWindow,
    KedaPrometheus,
    /// nightshift as shipped: the trigger's defaults (no forecast) and the pool controller's
    /// (reclaim notices on).
    Nightshift,
    /// The same scaling with reclaim notices off (`--pool-notices=false`).
    NightshiftWithoutNotices,
    /// nightshift with the daily forecast (the trigger's `forecast: daily`), notices on.
    NightshiftForecast,
    /// nightshift with its utilization closed on the service's measured queue wait
    /// ([`crate::core::slo_loop`]), notices on: a candidate, not yet what the live scaler does
    /// (one of [`Self::CANDIDATES`]).
    NightshiftSloLoop,
    /// The honest ceiling's schedule replayed ([`super::ceiling`]); not one of [`Self::ALL`].
    CeilingReplay,
    /// The night window chosen with hindsight on the trace ([`super::hindsight`]); not one of
    /// [`Self::ALL`].
    NightWindowHindsight,
}

impl ScalingPolicy {
    pub const ALL: [ScalingPolicy; 6] = [
        ScalingPolicy::StaticPeak,
        ScalingPolicy::NightWindow,
        ScalingPolicy::KedaPrometheus,
        ScalingPolicy::Nightshift,
        ScalingPolicy::NightshiftWithoutNotices,
        ScalingPolicy::NightshiftForecast,
    ];

    /// Candidates for the product, not yet what it does: run on request (`--candidates`).
    pub const CANDIDATES: [ScalingPolicy; 1] = [ScalingPolicy::NightshiftSloLoop];

    /// Whether the policy scales on nightshift's demand (and lends with its headroom).
    pub fn is_nightshift(self) -> bool {
        matches!(
            self,
            ScalingPolicy::Nightshift
                | ScalingPolicy::NightshiftWithoutNotices
                | ScalingPolicy::NightshiftForecast
                | ScalingPolicy::NightshiftSloLoop
        )
    }

    /// Whether the policy closes its utilization on the measured queue wait.
    pub fn closes_the_slo_loop(self) -> bool {
        self == ScalingPolicy::NightshiftSloLoop
    }

    /// Whether the policy adds the daily forecast to nightshift's demand.
    pub fn forecasts(self) -> bool {
        self == ScalingPolicy::NightshiftForecast
    }

    /// Whether research the next replicas would displace is warned first (reclaim notices).
    pub fn notices(self) -> bool {
        matches!(
            self,
            ScalingPolicy::Nightshift
                | ScalingPolicy::NightshiftForecast
                | ScalingPolicy::NightshiftSloLoop
        )
    }

    pub fn label(self) -> &'static str {
        match self {
            ScalingPolicy::StaticPeak => "static peak",
            ScalingPolicy::NightWindow => "night window",
            ScalingPolicy::KedaPrometheus => "KEDA prometheus waiting",
            ScalingPolicy::Nightshift => "nightshift",
            ScalingPolicy::NightshiftWithoutNotices => "nightshift without notices",
            ScalingPolicy::NightshiftForecast => "nightshift + forecast",
            ScalingPolicy::NightshiftSloLoop => "nightshift + SLO loop",
            ScalingPolicy::CeilingReplay => "honest ceiling (replayed)",
            ScalingPolicy::NightWindowHindsight => "night window (hindsight)",
        }
    }
}

/// nightshift's answer to KEDA for these totals: the live scaler's decision and the value it
/// reports, paired with [`demand::METRIC_TARGET`]. An error is what KEDA would receive (the
/// HPA then keeps the current replica count).
pub fn nightshift_metric(
    totals: &Totals,
    targets: &Targets,
) -> Result<(Decision, f64), DemandError> {
    let decision = demand::compute(totals, targets)?;
    let value = decision.metric_value();
    Ok((decision, value))
}

/// Replicas the night-window policy runs at `t` seconds since midnight of day 0.
pub fn night_window_replicas(cfg: &NightWindowConfig, t: f64) -> u32 {
    let hour = ((t / 3600.0).rem_euclid(24.0)).floor() as u32;
    let at_night = if cfg.start_hour <= cfg.end_hour {
        hour >= cfg.start_hour && hour < cfg.end_hour
    } else {
        hour >= cfg.start_hour || hour < cfg.end_hour
    };
    if at_night {
        cfg.night_replicas
    } else {
        cfg.day_replicas
    }
}

/// The HPA's replica calculation for one external metric of type `AverageValue`, with
/// tolerance, stabilisation windows and the `behavior` rate-limiting policies (Kubernetes
/// `pkg/controller/podautoscaler`).
#[derive(Clone, Debug)]
pub struct Hpa {
    cfg: AutoscalingConfig,
    /// Recent raw recommendations, for the stabilisation windows.
    history: VecDeque<(f64, u32)>,
    /// Recent changes of the replica count it made (added positive, removed negative), for the
    /// policies' periods.
    events: VecDeque<(f64, i64)>,
    /// The longest period of any policy: how long a change is kept in `events`.
    longest_period_s: f64,
}

/// Which way a rate limit applies.
#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Up,
    Down,
}

impl Hpa {
    pub fn new(cfg: AutoscalingConfig) -> Hpa {
        let longest_period_s = cfg
            .scale_up_policies
            .iter()
            .chain(&cfg.scale_down_policies)
            .map(|p| p.period_s)
            .fold(0.0, f64::max);
        Hpa {
            cfg,
            history: VecDeque::new(),
            events: VecDeque::new(),
            longest_period_s,
        }
    }

    /// Replicas added and removed by the changes within the last `period_s` (a change exactly
    /// one period ago is outside it, as Kubernetes counts).
    fn changes_within(&self, now: f64, period_s: f64) -> (i64, i64) {
        self.events
            .iter()
            .filter(|(t, _)| t + period_s > now + 1e-9)
            .fold((0, 0), |(added, removed), (_, change)| {
                if *change > 0 {
                    (added + change, removed)
                } else {
                    (added, removed - change)
                }
            })
    }

    /// The furthest the policies let the replicas go from `current` in `direction` at `now`:
    /// each policy proposes a count from the replicas at its period's start, and `selectPolicy`
    /// takes the largest change (`max`) or the smallest (`min`).
    fn limit(&self, now: f64, current: u32, direction: Direction) -> u32 {
        let c = &self.cfg;
        let (policies, select) = match direction {
            Direction::Up => (&c.scale_up_policies, c.scale_up_select),
            Direction::Down => (&c.scale_down_policies, c.scale_down_select),
        };
        let proposals = policies.iter().map(|p| {
            let (added, removed) = self.changes_within(now, p.period_s);
            let start = (i64::from(current) - added + removed).max(0) as f64;
            let proposed = match (direction, p.kind) {
                (Direction::Up, HpaPolicyKind::Pods) => start + p.value,
                // Rounded up, so that a small fleet can grow at all.
                (Direction::Up, HpaPolicyKind::Percent) => (start * (1.0 + p.value / 100.0)).ceil(),
                (Direction::Down, HpaPolicyKind::Pods) => start - p.value,
                (Direction::Down, HpaPolicyKind::Percent) => {
                    (start * (1.0 - p.value / 100.0)).trunc()
                }
            };
            proposed.clamp(0.0, f64::from(u32::MAX)) as u32
        });
        // The largest change up is the highest count, the largest change down the lowest.
        let highest = (select == HpaSelect::Max) == (direction == Direction::Up);
        let limit = if highest {
            proposals.max()
        } else {
            proposals.min()
        };
        limit.unwrap_or(current)
    }

    /// Desired replicas at `now` given the metric's total value (`None`: the metric could not be
    /// read, so nothing changes) and the per-replica target.
    pub fn desired(&mut self, now: f64, current: u32, value: Option<f64>, target: f64) -> u32 {
        let c = &self.cfg;
        let Some(value) = value else {
            return current;
        };
        let raw =
            if current > 0 && (value / (target * f64::from(current)) - 1.0).abs() <= c.tolerance {
                current
            } else {
                let r = (value / target).ceil();
                if r >= f64::from(u32::MAX) {
                    u32::MAX
                } else {
                    r.max(0.0) as u32
                }
            };
        let raw = raw.clamp(c.min_replicas, c.max_replicas);
        self.history.push_back((now, raw));
        let keep = c.scale_up_window_s.max(c.scale_down_window_s);
        while self.history.front().is_some_and(|(t, _)| *t < now - keep) {
            self.history.pop_front();
        }
        // Scale up to the lowest recommendation of the up-window, down to the highest of the
        // down-window.
        let mut up = raw;
        let mut down = raw;
        for (t, r) in &self.history {
            if *t >= now - c.scale_up_window_s {
                up = up.min(*r);
            }
            if *t >= now - c.scale_down_window_s {
                down = down.max(*r);
            }
        }
        let mut desired = current;
        if desired < up {
            desired = up;
        }
        if desired > down {
            desired = down;
        }
        // Rate limits: never past what the policies allow within their periods.
        if desired > current {
            desired = desired.min(self.limit(now, current, Direction::Up).max(current));
        } else if desired < current {
            desired = desired.max(self.limit(now, current, Direction::Down).min(current));
        }
        let desired = desired.clamp(c.min_replicas, c.max_replicas);
        if desired != current {
            self.events
                .push_back((now, i64::from(desired) - i64::from(current)));
        }
        let longest = self.longest_period_s;
        while self
            .events
            .front()
            .is_some_and(|(t, _)| *t + longest <= now)
        {
            self.events.pop_front();
        }
        desired
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{core::demand::PerSignal, sim::config::HpaPolicy};

    fn hpa() -> Hpa {
        Hpa::new(AutoscalingConfig::default())
    }

    #[test]
    fn hpa_asks_for_ceil_of_value_over_target() {
        let mut h = hpa();
        assert_eq!(h.desired(0.0, 2, Some(11.0), 5.0), 3);
    }

    #[test]
    fn hpa_ignores_changes_within_tolerance() {
        let mut h = hpa();
        // 4 replicas, value 4.3 × target: ratio 1.075 is within 10 %.
        assert_eq!(h.desired(0.0, 4, Some(430.0), 100.0), 4);
        assert_eq!(h.desired(15.0, 4, Some(460.0), 100.0), 5);
    }

    #[test]
    fn scale_down_waits_for_the_stabilisation_window() {
        let mut h = hpa();
        assert_eq!(h.desired(0.0, 8, Some(800.0), 100.0), 8);
        // Load drops: the highest recommendation of the last 300 s still holds.
        assert_eq!(h.desired(15.0, 8, Some(200.0), 100.0), 8);
        assert_eq!(h.desired(299.0, 8, Some(200.0), 100.0), 8);
        assert_eq!(h.desired(301.0, 8, Some(200.0), 100.0), 2);
    }

    #[test]
    fn scale_up_is_immediate_but_rate_limited() {
        let mut h = hpa();
        // From 2: at most max(2 + 4, 2 × 2) = 6 per period.
        assert_eq!(h.desired(0.0, 2, Some(1500.0), 100.0), 6);
        assert_eq!(h.desired(15.0, 6, Some(1500.0), 100.0), 12);
        assert_eq!(h.desired(30.0, 12, Some(1500.0), 100.0), 15);
    }

    fn policy(kind: HpaPolicyKind, value: f64, period_s: f64) -> HpaPolicy {
        HpaPolicy {
            kind,
            value,
            period_s,
        }
    }

    /// The behaviour of the example ScaledObject (`manifests/examples/vllm/scaledobject.yaml`).
    fn example() -> Hpa {
        Hpa::new(AutoscalingConfig {
            scale_up_policies: vec![
                policy(HpaPolicyKind::Percent, 100.0, 30.0),
                policy(HpaPolicyKind::Pods, 2.0, 30.0),
            ],
            scale_up_select: HpaSelect::Max,
            scale_down_window_s: 600.0,
            scale_down_policies: vec![policy(HpaPolicyKind::Pods, 1.0, 300.0)],
            scale_down_select: HpaSelect::Min,
            ..AutoscalingConfig::default()
        })
    }

    #[test]
    fn scale_up_counts_what_was_added_within_the_period() {
        let mut h = example();
        // From 2: max(2 + 2, 2 × 2) = 4 within 30 s.
        assert_eq!(h.desired(0.0, 2, Some(2000.0), 100.0), 4);
        // 15 s later the period still holds those 2: it started at 2, so 4 it stays.
        assert_eq!(h.desired(15.0, 4, Some(2000.0), 100.0), 4);
        // 30 s after the first step, a new period: 4 doubles.
        assert_eq!(h.desired(30.0, 4, Some(2000.0), 100.0), 8);
    }

    #[test]
    fn scale_down_removes_one_pod_per_period_after_the_window() {
        let mut h = example();
        assert_eq!(h.desired(0.0, 8, Some(800.0), 100.0), 8);
        // Demand falls to 2 replicas: the 600 s window holds 8 ...
        assert_eq!(h.desired(300.0, 8, Some(200.0), 100.0), 8);
        // ... then one pod goes, and no other within 300 s.
        assert_eq!(h.desired(615.0, 8, Some(200.0), 100.0), 7);
        assert_eq!(h.desired(630.0, 7, Some(200.0), 100.0), 7);
        assert_eq!(h.desired(900.0, 7, Some(200.0), 100.0), 7);
        assert_eq!(h.desired(915.0, 7, Some(200.0), 100.0), 6);
    }

    #[test]
    fn select_min_takes_the_smallest_change_and_max_the_largest() {
        let both = |select| {
            Hpa::new(AutoscalingConfig {
                scale_down_policies: vec![
                    policy(HpaPolicyKind::Pods, 1.0, 15.0),
                    policy(HpaPolicyKind::Percent, 50.0, 15.0),
                ],
                scale_down_select: select,
                scale_down_window_s: 0.0,
                ..AutoscalingConfig::default()
            })
        };
        // From 10 towards 1: one pod, or half of them.
        assert_eq!(both(HpaSelect::Min).desired(0.0, 10, Some(100.0), 100.0), 9);
        assert_eq!(both(HpaSelect::Max).desired(0.0, 10, Some(100.0), 100.0), 5);
    }

    #[test]
    fn limits_and_unreadable_metrics() {
        let mut h = hpa();
        assert_eq!(h.desired(0.0, 3, Some(0.0), 5.0), 1, "min replicas");
        let mut h = hpa();
        assert_eq!(h.desired(0.0, 3, Some(1e9), 5.0), 7, "rate limit first");
        let mut h = hpa();
        assert_eq!(h.desired(0.0, 16, Some(1e9), 5.0), 16, "max replicas");
        assert_eq!(h.desired(15.0, 5, None, 5.0), 5, "no metric, no change");
    }

    #[test]
    fn notices_and_forecast_are_properties_of_the_nightshift_policies() {
        let with = |p: fn(ScalingPolicy) -> bool| -> Vec<&str> {
            ScalingPolicy::ALL
                .into_iter()
                .chain(ScalingPolicy::CANDIDATES)
                .filter(|&k| p(k))
                .map(ScalingPolicy::label)
                .collect()
        };
        assert_eq!(
            with(ScalingPolicy::is_nightshift),
            [
                "nightshift",
                "nightshift without notices",
                "nightshift + forecast",
                "nightshift + SLO loop"
            ]
        );
        assert_eq!(
            with(ScalingPolicy::notices),
            [
                "nightshift",
                "nightshift + forecast",
                "nightshift + SLO loop"
            ]
        );
        assert_eq!(with(ScalingPolicy::forecasts), ["nightshift + forecast"]);
        assert_eq!(
            with(ScalingPolicy::closes_the_slo_loop),
            ["nightshift + SLO loop"]
        );
    }

    #[test]
    fn night_window_wraps_midnight() {
        let cfg = NightWindowConfig::default();
        assert_eq!(night_window_replicas(&cfg, 7.99 * 3600.0), 3);
        assert_eq!(night_window_replicas(&cfg, 8.0 * 3600.0), 16);
        assert_eq!(night_window_replicas(&cfg, 19.99 * 3600.0), 16);
        assert_eq!(night_window_replicas(&cfg, 20.0 * 3600.0), 3);
        assert_eq!(night_window_replicas(&cfg, 86_400.0 + 2.0 * 3600.0), 3);
    }

    #[test]
    fn nightshift_policy_is_the_live_demand_computation() {
        let targets = Targets {
            waiting: Some(5.0),
            generation_tokens: Some(360.0),
            ..Targets::default()
        };
        let totals = Totals {
            pods: 3,
            signals: PerSignal {
                waiting: Some(7.0),
                running: Some(120.0),
                kv_cache: Some(1.2),
                generation_tokens: Some(1500.0),
                prompt_tokens: Some(6000.0),
            },
        };
        let (decision, value) = nightshift_metric(&totals, &targets).expect("valid");
        let live = demand::compute(&totals, &targets).expect("valid");
        assert_eq!(decision, live);
        assert_eq!(value, live.metric_value());
        // The HPA turns it into ceil(1500 / 360) = 5 replicas.
        assert_eq!(hpa().desired(0.0, 3, Some(value), demand::METRIC_TARGET), 5);
    }
}
