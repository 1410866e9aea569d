//! The honest ceiling: the most GPU-hours any scaling policy could leave to research with this
//! fleet, this trace and this SLO.
//!
//! For every minute, the fewest replicas that keep it within the SLO are found by running the
//! fleet model itself ([`super::fleet`], the same replicas the policies run) on that minute's
//! requests: each candidate size serves the minute after a warm-up on the requests of the
//! [`WARM_UP_S`] before it (so a minute does not start with an empty, unusually fast fleet).
//! Replicas take `model.startup_s` to start and hold their GPUs meanwhile, so the fleet held
//! in minute `m` is the largest need among minutes `m ..= m + ⌈startup / 60⌉`: a backward
//! pass that starts every replica just in time for the first minute that needs it, and stops it
//! as soon as no minute within its start-up needs it.
//!
//! This schedule knows the future exactly, resizes every minute and never pays a scale-down
//! delay: no policy that only sees the past can hold fewer GPUs and keep every minute within the
//! SLO. It is not a proof of optimality (a minute judged after a warm-up at its own size may
//! differ by a request or two from the same minute after a different history), which the
//! property test bounds empirically: no policy lends more than it leaves idle.
//!
//! Cost: the search starts at the previous minute's answer, so most minutes take two or three
//! fleet runs of about 1.5 minutes of requests each.

use std::{collections::VecDeque, iter::Peekable};

use super::{
    config::Scenario,
    fleet::{self, Observer, Perf, Queued, Replica},
    trace::{Arrivals, Envelope, Trace},
};

/// Seconds of the preceding traffic each minute is judged after, at the size being tried: a
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
}

/// Computes the honest ceiling of a scenario (same trace, envelope and seed as the policies), on
/// this thread; [`Plan`] splits the same work for a caller that spreads it over threads.
pub fn honest_ceiling(sc: &Scenario, trace: &Trace, envelope: &Envelope) -> Ceiling {
    let plan = Plan::new(sc, trace, envelope);
    let parts = (0..plan.chunks()).map(|i| plan.judge(i)).collect();
    plan.ceiling(parts)
}

/// Replicas held per minute when each must start `startup_s` before the first minute it serves:
/// the sliding maximum of `need` over the minute and the start-up ahead of it.
pub fn hold_for_start_up(need: &[u32], startup_s: f64) -> Vec<u32> {
    let ahead = (startup_s.max(0.0) / 60.0).ceil() as usize;
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

/// Minutes judged per piece of work: the minutes are independent (each judged after its own
/// warm-up), so the run is cut into pieces small enough (a few tenths of a second each at the
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
        let held = hold_for_start_up(&need, sc.model.startup_s);
        let pool_gpus = f64::from(sc.pool.nodes * sc.pool.gpus_per_node);
        let end = sc.run.days * 86_400.0;
        let gpr = f64::from(sc.model.gpus_per_replica);
        let idle_gpu_hours = held
            .iter()
            .enumerate()
            .map(|(m, h)| {
                // The last minute may be partial.
                let minutes = ((end - m as f64 * 60.0) / 60.0).clamp(0.0, 1.0);
                (pool_gpus - f64::from(*h) * gpr).max(0.0) * minutes / 60.0
            })
            .sum();
        Ceiling {
            need,
            held,
            idle_gpu_hours,
        }
    }
}

/// The fewest replicas for each of minutes `m0..m1`, reading `arrivals` from the first request
/// of minute `m0`'s warm-up.
fn needs_of(sc: &Scenario, mut arrivals: Peekable<Arrivals<'_>>, m0: usize, m1: usize) -> Vec<u32> {
    let perf = Perf::new(&sc.model);
    let end = sc.run.days * 86_400.0;
    let lo = sc.autoscaling.min_replicas.max(1);
    let hi = sc.autoscaling.max_replicas.max(lo);
    let slo = sc.slo.queue_wait_p99_s;
    // Requests of the warm-up and of the minute being judged, in arrival order.
    let mut window: VecDeque<Queued> = VecDeque::new();
    let mut need = Vec::with_capacity(m1 - m0);
    let mut guess = lo;
    for m in m0..m1 {
        let t0 = m as f64 * 60.0;
        let t1 = (t0 + 60.0).min(end);
        while window.front().is_some_and(|q| q.arrival < t0 - WARM_UP_S) {
            window.pop_front();
        }
        while let Some(a) = arrivals.next_if(|a| a.at < t1) {
            let q = Queued {
                arrival: a.at,
                context: a.context,
                generated: a.generated,
            };
            // The policies drop what can never fit a replica; so does the ceiling.
            if q.footprint() <= perf.kv_capacity {
                window.push_back(q);
            }
        }
        let judge = Minute {
            requests: &window,
            t0,
            t1,
            slo,
            perf: &perf,
        };
        guess = fewest(&judge, guess.clamp(lo, hi), lo, hi);
        need.push(guess);
    }
    need
}

/// Searches from `start` (the previous minute's answer) for the fewest replicas in `lo..=hi`
/// that pass; `hi` when none does.
fn fewest(minute: &Minute<'_>, start: u32, lo: u32, hi: u32) -> u32 {
    if minute.passes(start) {
        let mut n = start;
        while n > lo && minute.passes(n - 1) {
            n -= 1;
        }
        n
    } else {
        let mut n = start + 1;
        while n < hi && !minute.passes(n) {
            n += 1;
        }
        n.min(hi)
    }
}

/// One minute to judge: its requests (after the warm-up's) and the SLO.
struct Minute<'a> {
    requests: &'a VecDeque<Queued>,
    t0: f64,
    t1: f64,
    slo: f64,
    perf: &'a Perf,
}

/// Counts the requests of the judged minute that waited longer than the SLO.
struct Late {
    from: f64,
    slo: f64,
    count: usize,
}

impl Observer for Late {
    fn started(&mut self, at: f64, wait: f64) {
        if at - wait >= self.from - 1e-9 && wait > self.slo {
            self.count += 1;
        }
    }
    fn first_token(&mut self, _at: f64, _ttft: f64) {}
}

/// How often a judged run checks whether the minute is already lost, in seconds: a failing
/// candidate (every minute tries at least one) usually shows it well before the minute ends.
const CHECK_EVERY_S: f64 = 10.0;

impl Minute<'_> {
    /// Whether `n` replicas, warmed up on the preceding requests, keep the minute within the
    /// SLO: the p99 wait of its requests and the oldest still waiting at its end both within
    /// the target (the policies' own test). The nearest-rank p99 is within the target exactly
    /// when at most `total − ⌈0.99 × total⌉` requests wait longer, so requests are counted, and
    /// the run stops as soon as more have.
    fn passes(&self, n: u32) -> bool {
        let start = self.requests.front().map_or(self.t0, |q| q.arrival);
        let mut replicas: Vec<Replica> = (0..n).map(|_| Replica::new(start)).collect();
        let mut refs: Vec<&mut Replica> = replicas.iter_mut().collect();
        let mut queue = self.requests.clone();
        let total = self
            .requests
            .iter()
            .filter(|q| q.arrival >= self.t0 - 1e-9)
            .count();
        let allowed = total - ((0.99 * total as f64).ceil() as usize).min(total);
        let mut late = Late {
            from: self.t0,
            slo: self.slo,
            count: 0,
        };
        let mut t = self.t0;
        while t < self.t1 {
            t = (t + CHECK_EVERY_S).min(self.t1);
            fleet::run_until(&mut refs, &mut queue, t, self.perf, &mut late);
            // Waiting requests of the minute already over the target will be late.
            let waiting_late = queue
                .iter()
                .take_while(|q| q.arrival < t - self.slo)
                .filter(|q| q.arrival >= self.t0 - 1e-9)
                .count();
            if late.count + waiting_late > allowed {
                return false;
            }
        }
        // The oldest request still waiting at the end (of the minute or the warm-up).
        !queue
            .front()
            .is_some_and(|q| q.arrival < self.t1 && self.t1 - q.arrival > self.slo)
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
        let minute_of = |every: f64| -> VecDeque<Queued> {
            let mut t = -WARM_UP_S;
            let mut out = VecDeque::new();
            while t < 60.0 {
                out.push_back(Queued {
                    arrival: t,
                    context: 1000,
                    generated: 250,
                });
                t += every;
            }
            out
        };
        let mut last = 0;
        for every in [1.0, 0.5, 0.25, 0.12, 0.06] {
            let reqs = minute_of(every);
            let m = Minute {
                requests: &reqs,
                t0: 0.0,
                t1: 60.0,
                slo: 1.0,
                perf: &perf,
            };
            let n = fewest(&m, 1, 1, 16);
            assert!(n >= last, "{every}: {n} < {last}");
            assert!(n == 16 || m.passes(n), "{every}: {n} must pass");
            assert!(
                n == 1 || !m.passes(n - 1),
                "{every}: {n} must be the fewest"
            );
            // The answer does not depend on where the search starts.
            assert_eq!(fewest(&m, 9, 1, 16), n, "{every}");
            last = n;
        }
        assert!(last > 1, "the heaviest load needs more than one replica");
    }
}

#[cfg(test)]
mod property {
    use proptest::prelude::*;

    use crate::sim::{config::Scenario, simulate, trace::Trace};

    fn conversation_trace() -> Trace {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data/traces/azure-llm-2023-conv.csv");
        Trace::read(&path).expect("the shipped trace reads")
    }

    proptest! {
        // Each case simulates every policy for three hours: a few cases cover seeds and
        // envelopes without making the unit tests slow.
        #![proptest_config(ProptestConfig::with_cases(4))]
        #[test]
        fn no_policy_within_the_slo_lends_more_than_the_ceiling_leaves_idle(
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
            let report = simulate(&sc, &trace).expect("valid scenario");
            for p in &report.policies {
                if p.minutes_within_slo_share >= 0.99 {
                    prop_assert!(
                        p.lent_gpu_hours <= report.ceiling_idle_gpu_hours + 1e-6,
                        "{} lent {:.2} GPU-h, ceiling idle {:.2}",
                        p.label, p.lent_gpu_hours, report.ceiling_idle_gpu_hours
                    );
                }
            }
        }
    }
}
