//! A forecast of each inference service's daily shape: its demand by time of day and day of
//! week, learned from the service's own history in fixed memory.
//!
//! Pure: no I/O, no clocks, and nothing of the crate above it. The live scaler and the simulator
//! both feed a [`DailyShape`] the measured demand and ask it for the demand expected one lead
//! time ahead; [`with_forecast`] is the one rule that combines the two.
//!
//! # Model
//!
//! Time is cut into days (`day = floor(t / 86400)`) and each day into buckets of
//! [`ForecastConfig::bucket_s`] seconds. For each of the last [`ForecastConfig::days_kept`] days
//! the shape keeps, per bucket, the *peak* reading of that bucket (a ring indexed by day; a bucket
//! without readings stays missing, never zero), and per day the mean of its bucket peaks `m_d`.
//!
//! The forecast of bucket `b` of day `D` uses only days before `D`:
//!
//! ```text
//! shape(b) = median over the last `recent_days` days d < D that have bucket b and m_d > 0
//!            of v_d(b) / m_d                                   (the day's shape, its mean = 1)
//! level(D) = mean of m_{D-7}, m_{D-14} among those observed on at least half their buckets
//!            (the same weekday a week or two ago), or else
//!            median of m_d over the last `recent_days` days d < D with a reading
//! forecast(D, b) = shape(b) × level(D)
//! ```
//!
//! [`DailyShape::expected`] answers the peak of the forecast over the buckets that `(t, t + lead]`
//! touches, `None` when none of them has been observed on an earlier day.
//!
//! Normalising each day by its own mean separates the *shape* (when in the day demand rises)
//! from the *level* (how high the day runs): a weekend at a lower envelope is forecast at the
//! level of last weekend, and a Monday after a weekend at the level of last Monday, while the
//! shape still comes from the most recent days. The median makes the shape robust to one odd
//! day out of three, and a missing day is skipped (the median is over the days that were
//! observed), so it is never read as zero demand. A peak removed from the service's traffic is
//! forgotten once it is gone from most of the `recent_days` days (2 of the default 3).
//!
//! # Error bound
//!
//! When the demand repeats one daily shape `f` (each day possibly scaled by a constant level, the
//! same for the same weekday), sampled at least once per bucket, each bucket's forecast equals
//! that bucket's peak of `f` (times the day's level) exactly, after 1 day of history for a
//! constant level and after 8 days for a weekday/weekend envelope. `expected(t, lead)` is then
//! the peak of `f` over whole buckets, so it exceeds the peak of `f` over `[t, t + lead]` by at
//! most the rise of `f` within one bucket on each side, and is never below it. Noise of relative
//! size `ε` on the readings adds at most `ε` of the peak (bucket peaks keep the noise's maximum).
//! The tests hold the forecast to 10 % of the peak after 2 days of a smooth curve with a
//! morning ramp and noise, and a weekend/Monday envelope to 10 % after 8+ days.
//!
//! What it cannot do: foresee a day unlike the days before it (a launch, a holiday), follow a
//! shape that shifts by more than a bucket from day to day, or learn the level of a weekday from
//! a week in which that weekday was mostly not observed (it falls back to the recent days' level).
//! A partially observed day is normalised by the mean of the buckets it has, which biases its
//! shape when the missed part of the day runs at a different level.

use serde::{Deserialize, Serialize};

/// Seconds in a day; days are counted from the Unix epoch in UTC.
const DAY_S: f64 = 86_400.0;

/// Days back of the same weekday used for the day-of-week level: one and two weeks ago.
const WEEKLY_REFS: [i64; 2] = [7, 14];

/// A day serves as a weekly reference only when at least this fraction of its buckets was
/// observed: the mean of a day seen from 20:00 only (say, after a restart) would set the level
/// of a whole day from its quiet evening.
const MIN_REF_COVERAGE: f64 = 0.5;

/// The longest history kept, whatever the configuration says: bounds memory at 366 days ×
/// buckets per day per service (a year covers every weekly and monthly use).
const MAX_DAYS_KEPT: usize = 366;

/// The smallest bucket accepted: one second, far below any scrape interval, bounds memory at
/// 86 400 buckets per day.
const MIN_BUCKET_S: f64 = 1.0;

/// The farthest ahead [`DailyShape::expected`] looks: a week, beyond which the window would
/// only repeat buckets already looked at (and the cost stays bounded for any `lead`).
const MAX_LEAD_S: f64 = 7.0 * DAY_S;

/// Readings above this many replicas are ignored as garbage: no service runs a billion replicas,
/// and the bound keeps every sum of a day's bucket peaks finite.
const MAX_READING: f64 = 1e9;

/// Default lead of a trigger with `forecast: daily` (its `forecastLead`): a vLLM replica's
/// typical start-up with its weights cached on the node (image present, model loaded, CUDA
/// graphs captured), so the replica asked for ahead of a daily ramp is serving when the ramp
/// arrives.
pub const DEFAULT_FORECAST_LEAD: std::time::Duration = std::time::Duration::from_secs(180);

/// Tunables; Default = 300 s buckets, 14 days kept, 3 recent days for the daily median.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ForecastConfig {
    /// Width of a bucket of the day, seconds (clamped to 1 s – 1 day).
    pub bucket_s: f64,
    /// Days of history kept (clamped to 1 – 366); 14 covers the same weekday twice.
    pub days_kept: usize,
    /// Days the daily shape's median is taken over (clamped to 1 – `days_kept`).
    pub recent_days: usize,
}

impl Default for ForecastConfig {
    fn default() -> Self {
        ForecastConfig {
            // 5 minutes: finer than a vLLM replica's start-up, coarse enough that one day is
            // 288 buckets (a few KiB per service).
            bucket_s: 300.0,
            // Two weeks: the same weekday twice, so one odd week does not set its level alone.
            days_kept: 14,
            // Three days: the smallest median that outvotes one odd or missing day.
            recent_days: 3,
        }
    }
}

impl ForecastConfig {
    /// The configuration with every field in its accepted range (non-finite bucket → default).
    pub fn sanitized(self) -> ForecastConfig {
        let bucket_s = if self.bucket_s.is_finite() {
            self.bucket_s.clamp(MIN_BUCKET_S, DAY_S)
        } else {
            ForecastConfig::default().bucket_s
        };
        let days_kept = self.days_kept.clamp(1, MAX_DAYS_KEPT);
        ForecastConfig {
            bucket_s,
            days_kept,
            recent_days: self.recent_days.clamp(1, days_kept),
        }
    }

    /// Buckets in one day (the last one shorter when `bucket_s` does not divide a day).
    pub fn buckets_per_day(&self) -> usize {
        (DAY_S / self.bucket_s).ceil() as usize
    }
}

/// One day of the ring: which day it holds and the running sum of its bucket peaks.
#[derive(Clone, Copy, Debug, Default)]
struct DaySlot {
    /// The day held (days since the epoch), `None` before the slot is first used.
    day: Option<i64>,
    /// Sum of the day's bucket peaks.
    sum: f64,
    /// Buckets of the day with a reading.
    count: usize,
}

impl DaySlot {
    /// Mean of the day's bucket peaks, `None` with no reading.
    fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }
}

/// A service's learned demand shape by time of day and day of week; fixed memory.
#[derive(Clone, Debug)]
pub struct DailyShape {
    cfg: ForecastConfig,
    buckets_per_day: usize,
    /// `days_kept` slots, day `d` in slot `d mod days_kept`.
    days: Vec<DaySlot>,
    /// Bucket peaks, `days_kept × buckets_per_day`, row per slot; NaN = no reading.
    peaks: Vec<f64>,
    /// The latest day observed; readings older than the history it starts are ignored.
    newest: Option<i64>,
}

impl DailyShape {
    /// An empty history (the configuration sanitized, see [`ForecastConfig::sanitized`]).
    pub fn new(cfg: ForecastConfig) -> DailyShape {
        let cfg = cfg.sanitized();
        let buckets_per_day = cfg.buckets_per_day();
        DailyShape {
            cfg,
            buckets_per_day,
            days: vec![DaySlot::default(); cfg.days_kept],
            peaks: vec![f64::NAN; cfg.days_kept * buckets_per_day],
            newest: None,
        }
    }

    /// The configuration in force (sanitized).
    pub fn config(&self) -> ForecastConfig {
        self.cfg
    }

    /// Records a demand reading in replicas at `t` seconds (Unix time, UTC; day =
    /// floor(t/86400), weekday = day mod 7, any fixed epoch works). Non-finite or negative
    /// readings (and absurd ones, above 10⁹ replicas) are ignored. Readings may come every few
    /// seconds; the bucket keeps what the forecast needs (the bucket's peak). Readings older than the history kept are ignored.
    pub fn observe(&mut self, t: f64, replicas: f64) {
        if !replicas.is_finite() || !(0.0..=MAX_READING).contains(&replicas) {
            return;
        }
        let Some((day, bucket)) = self.locate(t) else {
            return;
        };
        let kept = self.cfg.days_kept as i64;
        if self.newest.is_some_and(|newest| day <= newest - kept) {
            return;
        }
        let slot = self.slot_of(day);
        match self.days[slot].day {
            Some(held) if held > day => return,
            Some(held) if held == day => {}
            _ => self.reset_slot(slot, day),
        }
        self.newest = Some(self.newest.map_or(day, |newest| newest.max(day)));
        let at = slot * self.buckets_per_day + bucket;
        let old = self.peaks[at];
        if old.is_nan() {
            self.peaks[at] = replicas;
            self.days[slot].sum += replicas;
            self.days[slot].count += 1;
        } else if replicas > old {
            self.peaks[at] = replicas;
            self.days[slot].sum += replicas - old;
        }
    }

    /// The demand expected over (t, t + lead]: the peak of the forecast over the buckets that
    /// window touches. None while the history cannot support a forecast (no earlier day has a
    /// reading at those times of day). `lead` is taken within 0 – 7 days.
    pub fn expected(&self, t: f64, lead: f64) -> Option<f64> {
        let lead = if lead.is_finite() {
            lead.clamp(0.0, MAX_LEAD_S)
        } else {
            0.0
        };
        let end = t + lead;
        let mut at = t;
        let mut best: Option<f64> = None;
        loop {
            let (day, bucket) = self.locate(at)?;
            if let Some(value) = self.forecast_bucket(day, bucket) {
                best = Some(best.map_or(value, |b: f64| b.max(value)));
            }
            at = self.next_bucket_start(day, bucket);
            if at > end {
                return best;
            }
        }
    }

    /// Days with at least one reading in the history (for explanations).
    pub fn days_learned(&self) -> usize {
        let Some(newest) = self.newest else {
            return 0;
        };
        let kept = self.cfg.days_kept as i64;
        self.days
            .iter()
            .filter(|s| s.count > 0 && s.day.is_some_and(|d| d > newest - kept))
            .count()
    }

    /// The forecast of one bucket of one day from the days before it; see the module docs.
    fn forecast_bucket(&self, day: i64, bucket: usize) -> Option<f64> {
        let mut seen = false;
        let mut ratios: Vec<f64> = Vec::with_capacity(self.cfg.recent_days);
        for back in 1..=self.cfg.days_kept as i64 {
            if ratios.len() == self.cfg.recent_days {
                break;
            }
            let Some((slot, value)) = self.peak(day - back, bucket) else {
                continue;
            };
            seen = true;
            match self.days[slot].mean() {
                Some(mean) if mean > 0.0 => ratios.push(value / mean),
                _ => {}
            }
        }
        if !seen {
            return None;
        }
        // Every day seen at this bucket ran at zero all day: that is the forecast.
        let Some(shape) = median(&mut ratios) else {
            return Some(0.0);
        };
        Some(shape * self.level(day))
    }

    /// The demand level (mean of the bucket peaks) expected for `day`; see the module docs.
    fn level(&self, day: i64) -> f64 {
        let refs: Vec<f64> = WEEKLY_REFS
            .iter()
            .filter_map(|back| self.held(day - back))
            .filter(|s| s.count as f64 >= MIN_REF_COVERAGE * self.buckets_per_day as f64)
            .filter_map(DaySlot::mean)
            .collect();
        if !refs.is_empty() {
            return refs.iter().sum::<f64>() / refs.len() as f64;
        }
        let mut recent: Vec<f64> = (1..=self.cfg.days_kept as i64)
            .filter_map(|back| self.held(day - back).and_then(DaySlot::mean))
            .take(self.cfg.recent_days)
            .collect();
        median(&mut recent).unwrap_or(0.0)
    }

    /// The slot of `day` if the history holds that day.
    fn held(&self, day: i64) -> Option<&DaySlot> {
        let kept = self.cfg.days_kept as i64;
        let newest = self.newest?;
        if day <= newest - kept || day > newest {
            return None;
        }
        let slot = &self.days[self.slot_of(day)];
        (slot.day == Some(day)).then_some(slot)
    }

    /// The peak of `bucket` on `day` with its slot, if the history has it.
    fn peak(&self, day: i64, bucket: usize) -> Option<(usize, f64)> {
        self.held(day)?;
        let slot = self.slot_of(day);
        let value = self.peaks[slot * self.buckets_per_day + bucket];
        (!value.is_nan()).then_some((slot, value))
    }

    /// Day and bucket of time `t`; `None` for a non-finite time or one beyond ±2^53 s.
    fn locate(&self, t: f64) -> Option<(i64, usize)> {
        // Beyond 2^53 s an f64 no longer resolves seconds, and the day would not fit an i64
        // arithmetic comfortably; no real clock is there.
        const LIMIT_S: f64 = 9.007_199_254_740_992e15;
        if !t.is_finite() || t.abs() > LIMIT_S {
            return None;
        }
        let day = (t / DAY_S).floor();
        let into_day = (t - day * DAY_S).clamp(0.0, DAY_S);
        let bucket = ((into_day / self.cfg.bucket_s) as usize).min(self.buckets_per_day - 1);
        Some((day as i64, bucket))
    }

    /// Start of the bucket after `bucket` of `day` (rolling over to the next day).
    fn next_bucket_start(&self, day: i64, bucket: usize) -> f64 {
        let day_start = day as f64 * DAY_S;
        if bucket + 1 >= self.buckets_per_day {
            day_start + DAY_S
        } else {
            day_start + (bucket + 1) as f64 * self.cfg.bucket_s
        }
    }

    /// The ring slot of `day`.
    fn slot_of(&self, day: i64) -> usize {
        day.rem_euclid(self.cfg.days_kept as i64) as usize
    }

    /// Empties `slot` to hold `day`.
    fn reset_slot(&mut self, slot: usize, day: i64) {
        let row = slot * self.buckets_per_day;
        self.peaks[row..row + self.buckets_per_day].fill(f64::NAN);
        self.days[slot] = DaySlot {
            day: Some(day),
            sum: 0.0,
            count: 0,
        };
    }
}

/// The median of `values` (mean of the middle two for an even count), `None` when empty.
fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    })
}

/// What the trigger reports: max(now, forecast); `true` when the forecast decided (strictly
/// above now). A missing or non-finite forecast leaves `now`.
pub fn with_forecast(now: f64, forecast: Option<f64>) -> (f64, bool) {
    match forecast {
        Some(f) if f.is_finite() && f > now => (f, true),
        _ => (now, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readings every 15 s, as the simulator's step and a typical KEDA polling interval.
    const STEP_S: f64 = 15.0;

    /// The stated error of the tests: 10 % of the shape's peak.
    const TOLERANCE: f64 = 0.10;

    /// A smooth daily curve peaking at 10 replicas: 1 replica at night, a morning ramp from
    /// 07:00 to 09:00 up to 8, a lunchtime bump to 10, easing down to 1 by 22:00.
    fn curve(t: f64) -> f64 {
        let h = (t.rem_euclid(DAY_S)) / 3600.0;
        let smooth = |x: f64| {
            let x = x.clamp(0.0, 1.0);
            x * x * (3.0 - 2.0 * x)
        };
        let ramp = 7.0 * smooth((h - 7.0) / 2.0);
        let bump = 2.0 * (-((h - 12.5) / 1.0).powi(2)).exp();
        let ease = 7.0 * smooth((h - 18.0) / 4.0);
        1.0 + ramp + bump - ease
    }

    /// Deterministic noise in [-amp, amp] (a hash of the time, no RNG needed).
    fn noise(t: f64, amp: f64) -> f64 {
        let x = ((t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) as f64 / (1u64 << 53) as f64;
        (2.0 * x - 1.0) * amp
    }

    fn feed(shape: &mut DailyShape, from: f64, to: f64, f: impl Fn(f64) -> f64) {
        let mut t = from;
        while t < to {
            shape.observe(t, f(t));
            t += STEP_S;
        }
    }

    /// The true peak of `f` over [t, t + lead], sampled finely.
    fn true_peak(f: impl Fn(f64) -> f64, t: f64, lead: f64) -> f64 {
        (0..=60)
            .map(|i| f(t + lead * i as f64 / 60.0))
            .fold(f64::MIN, f64::max)
    }

    #[test]
    fn learns_a_daily_shape_within_ten_percent_of_the_peak_after_two_days() {
        let mut shape = DailyShape::new(ForecastConfig::default());
        let f = |t: f64| curve(t) * (1.0 + noise(t, 0.03));
        feed(&mut shape, 0.0, 2.0 * DAY_S, f);
        assert_eq!(shape.days_learned(), 2);
        let lead = 180.0;
        let mut t = 2.0 * DAY_S;
        while t < 3.0 * DAY_S {
            let expected = shape.expected(t, lead).expect("two days learned");
            let truth = true_peak(curve, t, lead);
            assert!(
                (expected - truth).abs() <= TOLERANCE * 10.0,
                "at {t}: expected {expected}, truth {truth}"
            );
            t += 60.0;
        }
    }

    #[test]
    fn forecasts_the_morning_ramp_ahead_of_it() {
        let mut shape = DailyShape::new(ForecastConfig::default());
        feed(&mut shape, 0.0, 2.0 * DAY_S, curve);
        // 08:57 on day 3, three minutes before the ramp's steep middle ends: the forecast is
        // already at the level of 09:00.
        let t = 2.0 * DAY_S + 8.0 * 3600.0 + 57.0 * 60.0;
        let expected = shape.expected(t, 180.0).unwrap_or(0.0);
        assert!(expected >= curve(t + 180.0) - 1e-9);
        let (reported, decided) = with_forecast(curve(t) * 0.5, Some(expected));
        assert!(decided && reported == expected);
    }

    #[test]
    fn nothing_to_forecast_before_a_day_at_those_times() {
        let mut shape = DailyShape::new(ForecastConfig::default());
        assert_eq!(shape.expected(1000.0, 180.0), None);
        feed(&mut shape, 0.0, 12.0 * 3600.0, curve);
        // Same day: only earlier days count.
        assert_eq!(shape.expected(6.0 * 3600.0, 180.0), None);
        // Next day's morning was observed, its evening not.
        assert!(shape.expected(DAY_S + 6.0 * 3600.0, 180.0).is_some());
        assert_eq!(shape.expected(DAY_S + 18.0 * 3600.0, 180.0), None);
        assert_eq!(shape.days_learned(), 1);
    }

    #[test]
    fn forgets_a_removed_peak_within_recent_days() {
        let cfg = ForecastConfig::default();
        let mut shape = DailyShape::new(cfg);
        let peak_at = 15.0 * 3600.0;
        let with_peak = |t: f64| {
            let h = t.rem_euclid(DAY_S);
            curve(t)
                + if (h - peak_at).abs() < 1800.0 {
                    10.0
                } else {
                    0.0
                }
        };
        feed(&mut shape, 0.0, 4.0 * DAY_S, with_peak);
        let day = |d: usize| d as f64 * DAY_S + peak_at;
        let peaked = shape.expected(day(4), 60.0).unwrap_or(0.0);
        assert!(peaked > curve(peak_at) + 8.0, "learned the peak: {peaked}");
        feed(
            &mut shape,
            4.0 * DAY_S,
            (4 + cfg.recent_days) as f64 * DAY_S,
            curve,
        );
        let after = shape
            .expected(day(4 + cfg.recent_days), 60.0)
            .unwrap_or(f64::MAX);
        assert!(
            (after - curve(peak_at)).abs() <= TOLERANCE * 20.0,
            "forgot the peak: {after}"
        );
    }

    #[test]
    fn a_missed_day_neither_zeroes_nor_breaks_the_forecast() {
        let mut shape = DailyShape::new(ForecastConfig::default());
        feed(&mut shape, 0.0, 3.0 * DAY_S, curve);
        // Day 3 missing entirely; day 4 forecast from days 0–2.
        let t = 4.0 * DAY_S + 12.0 * 3600.0;
        let expected = shape.expected(t, 180.0).unwrap_or(0.0);
        assert!((expected - true_peak(curve, t, 180.0)).abs() <= TOLERANCE * 10.0);
        // A half-missed day (the afternoon only) does not pull the morning down.
        feed(&mut shape, 4.0 * DAY_S + 12.0 * 3600.0, 5.0 * DAY_S, curve);
        let t = 5.0 * DAY_S + 10.0 * 3600.0;
        let expected = shape.expected(t, 180.0).unwrap_or(0.0);
        assert!((expected - true_peak(curve, t, 180.0)).abs() <= TOLERANCE * 10.0);
    }

    /// Day 0 is a Monday here: days 5 and 6 of each week are the weekend, at 40 % of the weekday
    /// envelope.
    fn weekly(t: f64) -> f64 {
        let weekday = (t / DAY_S).floor().rem_euclid(7.0);
        curve(t) * if weekday >= 5.0 { 0.4 } else { 1.0 }
    }

    #[test]
    fn weekend_and_monday_are_forecast_at_their_own_level_after_eight_days() {
        let mut shape = DailyShape::new(ForecastConfig::default());
        let noon = 12.5 * 3600.0;
        // Days 0–12: Monday of week 2 is day 7, its weekend days 12 and 13.
        feed(&mut shape, 0.0, 12.0 * DAY_S, weekly);
        let saturday = 12.0 * DAY_S + noon;
        let expected = shape.expected(saturday, 60.0).unwrap_or(0.0);
        let truth = true_peak(weekly, saturday, 60.0);
        assert!(
            (expected - truth).abs() <= TOLERANCE * 10.0,
            "{expected} vs {truth}"
        );
        feed(&mut shape, 12.0 * DAY_S, 14.0 * DAY_S, weekly);
        let monday = 14.0 * DAY_S + noon;
        let expected = shape.expected(monday, 60.0).unwrap_or(0.0);
        let truth = true_peak(weekly, monday, 60.0);
        assert!(
            (expected - truth).abs() <= TOLERANCE * 10.0,
            "{expected} vs {truth}"
        );
    }

    /// The simulator's use: observe and ask every 15 s for a week (40,320 of each).
    #[test]
    fn a_week_at_the_simulators_step_stays_cheap() {
        let mut shape = DailyShape::new(ForecastConfig::default());
        let started = std::time::Instant::now();
        let mut t = 0.0;
        let mut decided = 0;
        while t < 7.0 * DAY_S {
            let now = curve(t);
            shape.observe(t, now);
            decided += usize::from(with_forecast(now, shape.expected(t, 180.0)).1);
            t += STEP_S;
        }
        assert!(decided > 0);
        // Far above the few milliseconds it takes, even unoptimised on a loaded machine: a
        // guard against a predict cost that grows with the history, not a benchmark.
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn memory_does_not_grow_with_time() {
        let mut shape = DailyShape::new(ForecastConfig::default());
        let (peaks, days) = (shape.peaks.len(), shape.days.len());
        feed(&mut shape, 0.0, 60.0 * DAY_S, curve);
        assert_eq!((shape.peaks.len(), shape.days.len()), (peaks, days));
        assert_eq!(peaks, 14 * 288);
        assert_eq!(shape.days_learned(), 14);
    }

    #[test]
    fn garbage_is_ignored() {
        let mut shape = DailyShape::new(ForecastConfig::default());
        feed(&mut shape, 0.0, DAY_S, |_| 2.0);
        let before = shape.expected(DAY_S, 600.0);
        for (t, v) in [
            (DAY_S / 2.0, f64::NAN),
            (DAY_S / 2.0, f64::INFINITY),
            (DAY_S / 2.0, -1.0),
            (f64::NAN, 5.0),
            (f64::INFINITY, 5.0),
            (1e300, 5.0),
        ] {
            shape.observe(t, v);
        }
        assert_eq!(shape.expected(DAY_S, 600.0), before);
        assert_eq!(before, Some(2.0));
        assert_eq!(shape.expected(f64::NAN, 600.0), None);
        assert_eq!(shape.expected(DAY_S, f64::NAN), Some(2.0));
        // Readings older than the history kept do not disturb it.
        shape.observe(DAY_S * 40.0, 1.0);
        shape.observe(0.0, 99.0);
        assert!(shape.expected(DAY_S * 40.0, 60.0).is_none());
    }

    #[test]
    fn odd_configurations_are_sanitized() {
        let shape = DailyShape::new(ForecastConfig {
            bucket_s: f64::NAN,
            days_kept: 0,
            recent_days: 9,
        });
        assert_eq!(
            shape.config(),
            ForecastConfig {
                bucket_s: 300.0,
                days_kept: 1,
                recent_days: 1
            }
        );
        // A bucket that does not divide a day: the last bucket is short.
        let mut shape = DailyShape::new(ForecastConfig {
            bucket_s: 7000.0,
            ..ForecastConfig::default()
        });
        feed(&mut shape, 0.0, DAY_S, |t| t.rem_euclid(DAY_S) / 3600.0);
        assert!(shape.expected(DAY_S + 86_000.0, 300.0).is_some());
    }

    #[test]
    fn with_forecast_laws() {
        assert_eq!(with_forecast(2.0, None), (2.0, false));
        assert_eq!(with_forecast(2.0, Some(1.0)), (2.0, false));
        assert_eq!(with_forecast(2.0, Some(2.0)), (2.0, false));
        assert_eq!(with_forecast(2.0, Some(3.0)), (3.0, true));
        assert_eq!(with_forecast(2.0, Some(f64::NAN)), (2.0, false));
        assert_eq!(with_forecast(2.0, Some(f64::INFINITY)), (2.0, false));
    }

    proptest::proptest! {
        /// A piecewise-constant daily shape aligned on buckets is learned exactly after 1 day,
        /// and the answer is the peak of the touched buckets.
        #[test]
        fn learns_any_bucket_aligned_shape_exactly(
            hours in proptest::collection::vec(0.0f64..50.0, 24),
            at in 0.0f64..DAY_S,
            lead in 0.0f64..7200.0,
            days in 1usize..4,
        ) {
            let f = |t: f64| hours[((t.rem_euclid(DAY_S)) / 3600.0) as usize % 24];
            let mut shape = DailyShape::new(ForecastConfig::default());
            feed(&mut shape, 0.0, days as f64 * DAY_S, f);
            let t = days as f64 * DAY_S + at;
            let expected = shape.expected(t, lead);
            let first = (t / 3600.0).floor() as usize;
            let last = ((t + lead) / 3600.0).floor() as usize;
            let truth = (first..=last).map(|h| hours[h % 24]).fold(0.0, f64::max);
            let got = expected.unwrap_or(-1.0);
            proptest::prop_assert!((got - truth).abs() <= 1e-9 * (1.0 + truth), "{got} vs {truth}");
        }

        /// Whatever it is fed, the shape answers a finite, non-negative demand or none, and
        /// keeps its size; `with_forecast` never reports below now.
        #[test]
        fn any_input_keeps_answers_sane(
            readings in proptest::collection::vec((-1e7f64..1e8, proptest::num::f64::ANY), 0..200),
            now in 0.0f64..100.0,
            at in -1e7f64..1e8,
            lead in proptest::num::f64::ANY,
        ) {
            let mut shape = DailyShape::new(ForecastConfig { bucket_s: 600.0, days_kept: 8, recent_days: 3 });
            let size = shape.peaks.len();
            for (t, v) in readings {
                shape.observe(t, v);
            }
            proptest::prop_assert_eq!(shape.peaks.len(), size);
            proptest::prop_assert!(shape.days_learned() <= 8);
            let expected = shape.expected(at, lead);
            if let Some(e) = expected {
                proptest::prop_assert!(e.is_finite() && e >= 0.0);
            }
            let (reported, decided) = with_forecast(now, expected);
            proptest::prop_assert!(reported >= now);
            proptest::prop_assert_eq!(decided, reported > now);
        }
    }
}
