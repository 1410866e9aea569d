//! The night window chosen with hindsight: the best fixed day/night schedule for this very
//! trace, a yardstick a policy that sees only the past should beat.
//!
//! A coarse grid of windows ([`STARTS`] × [`ENDS`]) is swept; day replicas stay at static peak's
//! size. For each window, the fewest night replicas whose run keeps the SLO bar
//! ([`super::slo::bar`]) are found by bisection: fewer replicas lend more and keep fewer minutes,
//! so the fewest that keep the bar lend the most the window can (a bisection assumes that order;
//! a count above the answer that happened to miss the bar is not looked for). Among the windows,
//! the one with the most useful GPU-hours (lent − lost) wins; ties go to the earlier window of
//! the grid. A run that misses the bar is stopped as soon as it has missed it, so failing
//! probes cost little. Every window's search is independent and deterministic: spreading them
//! over threads changes nothing.

use serde::Serialize;

use super::{
    config::{NightWindowConfig, Scenario},
    engine::{self, RunOutcome},
    policy::ScalingPolicy,
    service::Service,
    slo,
};

/// Hours a night window may start at: from early evening, as traffic falls, to midnight.
pub const STARTS: [u32; 4] = [18, 20, 22, 0];

/// Hours a night window may end at: before, at and after the usual start of the working day.
pub const ENDS: [u32; 3] = [5, 7, 9];

/// The windows swept, in grid order (the order ties are broken in).
pub fn grid() -> Vec<(u32, u32)> {
    STARTS
        .iter()
        .flat_map(|&s| ENDS.iter().map(move |&e| (s, e)))
        .collect()
}

/// The chosen window, for the report.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hindsight {
    pub start_hour: u32,
    pub end_hour: u32,
    pub night_replicas: u32,
    pub day_replicas: u32,
    /// Whether its share of minutes within the SLO meets the bar (when no window does, the one
    /// keeping the most minutes is shown).
    pub meets_bar: bool,
    /// Runs simulated to choose it (stopped ones included).
    pub runs: usize,
}

/// The best night replicas of one window.
pub struct WindowBest {
    pub start_hour: u32,
    pub end_hour: u32,
    pub night_replicas: u32,
    /// Its run (`None`: only static peak's size keeps the bar; that run is static peak's).
    pub outcome: Option<RunOutcome>,
    pub runs: usize,
}

/// The fewest replicas in `fail + 1 ..= pass` that `probe` accepts, given that `fail` is
/// refused and `pass` accepted, and the accepted probe's answer (`None` when it is `pass`,
/// never probed). Assumes more replicas are never refused where fewer are accepted.
pub fn bisect<T>(
    mut fail: u32,
    mut pass: u32,
    mut probe: impl FnMut(u32) -> Option<T>,
) -> (u32, Option<T>) {
    let mut best = None;
    while pass > fail + 1 {
        let mid = fail + (pass - fail) / 2;
        match probe(mid) {
            Some(answer) => {
                pass = mid;
                best = Some(answer);
            }
            None => fail = mid,
        }
    }
    (pass, best)
}

/// Searches one window's night replicas: runs that miss `bar` are stopped, static peak's size
/// (whose run is static peak's) is taken as keeping it.
pub fn search_window(
    sc: &Scenario,
    services: &[Service],
    bar: f64,
    (start_hour, end_hour): (u32, u32),
) -> WindowBest {
    let peak = sc.policies.static_peak.replicas;
    let lowest = sc.autoscaling.min_replicas.max(1);
    let minutes = (sc.run.days * 1440.0).ceil() as u64;
    let most_over = slo::most_minutes_over(bar, minutes);
    let mut runs = 0;
    let (night_replicas, outcome) = bisect(lowest - 1, peak.max(lowest), |night_replicas| {
        runs += 1;
        let mut candidate = sc.clone();
        candidate.policies.night_window = NightWindowConfig {
            start_hour,
            end_hour,
            night_replicas,
            day_replicas: peak,
        };
        let policy = ScalingPolicy::NightWindowHindsight;
        engine::run_within(policy, &candidate, services, most_over)
    });
    WindowBest {
        start_hour,
        end_hour,
        night_replicas,
        outcome,
        runs,
    }
}

/// One window's figures, as [`choose`] weighs them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tried {
    pub share: f64,
    pub useful_gpu_hours: f64,
}

/// The index of the chosen window and whether it meets `bar`: the most useful GPU-hours among
/// the windows that meet it, else the highest share of minutes (then the most useful hours);
/// ties go to the earliest. `None` when nothing was tried.
pub fn choose(tried: &[Tried], bar: f64) -> Option<(usize, bool)> {
    let meeting = tried
        .iter()
        .enumerate()
        .filter(|(_, t)| slo::meets(t.share, bar))
        .fold(None::<(usize, &Tried)>, |best, (i, t)| match best {
            Some((_, b)) if b.useful_gpu_hours >= t.useful_gpu_hours => best,
            _ => Some((i, t)),
        });
    if let Some((i, _)) = meeting {
        return Some((i, true));
    }
    let closest =
        tried
            .iter()
            .enumerate()
            .fold(None::<(usize, &Tried)>, |best, (i, t)| match best {
                Some((_, b)) if (b.share, b.useful_gpu_hours) >= (t.share, t.useful_gpu_hours) => {
                    best
                }
                _ => Some((i, t)),
            });
    closest.map(|(i, _)| (i, false))
}

/// The chosen window and its run, from every window's best (in grid order) and static peak's
/// run (the run of a window that only keeps the bar at static peak's size).
pub fn pick(
    sc: &Scenario,
    bests: Vec<WindowBest>,
    static_peak: &RunOutcome,
    bar: f64,
) -> Option<(Hindsight, RunOutcome)> {
    let runs = bests.iter().map(|b| b.runs).sum();
    let day_replicas = sc.policies.static_peak.replicas;
    let tried: Vec<Tried> = bests
        .iter()
        .map(|b| {
            let r = &b.outcome.as_ref().unwrap_or(static_peak).result;
            Tried {
                share: r.minutes_within_slo_share,
                useful_gpu_hours: r.useful_gpu_hours,
            }
        })
        .collect();
    let (i, meets_bar) = choose(&tried, bar)?;
    let best = bests.into_iter().nth(i)?;
    let mut outcome = match best.outcome {
        Some(o) => o,
        None => RunOutcome {
            result: static_peak.result.clone(),
            timeline: static_peak.timeline.clone(),
            ideal_idle_gpu_hours: static_peak.ideal_idle_gpu_hours,
            pool_gpu_hours: static_peak.pool_gpu_hours,
            decisions: Vec::new(),
        },
    };
    outcome.result.policy = ScalingPolicy::NightWindowHindsight;
    outcome.result.label = ScalingPolicy::NightWindowHindsight.label();
    let chosen = Hindsight {
        start_hour: best.start_hour,
        end_hour: best.end_hour,
        night_replicas: best.night_replicas,
        day_replicas,
        meets_bar,
        runs,
    };
    Some((chosen, outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_is_every_start_with_every_end_in_order() {
        let g = grid();
        assert_eq!(g.len(), STARTS.len() * ENDS.len());
        assert_eq!(g[0], (18, 5));
        assert_eq!(g[1], (18, 7));
        assert_eq!(g[g.len() - 1], (0, 9));
    }

    #[test]
    fn bisection_finds_the_fewest_accepted_and_its_answer() {
        for threshold in 1..=16u32 {
            let mut probed = Vec::new();
            let (n, answer) = bisect(0, 16, |r| {
                probed.push(r);
                (r >= threshold).then_some(r * 10)
            });
            assert_eq!(n, threshold);
            // The top is taken as accepted, never probed.
            assert_eq!(answer, (threshold < 16).then_some(threshold * 10));
            assert!(!probed.contains(&16));
            assert!(probed.len() <= 4, "{threshold}: {probed:?}");
        }
    }

    fn tried(share: f64, useful_gpu_hours: f64) -> Tried {
        Tried {
            share,
            useful_gpu_hours,
        }
    }

    #[test]
    fn the_most_useful_window_meeting_the_bar_wins_earliest_on_ties() {
        let t = [
            tried(0.999, 3000.0),
            tried(0.990, 5000.0), // misses the bar: not chosen for its hours
            tried(0.996, 4000.0),
            tried(0.9995, 4000.0),
        ];
        assert_eq!(choose(&t, 0.995), Some((2, true)));
    }

    #[test]
    fn without_a_window_meeting_the_bar_the_best_slo_one_is_shown() {
        let t = [
            tried(0.97, 5000.0),
            tried(0.98, 3000.0),
            tried(0.98, 3500.0),
        ];
        assert_eq!(choose(&t, 0.995), Some((2, false)));
        assert_eq!(choose(&[], 0.995), None);
    }
}
