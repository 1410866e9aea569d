//! The honest ceiling: the most GPU-hours a scaling policy could leave to research with this
//! fleet, this trace and this SLO, and a schedule that is checked to keep the SLO.
//!
//! Minute by minute, the fewest replicas that keep the minute within the SLO are found by running
//! the fleet model itself ([`super::fleet`], the replicas the policies run) on the minute's
//! requests, starting from the fleet the previous minute's answer left: its replicas with what
//! they were serving and its queue. A replica added is fresh; a replica removed is the newest,
//! as the Deployment drains it. A minute is judged by [`super::slo::minute_within_slo`], the one
//! judgement every policy is scored by, at [`SEARCH_MARGIN`] of the target: the margin that lets
//! the schedule's replay, whose fleet history differs a little, keep the SLO target too. The run is cut into chunks of [`CHUNK_MINUTES`] for the
//! machine's cores; a chunk's first minute starts from an empty fleet of the size being tried,
//! warmed up on the requests of the [`WARM_UP_S`] before it.
//!
//! A replica asked for takes [`lead_s`] to serve: the scheduler waits out the grace period of the
//! research it preempts, then the pod starts (`model.startup_s`), each seen at the next control
//! step. So the fleet held in minute `m` is the largest need among minutes `m ..= m + ⌈lead /
//! 60⌉`: a backward pass that asks for every replica just in time for the first minute that needs
//! it, and stops it as soon as no minute within its lead needs it.
//!
//! The schedule knows the future, resizes every minute and never pays a scale-down delay. It is
//! then replayed through the same continuous model the policies run ([`super::engine`], a policy
//! that follows the held replicas minute by minute): its replay is reported beside the policies,
//! and the property test checks both sides: no policy keeping the SLO target lends more than the
//! ceiling leaves idle, and the replay itself keeps the target. The greedy minute-by-minute
//! search is not a proof of optimality (the fewest replicas now may leave a queue that costs a
//! replica later), which is why both sides are tested rather than assumed.
//!
//! Cost: the search starts at the previous minute's answer, so most minutes take two or three
//! fleet runs of a minute of requests each.

use std::{collections::VecDeque, iter::Peekable};

use super::{
    config::Scenario,
    fleet::{self, Observer, Perf, Queued, Replica},
    slo,
    trace::{Arrivals, Envelope, Trace},
};

/// The share of the SLO's target the search holds each minute to. The minute found at the edge
/// (its last allowed request a hair under the target) flips with any difference in the fleet's
/// history, and the replay's fleet differs a little (it holds replicas ahead, drains others):
/// at the full target the replay of a 3-hour run missed 2 minutes in 180 where the target
/// allows 1, and at 90 % so did another (the property test's saved case, seed 694). 80 % of
/// the target leaves such a request a fifth of the target to spare.
pub const SEARCH_MARGIN: f64 = 0.8;

/// Seconds of the preceding traffic a chunk's first minute is judged after, at the size being
/// tried (later minutes start from the fleet the previous one left): a
/// decode lasts 5–20 s on the conversation mix (hundreds of tokens at 20–50 ms per engine step),
/// so 20 s brings the batch and the KV cache to their steady state for that load.
pub const WARM_UP_S: f64 = 20.0;

/// The honest ceiling of one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ceiling {
    /// Per minute: the fewest serving replicas that keep it within the SLO.
    pub need: Vec<u32>,
    /// Per minute: replicas holding GPUs (serving or starting for a later minute).
    pub held: Vec<u32>,
    /// GPU-hours the schedule leaves free: the most any policy could lend.
    pub idle_gpu_hours: f64,
    /// Per service (in the services' order), its replicas held per minute: `held` is their sum.
    pub services: Vec<Vec<u32>>,
}

impl Ceiling {
    /// The ceiling of a pool shared by services, from each one's ceiling (each computed on the
    /// service's own scenario; services do not slow one another): the replicas they need and
    /// hold, added minute by minute, and what that leaves of the pool of `sc`.
    pub fn shared(parts: Vec<Ceiling>, sc: &Scenario) -> Ceiling {
        let minutes = parts.iter().map(|p| p.held.len()).max().unwrap_or(0);
        let mut need = vec![0; minutes];
        let mut held = vec![0; minutes];
        for p in &parts {
            for (total, n) in need.iter_mut().zip(&p.need) {
                *total += n;
            }
            for (total, h) in held.iter_mut().zip(&p.held) {
                *total += h;
            }
        }
        Ceiling {
            need,
            idle_gpu_hours: idle_gpu_hours(&held, sc),
            held,
            services: parts.into_iter().flat_map(|p| p.services).collect(),
        }
    }
}

/// GPU-hours of the pool of `sc` that `held` replicas per minute leave free.
fn idle_gpu_hours(held: &[u32], sc: &Scenario) -> f64 {
    let pool_gpus = f64::from(sc.pool.nodes * sc.pool.gpus_per_node);
    let end = sc.run.days * 86_400.0;
    let gpr = f64::from(sc.model.gpus_per_replica);
    held.iter()
        .enumerate()
        .map(|(m, h)| {
            // The last minute may be partial.
            let minutes = ((end - m as f64 * 60.0) / 60.0).clamp(0.0, 1.0);
            (pool_gpus - f64::from(*h) * gpr).max(0.0) * minutes / 60.0
        })
        .sum()
}

/// Computes the honest ceiling of a scenario (same trace, envelope and seed as the policies), on
/// this thread; [`Plan`] splits the same work for a caller that spreads it over threads.
pub fn honest_ceiling(sc: &Scenario, trace: &Trace, envelope: &Envelope) -> Ceiling {
    let plan = Plan::new(sc, trace, envelope);
    let parts = (0..plan.chunks()).map(|i| plan.judge(i)).collect();
    plan.ceiling(parts)
}

/// Seconds from a replica being asked for to it serving: the grace period of the research it
/// preempts, the pod's start-up, and a control step for the scheduler to bind it and one for the
/// pod to be seen ready.
pub fn lead_s(sc: &Scenario) -> f64 {
    sc.research.grace_period_s + sc.model.startup_s + 2.0 * sc.run.step_s
}

/// Replicas held per minute when each must be asked for `lead_s` before the first minute it
/// serves: the sliding maximum of `need` over the minute and the lead ahead of it.
pub fn hold_for_start_up(need: &[u32], lead_s: f64) -> Vec<u32> {
    let ahead = (lead_s.max(0.0) / 60.0).ceil() as usize;
    (0..need.len())
        .map(|m| {
            need[m..need.len().min(m + ahead + 1)]
                .iter()
                .copied()
                .max()
                .unwrap_or(0)
        })
        .collect()
}

/// Minutes judged per piece of work: chunks are independent (each starts after its own warm-up),
/// so the run is cut into pieces small enough (a few tenths of a second each at the
/// default load) that pieces taken in turn by a few threads end together, whatever else the
/// threads ran before.
const CHUNK_MINUTES: usize = 240;

/// The ceiling's work cut into independent chunks of minutes. [`Plan::judge`] may be called for
/// every chunk on any thread and in any order; [`Plan::ceiling`] puts the answers together.
pub struct Plan<'a> {
    sc: &'a Scenario,
    minutes: usize,
    /// Per chunk: its first minute, one past its last, and where its requests (its first
    /// minute's warm-up included) begin in the replay.
    chunks: Vec<(usize, usize, Peekable<Arrivals<'a>>)>,
}

impl<'a> Plan<'a> {
    /// Cuts the run into chunks. One pass over the replay finds where each chunk begins, instead
    /// of every chunk replaying the run up to its own start.
    pub fn new(sc: &'a Scenario, trace: &'a Trace, envelope: &'a Envelope) -> Plan<'a> {
        let minutes = Self::minutes(sc);
        let mut replay = Arrivals::new(trace, envelope, sc.run.seed).peekable();
        let chunks = (0..minutes)
            .step_by(CHUNK_MINUTES)
            .map(|m0| {
                while replay
                    .next_if(|a| a.at < m0 as f64 * 60.0 - WARM_UP_S)
                    .is_some()
                {}
                (m0, (m0 + CHUNK_MINUTES).min(minutes), replay.clone())
            })
            .collect();
        Plan {
            sc,
            minutes,
            chunks,
        }
    }

    /// Chunks a scenario is cut into (what [`Plan::new`] makes, known without the replay).
    pub fn chunks_of(sc: &Scenario) -> usize {
        Self::minutes(sc).div_ceil(CHUNK_MINUTES)
    }

    fn minutes(sc: &Scenario) -> usize {
        (sc.run.days * 86_400.0 / 60.0).ceil() as usize
    }

    /// Chunks to judge.
    pub fn chunks(&self) -> usize {
        self.chunks.len()
    }

    /// The fewest replicas for each minute of chunk `i` (empty when there is no such chunk).
    pub fn judge(&self, i: usize) -> Vec<u32> {
        self.chunks
            .get(i)
            .map_or_else(Vec::new, |(m0, m1, arrivals)| {
                needs_of(self.sc, arrivals.clone(), *m0, *m1)
            })
    }

    /// The ceiling from every chunk's answer, in chunk order.
    pub fn ceiling(&self, parts: Vec<Vec<u32>>) -> Ceiling {
        let sc = self.sc;
        let mut need: Vec<u32> = parts.into_iter().flatten().collect();
        // Only a missing chunk (a caller's bug) leaves minutes out: they count as the full fleet.
        need.resize(self.minutes, sc.autoscaling.max_replicas.max(1));
        let held = hold_for_start_up(&need, lead_s(sc));
        Ceiling {
            need,
            idle_gpu_hours: idle_gpu_hours(&held, sc),
            services: vec![held.clone()],
            held,
        }
    }
}

/// The fewest replicas for each of minutes `m0..m1`, reading `arrivals` from the first request
/// of minute `m0`'s warm-up. Each minute is searched from the fleet the previous minute's answer
/// left.
fn needs_of(sc: &Scenario, mut arrivals: Peekable<Arrivals<'_>>, m0: usize, m1: usize) -> Vec<u32> {
    let perf = Perf::new(&sc.model);
    let end = sc.run.days * 86_400.0;
    let lo = sc.autoscaling.min_replicas.max(1);
    let hi = sc.autoscaling.max_replicas.max(lo);
    let mut fleet = Fleet {
        replicas: Vec::new(),
        queue: VecDeque::new(),
        since: m0 as f64 * 60.0 - WARM_UP_S,
    };
    let mut need = Vec::with_capacity(m1 - m0);
    let mut guess = lo;
    for m in m0..m1 {
        let t0 = m as f64 * 60.0;
        let t1 = (t0 + 60.0).min(end);
        while let Some(a) = arrivals.next_if(|a| a.at < t1) {
            let q = Queued {
                arrival: a.at,
                context: a.context,
                generated: a.generated,
            };
            // The policies drop what can never fit a replica; so does the ceiling.
            if q.footprint() <= perf.kv_capacity {
                fleet.queue.push_back(q);
            }
        }
        let minute = Minute {
            fleet: &fleet,
            t0,
            t1,
            slo: sc.slo.queue_wait_p99_s * SEARCH_MARGIN,
            perf: &perf,
        };
        let (n, after) = fewest(&minute, guess.clamp(lo, hi), lo, hi);
        guess = n;
        need.push(n);
        fleet = after;
    }
    need
}

/// Searches from `start` (the previous minute's answer) for the fewest replicas in `lo..=hi`
/// that keep the minute within the SLO, and the fleet they leave at its end; `hi` (and its
/// fleet) when none does.
fn fewest(minute: &Minute<'_>, start: u32, lo: u32, hi: u32) -> (u32, Fleet) {
    match minute.serve(start) {
        Ok(mut fleet) => {
            let mut n = start;
            while n > lo {
                match minute.serve(n - 1) {
                    Ok(fewer) => (n, fleet) = (n - 1, fewer),
                    Err(_) => break,
                }
            }
            (n, fleet)
        }
        Err(mut fleet) => {
            let mut n = start;
            while n < hi {
                n += 1;
                match minute.serve(n) {
                    Ok(enough) => return (n, enough),
                    Err(short) => fleet = short,
                }
            }
            (n, fleet)
        }
    }
}

/// The serving fleet between minutes: its replicas, oldest first, and the requests not yet
/// started (those of the minute about to be judged included), as of `since`.
#[derive(Clone)]
struct Fleet {
    replicas: Vec<Replica>,
    queue: VecDeque<Queued>,
    since: f64,
}

/// One minute to judge: the fleet the previous minute left, the minute's bounds and the SLO.
struct Minute<'a> {
    fleet: &'a Fleet,
    t0: f64,
    t1: f64,
    slo: f64,
    perf: &'a Perf,
}

/// The queue waits of the requests started from `from` on.
struct Started {
    from: f64,
    slo: f64,
    waits: Vec<f32>,
    late: usize,
}

impl Observer for Started {
    fn started(&mut self, at: f64, wait: f64) {
        if at >= self.from {
            self.waits.push(wait as f32);
            if wait > self.slo {
                self.late += 1;
            }
        }
    }
    fn first_token(&mut self, _at: f64, _ttft: f64) {}
}

/// How often a judged run checks whether the minute is already lost, in seconds: a failing
/// candidate (every minute tries at least one) usually shows it well before the minute ends.
const CHECK_EVERY_S: f64 = 10.0;

impl Minute<'_> {
    /// Serves the minute with `n` replicas: the previous fleet's oldest `n` (the newest leave,
    /// as the Deployment drains them; what they still run waits for no one) and fresh ones for
    /// the rest. `Ok` with the fleet at the minute's end when the minute is within the SLO by
    /// [`slo::minute_within_slo`], the policies' own judgement; `Err` otherwise (the fleet as far
    /// as it was served).
    ///
    /// A run stops early once the minute is surely lost: every request already waiting longer
    /// than the target either starts late within the minute or is still waiting at its end,
    /// and no more than [`slo::late_allowed`] of the most requests that could start in it may be
    /// late.
    fn serve(&self, n: u32) -> Result<Fleet, Fleet> {
        let mut fleet = self.fleet.clone();
        fleet.replicas.truncate(n as usize);
        let since = fleet.since;
        fleet
            .replicas
            .resize_with(n as usize, || Replica::new(since));
        let mut started = Started {
            from: self.t0,
            slo: self.slo,
            waits: Vec::new(),
            late: 0,
        };
        let mut t = since.min(self.t0);
        while t < self.t1 {
            // The warm-up (a chunk's first minute) runs to the minute's start unchecked.
            t = if t < self.t0 {
                self.t0
            } else {
                (t + CHECK_EVERY_S).min(self.t1)
            };
            let mut refs: Vec<&mut Replica> = fleet.replicas.iter_mut().collect();
            fleet::run_until(&mut refs, &mut fleet.queue, t, self.perf, &mut started);
            fleet.since = t;
            if t > self.t0 && self.surely_lost(&fleet.queue, &started, t) {
                return Err(fleet);
            }
        }
        let oldest = fleet
            .queue
            .front()
            .filter(|q| q.arrival < self.t1)
            .map_or(0.0, |q| self.t1 - q.arrival);
        if slo::minute_within_slo(&mut started.waits, oldest, self.slo) {
            Ok(fleet)
        } else {
            Err(fleet)
        }
    }

    /// Whether the minute cannot be within the SLO whatever happens after `t`.
    fn surely_lost(&self, queue: &VecDeque<Queued>, started: &Started, t: f64) -> bool {
        let waiting_late = queue
            .iter()
            .take_while(|q| q.arrival < t - self.slo)
            .count();
        let could_start =
            started.waits.len() + queue.iter().take_while(|q| q.arrival < self.t1).count();
        started.late + waiting_late > slo::late_allowed(could_start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::config::Scenario;

    #[test]
    fn replicas_start_ahead_of_the_minute_they_serve() {
        let need = [1, 1, 1, 1, 5, 5, 2, 1, 1];
        // 180 s: the 5 is held from 3 minutes before it; released right after.
        assert_eq!(
            hold_for_start_up(&need, 180.0),
            vec![1, 5, 5, 5, 5, 5, 2, 1, 1]
        );
        assert_eq!(hold_for_start_up(&need, 0.0), need.to_vec());
        // 61 s rounds up to two minutes ahead.
        assert_eq!(
            hold_for_start_up(&need, 61.0),
            vec![1, 1, 5, 5, 5, 5, 2, 1, 1]
        );
    }

    #[test]
    fn more_load_never_needs_fewer_replicas_and_every_answer_passes() {
        let perf = Perf::new(&Scenario::default().model);
        let fleet_of = |every: f64| -> Fleet {
            let mut t = -WARM_UP_S;
            let mut queue = VecDeque::new();
            while t < 60.0 {
                queue.push_back(Queued {
                    arrival: t,
                    context: 1000,
                    generated: 250,
                });
                t += every;
            }
            Fleet {
                replicas: Vec::new(),
                queue,
                since: -WARM_UP_S,
            }
        };
        let mut last = 0;
        for every in [1.0, 0.5, 0.25, 0.12, 0.06] {
            let fleet = fleet_of(every);
            let m = Minute {
                fleet: &fleet,
                t0: 0.0,
                t1: 60.0,
                slo: 1.0,
                perf: &perf,
            };
            let (n, after) = fewest(&m, 1, 1, 16);
            assert!(n >= last, "{every}: {n} < {last}");
            assert!(n == 16 || m.serve(n).is_ok(), "{every}: {n} must pass");
            assert!(
                n == 1 || m.serve(n - 1).is_err(),
                "{every}: {n} must be the fewest"
            );
            assert_eq!(after.replicas.len(), n as usize);
            assert_eq!(after.since, 60.0);
            // The answer does not depend on where the search starts.
            assert_eq!(fewest(&m, 9, 1, 16).0, n, "{every}");
            last = n;
        }
        assert!(last > 1, "the heaviest load needs more than one replica");
    }

    #[test]
    fn a_minute_is_searched_from_the_fleet_the_previous_one_left() {
        let perf = Perf::new(&Scenario::default().model);
        // A backlog of 600 requests left waiting at the minute's start: a fresh fleet of the
        // size the arrivals alone need would not serve it in time.
        let backlog = |n: usize| Fleet {
            replicas: Vec::new(),
            queue: (0..n)
                .map(|i| Queued {
                    arrival: -0.5 + i as f64 * 1e-4,
                    context: 1000,
                    generated: 250,
                })
                .collect(),
            since: 0.0,
        };
        let judge = |fleet: &Fleet| {
            let m = Minute {
                fleet,
                t0: 0.0,
                t1: 60.0,
                slo: 1.0,
                perf: &perf,
            };
            fewest(&m, 1, 1, 16).0
        };
        assert!(judge(&backlog(600)) > judge(&backlog(10)));
    }
}

#[cfg(test)]
mod property {
    use proptest::prelude::*;

    use crate::sim::{config::Scenario, policy::ScalingPolicy, simulate, trace::Trace};

    fn conversation_trace() -> Trace {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data/traces/azure-llm-2023-conv.csv");
        Trace::read(&path).expect("the shipped trace reads")
    }

    /// The share of minutes a policy must keep to be held to the ceiling, and the share the
    /// ceiling's replay must keep: the SLO target the policies are scored against.
    const TARGET: f64 = 0.99;

    proptest! {
        // Each case simulates every policy and the ceiling's replay for three hours: a few cases
        // cover seeds and envelopes without making the unit tests slow. The cases are drawn
        // from a fixed seed so that every run judges the same ones (after the saved failing
        // cases in proptest-regressions/); to explore others, change the seed and raise the
        // cases.
        #![proptest_config(ProptestConfig {
            cases: 4,
            rng_seed: proptest::test_runner::RngSeed::Fixed(59),
            ..ProptestConfig::default()
        })]
        #[test]
        fn the_ceiling_bounds_every_policy_within_the_slo_and_its_replay_keeps_it(
            seed in 0u64..1_000,
            start_hour in 0usize..24,
            hourly in proptest::collection::vec(0.5f64..4.5, 24),
        ) {
            let trace = conversation_trace();
            let mut sc = Scenario::default();
            sc.run.days = 3.0 / 24.0;
            sc.run.seed = seed;
            // Rotate so that the three hours cover any part of the day's shape.
            sc.envelope.hourly = (0..24).map(|h| hourly[(h + start_hour) % 24]).collect();
            let report = simulate(&sc, &[&trace], Default::default()).expect("valid scenario");
            // (a) No policy keeping the target lends more than the ceiling leaves idle. The
            // replay is the ceiling itself: it lends what the ceiling leaves idle plus the GPUs
            // preempted research holds through its grace periods.
            for p in report.policies.iter().filter(|p| p.policy != ScalingPolicy::CeilingReplay) {
                if p.minutes_within_slo_share >= TARGET {
                    prop_assert!(
                        p.lent_gpu_hours <= report.ceiling_idle_gpu_hours + 1e-6,
                        "{} lent {:.2} GPU-h, ceiling idle {:.2}",
                        p.label, p.lent_gpu_hours, report.ceiling_idle_gpu_hours
                    );
                }
            }
            // (b) The ceiling's schedule, replayed through the same model, keeps the target.
            let replay = report
                .policies
                .iter()
                .find(|p| p.policy == ScalingPolicy::CeilingReplay)
                .expect("the replay is reported");
            prop_assert!(
                replay.minutes_within_slo_share >= TARGET,
                "the replayed ceiling keeps {:.2} % of minutes ({} over)",
                replay.minutes_within_slo_share * 100.0, replay.minutes_over_slo
            );
        }
    }
}
