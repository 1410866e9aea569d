//! A service's SLO, closed on itself: how much of a replica's learned capacity the trigger may
//! use, adapted to the queue wait measured on that same service.
//!
//! Pure: no I/O, no clocks (times are seconds on any monotonic clock the caller keeps), nothing
//! of the crate above it; the simulator runs the same code.
//!
//! # Why a loop
//!
//! A fixed utilization of the learned capacity ([`crate::core::capacity`]) is right for one
//! service only: how much of a replica's capacity is safe depends on the prompt mix (a queue of
//! three 12,000-token prompts costs seconds; of three chat turns, milliseconds), on the
//! arrivals' burstiness and on how long a new replica takes to serve. The service's own queue
//! wait says whether the current utilization keeps its objective.
//!
//! # The law
//!
//! Additive increase, multiplicative decrease on the utilization `u`, within
//! [[`SloLoopConfig::min`], [`SloLoopConfig::max`]]:
//!
//! - **Cut at once**: when the p99 queue wait measured over the last window exceeds the
//!   objective, `u ← max(min, u × decrease)`. Further cuts wait [`SloLoopConfig::settle_s`]:
//!   the replicas a cut asks for need a start-up before they serve, and until then the tail
//!   stays high whatever `u` is; cutting on it again would drive `u` to its floor for one burst.
//! - **Ease slowly**: after [`SloLoopConfig::ease_after_s`] without a reading above
//!   [`SloLoopConfig::ease_below`] × the objective, `u ← min(max, u + increase)`, and again
//!   every `ease_after_s` while the tail stays that low. A reading between the two leaves `u`
//!   where it is and restarts the wait.
//! - **Hold without evidence**: a window with fewer than [`SloLoopConfig::min_requests`]
//!   requests measures no tail (one slow request of five is not a p99), and a failed reading
//!   is no evidence either: `u` stays.
//!
//! Cuts are large and rare, eases small and slow, so the loop spends most of its time at a
//! utilization that keeps the objective with some margin, and returns there within a few
//! cuts after the mix changes.

use serde::Serialize;

/// Tunables of the loop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SloLoopConfig {
    /// The objective: the p99 queue wait (s) the service must keep.
    pub objective_s: f64,
    /// Lowest utilization: 0.2 keeps five times the learned capacity in reserve, more than any
    /// burst seen on the traces measured; below it, a service that still misses has a problem
    /// more replicas do not solve (a model too slow for its prompts).
    pub min: f64,
    /// Highest utilization: 0.9 of a replica's saturated throughput still leaves room for the
    /// arrivals within a rate window.
    pub max: f64,
    /// The multiplicative cut: 0.75, so 0.6 → 0.45 → 0.34 → 0.25: three misses a settle time
    /// apart reach the neighbourhood of the floor.
    pub decrease: f64,
    /// The additive ease: 0.02 per step, 15 steps from 0.45 back to 0.75.
    pub increase: f64,
    /// Seconds of low tail before each ease: an hour, so that a service eases over a quiet
    /// evening and not between two bursts.
    pub ease_after_s: f64,
    /// Share of the objective under which the tail counts as low.
    pub ease_below: f64,
    /// Seconds after a cut before another: a replica's start-up (3 min of weight loading and
    /// warm-up for a 70B model) plus a minute to see its effect.
    pub settle_s: f64,
    /// Requests a window needs for its p99 to count: below 20, the slowest request alone is the
    /// p99 estimate.
    pub min_requests: f64,
}

/// The loop's defaults with `objective_s` as the objective.
pub fn config(objective_s: f64) -> SloLoopConfig {
    SloLoopConfig {
        objective_s,
        min: 0.2,
        max: 0.9,
        decrease: 0.75,
        increase: 0.02,
        ease_after_s: 3600.0,
        ease_below: 0.5,
        settle_s: 240.0,
        min_requests: 20.0,
    }
}

/// What the last reading did to the utilization, for explanations and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Step {
    /// No reading yet.
    Start,
    /// The tail exceeded the objective: cut.
    Cut,
    /// The tail exceeded the objective within the settle time of the last cut: held.
    Settling,
    /// The tail stayed low long enough: eased.
    Eased,
    /// The tail is within the objective but not low enough, or not for long enough: held.
    Held,
    /// Too few requests, or no reading: held.
    NoEvidence,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Start => "start",
            Step::Cut => "cut",
            Step::Settling => "settling",
            Step::Eased => "eased",
            Step::Held => "held",
            Step::NoEvidence => "no-evidence",
        }
    }
}

/// One service's loop state.
#[derive(Clone, Debug, PartialEq)]
pub struct SloLoop {
    cfg: SloLoopConfig,
    utilization: f64,
    last_cut: Option<f64>,
    /// Since when the tail has been low (`None`: not low at the last reading).
    low_since: Option<f64>,
    step: Step,
    cuts: u64,
}

/// A window's reading of the service's queue wait.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TailReading {
    /// The p99 queue wait (s) estimated over the window.
    pub p99_s: f64,
    /// Requests that left the queue in the window.
    pub requests: f64,
}

impl SloLoop {
    /// A loop starting at `utilization` (clamped to the configured bounds).
    pub fn new(cfg: SloLoopConfig, utilization: f64) -> SloLoop {
        SloLoop {
            cfg,
            utilization: clamp(utilization, &cfg),
            last_cut: None,
            low_since: None,
            step: Step::Start,
            cuts: 0,
        }
    }

    /// The utilization to use now.
    pub fn utilization(&self) -> f64 {
        self.utilization
    }

    /// What the last reading did.
    pub fn step(&self) -> Step {
        self.step
    }

    /// Cuts so far.
    pub fn cuts(&self) -> u64 {
        self.cuts
    }

    /// Takes the reading of the window ending at `now` (`None`: none could be made) and returns
    /// the utilization to use.
    pub fn observe(&mut self, now: f64, reading: Option<TailReading>) -> f64 {
        let cfg = self.cfg;
        self.step = match reading {
            Some(r) if r.requests >= cfg.min_requests && r.p99_s.is_finite() => {
                self.judge(now, r.p99_s)
            }
            _ => Step::NoEvidence,
        };
        self.utilization
    }

    fn judge(&mut self, now: f64, p99_s: f64) -> Step {
        let cfg = self.cfg;
        if p99_s > cfg.objective_s {
            self.low_since = None;
            if self.last_cut.is_some_and(|t| now - t < cfg.settle_s) {
                return Step::Settling;
            }
            self.last_cut = Some(now);
            self.cuts += 1;
            self.utilization = clamp(self.utilization * cfg.decrease, &cfg);
            return Step::Cut;
        }
        if p99_s > cfg.objective_s * cfg.ease_below {
            self.low_since = None;
            return Step::Held;
        }
        let since = *self.low_since.get_or_insert(now);
        if now - since >= cfg.ease_after_s {
            self.low_since = Some(now);
            self.utilization = clamp(self.utilization + cfg.increase, &cfg);
            return Step::Eased;
        }
        Step::Held
    }
}

fn clamp(u: f64, cfg: &SloLoopConfig) -> f64 {
    if u.is_finite() {
        u.clamp(cfg.min, cfg.max)
    } else {
        cfg.max
    }
}

/// The `q` quantile of a histogram's observations in a window, as Prometheus'
/// `histogram_quantile` computes it: `bounds` are the buckets' upper bounds in increasing order
/// (the `+Inf` bucket excluded), `counts` the observations per bucket in the window
/// (non-cumulative; one more than `bounds`, the last for `+Inf`). Linear within the bucket the
/// rank falls in, from 0 for the first; the highest finite bound when it falls in `+Inf`.
/// `None` without observations or with malformed input.
pub fn histogram_quantile(q: f64, bounds: &[f64], counts: &[f64]) -> Option<f64> {
    if counts.len() != bounds.len() + 1 || !(0.0..=1.0).contains(&q) {
        return None;
    }
    if counts.iter().any(|c| !c.is_finite() || *c < 0.0) {
        return None;
    }
    let total: f64 = counts.iter().sum();
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut below = 0.0;
    for (i, count) in counts.iter().enumerate() {
        if below + count >= rank && *count > 0.0 {
            let Some(&upper) = bounds.get(i) else {
                return bounds.last().copied();
            };
            let lower = if i == 0 { 0.0 } else { bounds[i - 1] };
            return Some(lower + (upper - lower) * ((rank - below) / count).clamp(0.0, 1.0));
        }
        below += count;
    }
    bounds.last().copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reading(p99_s: f64) -> Option<TailReading> {
        Some(TailReading {
            p99_s,
            requests: 100.0,
        })
    }

    #[test]
    fn a_miss_cuts_at_once_then_settles_before_cutting_again() {
        let mut l = SloLoop::new(config(1.0), 0.6);
        let cut = l.observe(0.0, reading(1.5));
        assert_eq!(cut, 0.6 * 0.75);
        assert_eq!(l.step(), Step::Cut);
        // Still high while the new replicas start: no second cut.
        assert_eq!(l.observe(60.0, reading(3.0)), cut);
        assert_eq!(l.step(), Step::Settling);
        assert_eq!(l.observe(240.0, reading(1.2)), cut * 0.75);
        assert_eq!(l.cuts(), 2);
    }

    #[test]
    fn a_low_tail_eases_slowly_and_a_middling_one_holds() {
        let mut l = SloLoop::new(config(1.0), 0.5);
        for t in (0..3600).step_by(60) {
            assert_eq!(l.observe(f64::from(t), reading(0.1)), 0.5);
        }
        assert_eq!(l.observe(3600.0, reading(0.1)), 0.52);
        assert_eq!(l.step(), Step::Eased);
        // Within the objective but above half of it: the wait starts again.
        l.observe(3660.0, reading(0.8));
        assert_eq!(l.step(), Step::Held);
        l.observe(7200.0, reading(0.1));
        assert_eq!(l.utilization(), 0.52);
        l.observe(7260.0 + 3600.0, reading(0.1));
        assert_eq!(l.utilization(), 0.54);
    }

    #[test]
    fn too_few_requests_or_no_reading_are_no_evidence() {
        let mut l = SloLoop::new(config(1.0), 0.6);
        l.observe(
            0.0,
            Some(TailReading {
                p99_s: 30.0,
                requests: 5.0,
            }),
        );
        assert_eq!((l.step(), l.utilization()), (Step::NoEvidence, 0.6));
        l.observe(10.0, None);
        assert_eq!((l.step(), l.utilization()), (Step::NoEvidence, 0.6));
        l.observe(20.0, reading(f64::NAN));
        assert_eq!(l.utilization(), 0.6);
    }

    #[test]
    fn quantiles_follow_prometheus_histogram_quantile() {
        let bounds = [0.5, 1.0, 2.0];
        // 90 below 0.5 s, 8 in (0.5, 1], 2 in (1, 2]: the 99th of 100 is the first of the two.
        let counts = [90.0, 8.0, 2.0, 0.0];
        let p99 = histogram_quantile(0.99, &bounds, &counts).expect("observations");
        assert!((p99 - 1.5).abs() < 1e-9, "{p99}");
        let p50 = histogram_quantile(0.5, &bounds, &counts).expect("observations");
        assert!((p50 - 0.5 * 50.0 / 90.0).abs() < 1e-9, "{p50}");
        // In +Inf: the highest finite bound.
        assert_eq!(
            histogram_quantile(0.99, &bounds, &[0.0, 0.0, 0.0, 5.0]),
            Some(2.0)
        );
        assert_eq!(histogram_quantile(0.99, &bounds, &[0.0; 4]), None);
        assert_eq!(histogram_quantile(0.99, &bounds, &[1.0; 3]), None);
        assert_eq!(
            histogram_quantile(0.99, &bounds, &[-1.0, 0.0, 0.0, 2.0]),
            None
        );
    }

    proptest! {
        #[test]
        fn utilization_stays_within_its_bounds_and_only_a_miss_lowers_it(
            start in 0.0f64..2.0,
            tails in proptest::collection::vec((0.0f64..5.0, 0.0f64..200.0), 1..200),
        ) {
            let cfg = config(1.0);
            let mut l = SloLoop::new(cfg, start);
            for (i, (p99_s, requests)) in tails.into_iter().enumerate() {
                let before = l.utilization();
                let now = i as f64 * 60.0;
                let u = l.observe(now, Some(TailReading { p99_s, requests }));
                prop_assert!((cfg.min..=cfg.max).contains(&u));
                if u < before {
                    prop_assert!(p99_s > cfg.objective_s && requests >= cfg.min_requests);
                    prop_assert_eq!(l.step(), Step::Cut);
                }
                if u > before {
                    prop_assert!(p99_s <= cfg.objective_s * cfg.ease_below);
                }
            }
        }

        #[test]
        fn quantiles_lie_within_the_buckets_and_grow_with_q(
            counts in proptest::collection::vec(0.0f64..100.0, 5),
            q in 0.0f64..1.0,
        ) {
            let bounds = [0.3, 0.5, 1.0, 2.5];
            if let Some(v) = histogram_quantile(q, &bounds, &counts) {
                prop_assert!((0.0..=2.5).contains(&v));
                let higher = histogram_quantile((q + 0.01).min(1.0), &bounds, &counts);
                prop_assert!(higher.is_some_and(|h| h >= v - 1e-9));
            }
        }
    }
}
