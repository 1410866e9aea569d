//! The inference SLO, defined once: whether a minute of serving is within it, and the bar a
//! policy's share of such minutes must reach on a trace.
//!
//! Every policy run ([`super::engine`]) and the honest ceiling's search ([`super::ceiling`])
//! judge their minutes with [`minute_within_slo`], so the ceiling is searched with the very test
//! its replay and the policies are scored by.

/// The quantile of a minute's queue waits held to the target.
pub const QUANTILE: f64 = 0.99;

/// Points of SLO-minute share a policy may give up against static peak on the same trace: a
/// few minutes a day (0.5 % of 1,440 is 7), well under what an operator would notice in a
/// day's p99, while no fleet that resizes by whole replicas keeps exactly static peak's share.
pub const BAR_MARGIN: f64 = 0.005;

/// The highest bar: 99.9 % of minutes (about 1.4 minutes a day). With [`BAR_MARGIN`] taken off a
/// share of at most 1 it does not bind; it keeps the bar below 1 should the margin be lowered.
pub const BAR_CAP: f64 = 0.999;

/// Whether a minute is within the SLO: the [`QUANTILE`] (nearest rank) of the queue waits of the
/// requests that started in it is at most `slo_s`, and the oldest request still waiting at its
/// end (`oldest_waiting_s`, 0 when none) has not waited longer. A minute in which nothing
/// started is judged on the oldest waiting alone. `waits` is reordered.
pub fn minute_within_slo(waits: &mut [f32], oldest_waiting_s: f64, slo_s: f64) -> bool {
    let mut quantile = 0.0f64;
    if !waits.is_empty() {
        let n = waits.len();
        let k = rank(n) - 1;
        let (_, v, _) = waits.select_nth_unstable_by(k, f32::total_cmp);
        quantile = f64::from(*v);
    }
    quantile <= slo_s && oldest_waiting_s <= slo_s
}

/// The nearest rank (1-based) of the [`QUANTILE`] among `n ≥ 1` values.
fn rank(n: usize) -> usize {
    ((QUANTILE * n as f64).ceil() as usize).clamp(1, n)
}

/// How many of `started` requests may wait longer than the target with the minute still within
/// the SLO (by [`minute_within_slo`]: the quantile's rank is at most the target exactly when no
/// more values than this are above it). Grows with `started`.
pub fn late_allowed(started: usize) -> usize {
    if started == 0 {
        0
    } else {
        started - rank(started)
    }
}

/// The SLO bar of a trace: the share of minutes static peak keeps within the SLO on it, less
/// [`BAR_MARGIN`], at most [`BAR_CAP`]. A policy meets the bar when its share is at least this.
pub fn bar(static_peak_share: f64) -> f64 {
    (static_peak_share - BAR_MARGIN).min(BAR_CAP)
}

/// Whether a share of minutes within the SLO meets `bar` (to a part in a million, so that a
/// share equal to the bar but for rounding in its division still meets it).
pub fn meets(share: f64, bar: f64) -> bool {
    share >= bar - 1e-6
}

/// The most minutes of `minutes` that may miss the SLO with the share still meeting `bar` (by
/// [`meets`]).
pub fn most_minutes_over(bar: f64, minutes: u64) -> u64 {
    let mut over = ((1.0 - bar).max(0.0) * minutes as f64).floor() as u64;
    // Rounding may leave the floor one off either way: settle it with the test itself.
    while over < minutes && meets(1.0 - (over + 1) as f64 / minutes as f64, bar) {
        over += 1;
    }
    while over > 0 && !meets(1.0 - over as f64 / minutes as f64, bar) {
        over -= 1;
    }
    over
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minute_is_judged_on_the_p99_of_its_started_waits_and_the_oldest_waiting() {
        let mut waits = vec![0.0f32; 99];
        waits.push(5.0);
        assert!(
            minute_within_slo(&mut waits, 0.0, 1.0),
            "1 slow in 100: p99 is the 99th value, 0"
        );
        let mut waits = vec![0.0f32; 98];
        waits.extend([2.0, 2.0]);
        assert!(!minute_within_slo(&mut waits, 0.0, 1.0));
        assert!(
            !minute_within_slo(&mut [], 3.0, 1.0),
            "nothing started, but a request waits 3 s"
        );
        assert!(minute_within_slo(&mut [], 0.0, 1.0));
        assert!(
            minute_within_slo(&mut [1.0], 1.0, 1.0),
            "at the target is within"
        );
    }

    #[test]
    fn late_allowed_is_exactly_what_the_judgement_tolerates() {
        for started in 0..=450 {
            let allowed = late_allowed(started);
            let with = |late: usize| {
                let mut waits = vec![0.0f32; started - late];
                waits.extend(std::iter::repeat_n(2.0f32, late));
                minute_within_slo(&mut waits, 0.0, 1.0)
            };
            assert!(with(allowed.min(started)), "{started}: {allowed} late pass");
            if allowed < started {
                assert!(!with(allowed + 1), "{started}: {} late fail", allowed + 1);
            }
            assert!(started == 0 || late_allowed(started - 1) <= allowed);
        }
        assert_eq!(late_allowed(100), 1);
        assert_eq!(late_allowed(99), 0);
        assert_eq!(late_allowed(250), 2);
    }

    #[test]
    fn the_bar_is_static_peaks_share_less_half_a_point_capped() {
        assert!((bar(1.0) - 0.995).abs() < 1e-12);
        assert!((bar(0.98) - 0.975).abs() < 1e-12);
        assert!(meets(0.995, bar(1.0)));
        assert!(meets(0.99499999995, bar(1.0)));
        assert!(!meets(0.9949, bar(1.0)));
    }

    #[test]
    fn most_minutes_over_is_the_last_count_that_meets_the_bar() {
        for minutes in [1u64, 60, 179, 1440, 10_080] {
            for b in [0.9, 0.975, 0.995, 0.999] {
                let over = most_minutes_over(b, minutes);
                let share = |o: u64| 1.0 - o as f64 / minutes as f64;
                assert!(over == 0 || meets(share(over), b), "{minutes} {b}");
                assert!(
                    over == minutes || !meets(share(over + 1), b),
                    "{minutes} {b}"
                );
            }
        }
        assert_eq!(most_minutes_over(0.995, 10_080), 50);
    }
}
