//! The policies compared and the HorizontalPodAutoscaler that turns a metric into replicas.
//!
//! The nightshift policy calls [`crate::demand::compute`] — the function the live scaler
//! answers KEDA with — on signal totals built the way its sources report them. The other
//! policies are what users run instead: a static fleet, a fixed night window, and KEDA's
//! Prometheus scaler on the waiting-queue length.

use std::collections::VecDeque;

use serde::Serialize;

use super::config::{AutoscalingConfig, NightWindowConfig};
use crate::demand::{self, Decision, DemandError, Targets, Totals};

/// Which scaling policy a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ScalingPolicy {
    StaticPeak,
    NightWindow,
    KedaPrometheus,
    Nightshift,
    /// nightshift with the daily forecast (the trigger's `forecast: daily`).
    NightshiftForecast,
    /// nightshift with the forecast and reclaim notices: the same scaling, research warned
    /// before preemption.
    NightshiftNotice,
}

impl ScalingPolicy {
    pub const ALL: [ScalingPolicy; 6] = [
        ScalingPolicy::StaticPeak,
        ScalingPolicy::NightWindow,
        ScalingPolicy::KedaPrometheus,
        ScalingPolicy::Nightshift,
        ScalingPolicy::NightshiftForecast,
        ScalingPolicy::NightshiftNotice,
    ];

    /// Whether the policy scales on nightshift's demand (and lends with its headroom).
    pub fn is_nightshift(self) -> bool {
        matches!(
            self,
            ScalingPolicy::Nightshift
                | ScalingPolicy::NightshiftForecast
                | ScalingPolicy::NightshiftNotice
        )
    }

    /// Whether the policy adds the daily forecast to nightshift's demand.
    pub fn forecasts(self) -> bool {
        matches!(
            self,
            ScalingPolicy::NightshiftForecast | ScalingPolicy::NightshiftNotice
        )
    }

    pub fn label(self) -> &'static str {
        match self {
            ScalingPolicy::StaticPeak => "static peak",
            ScalingPolicy::NightWindow => "night window",
            ScalingPolicy::KedaPrometheus => "KEDA prometheus waiting",
            ScalingPolicy::Nightshift => "nightshift",
            ScalingPolicy::NightshiftForecast => "nightshift + forecast",
            ScalingPolicy::NightshiftNotice => "nightshift + forecast + notice",
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
/// tolerance, stabilisation windows and the default rate-limiting policies (Kubernetes
/// `pkg/controller/podautoscaler`).
#[derive(Clone, Debug)]
pub struct Hpa {
    cfg: AutoscalingConfig,
    /// Recent raw recommendations, for the stabilisation windows.
    history: VecDeque<(f64, u32)>,
}

impl Hpa {
    pub fn new(cfg: AutoscalingConfig) -> Hpa {
        Hpa {
            cfg,
            history: VecDeque::new(),
        }
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
        // Rate limits per period: up by max(pods, percent), down by percent.
        let up_limit = (current + c.scale_up_pods)
            .max((f64::from(current) * (1.0 + c.scale_up_percent / 100.0)).floor() as u32);
        let down_limit = (f64::from(current) * (1.0 - c.scale_down_percent / 100.0))
            .ceil()
            .max(0.0) as u32;
        desired
            .clamp(down_limit, up_limit.max(down_limit))
            .clamp(c.min_replicas, c.max_replicas)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demand::PerSignal;

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
