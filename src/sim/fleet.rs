//! The vLLM replica model: continuous batching with a chunked-prefill token budget, a shared FIFO
//! of waiting requests, queue wait and time to first token per request.
//!
//! Between events the batch is fixed (fluid within a step, exact event times): a replica
//! prefills its started prompts first-come first-served while every running sequence advances
//! one token per engine step, each step taking a little longer as the KV cache grows. All running sequences of a replica advance at the same rate, so
//! one "virtual decode clock" per replica plus a min-heap of finish positions replaces
//! per-sequence bookkeeping: the cost is O(log n) per request, not per token.

use std::{
    cmp::Ordering,
    collections::{BinaryHeap, VecDeque},
};

use super::config::ModelConfig;

/// A request waiting to be scheduled (global FIFO: a late-binding router sends it to the first
/// replica with room).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Queued {
    pub arrival: f64,
    pub context: u32,
    pub generated: u32,
}

impl Queued {
    /// KV tokens the request holds once fully generated.
    pub fn footprint(&self) -> f64 {
        f64::from(self.context.max(1)) + f64::from(self.generated.max(1))
    }
}

/// What the fleet reports about each request.
pub trait Observer {
    /// A request started (left the waiting queue) at `at` after waiting `wait` seconds.
    fn started(&mut self, at: f64, wait: f64);
    /// A request produced its first token at `at`, `ttft` seconds after arriving.
    fn first_token(&mut self, at: f64, ttft: f64);
}

/// Engine-step costs derived from [`ModelConfig`].
#[derive(Clone, Copy, Debug)]
pub struct Perf {
    /// Seconds per token of arithmetic (prefill or decode).
    pub compute_s_per_token: f64,
    pub decode_step_s: f64,
    pub kv_read_s_per_token: f64,
    pub kv_capacity: f64,
    pub max_num_seqs: usize,
    pub token_budget: f64,
}

impl Perf {
    pub fn new(m: &ModelConfig) -> Perf {
        Perf {
            compute_s_per_token: 1.0 / m.prefill_tokens_per_s,
            decode_step_s: m.decode_step_s,
            kv_read_s_per_token: m.kv_read_s_per_token,
            kv_capacity: m.kv_capacity_tokens,
            max_num_seqs: m.max_num_seqs as usize,
            token_budget: f64::from(m.max_num_batched_tokens),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Decoding {
    /// Virtual-clock position at which the sequence has all its tokens.
    finish_v: f64,
    /// Virtual-clock position when it started decoding.
    v0: f64,
    context: f64,
    footprint: f64,
}

impl PartialEq for Decoding {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Decoding {}
impl PartialOrd for Decoding {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Decoding {
    // Reversed: BinaryHeap is a max-heap, the earliest finish must come first. `finish_v` is
    // at least 1 (a sequence decodes a token or more), and the bits of positive floats are in
    // their order: one integer comparison, where `total_cmp` first folds the sign into each.
    fn cmp(&self, other: &Self) -> Ordering {
        other.finish_v.to_bits().cmp(&self.finish_v.to_bits())
    }
}

#[derive(Clone, Copy, Debug)]
struct Prefilling {
    arrival: f64,
    remaining: f64,
    context: f64,
    generated: u32,
    footprint: f64,
}

/// Events closer than this (seconds, tokens) are the same event: keeps float noise from
/// producing zero-length segments.
const EPS: f64 = 1e-9;

/// The larger of two numbers that are never NaN here: one instruction, where `f64::max` adds a
/// NaN test and a blend. The replicas' hot path takes a dozen of these per event; with
/// `f64::max` and `f64::min` they were a quarter of its time.
#[inline]
fn max(a: f64, b: f64) -> f64 {
    if a > b { a } else { b }
}

/// The smaller of two numbers that are never NaN here (see [`max`]).
#[inline]
fn min(a: f64, b: f64) -> f64 {
    if a < b { a } else { b }
}

/// How fast a replica's engine goes while its batch stays as it is. Every engine step takes
/// the longer of reading the weights and the KV cache (`memory`, growing by `growth` per step as
/// each decoding sequence adds a token of KV) and the batch's arithmetic (`compute`), and
/// prefills `prefill` prompt tokens. The step time is integrated exactly over the KV growth, so
/// where a replica happens to be observed does not change its course.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Pace {
    memory: f64,
    growth: f64,
    compute: f64,
    prefill: f64,
    /// Steps after which reading memory becomes the longer part (0: it already is), kept
    /// because every event asks for it.
    knee: f64,
    /// The step time from the knee on, before the KV growth: the longer of the two parts.
    start: f64,
}

impl Pace {
    fn new(memory: f64, growth: f64, compute: f64, prefill: f64) -> Pace {
        let knee = if memory >= compute {
            0.0
        } else if growth > 0.0 {
            (compute - memory) / growth
        } else {
            f64::INFINITY
        };
        Pace {
            memory,
            growth,
            compute,
            prefill,
            knee,
            start: max(memory, compute),
        }
    }

    /// Seconds the next `steps` engine steps take.
    fn time_for(&self, steps: f64) -> f64 {
        let knee = self.knee;
        if steps <= knee {
            return steps * self.compute;
        }
        // From the knee on, each step takes `start` plus what the KV added since.
        let start = self.start;
        let w = steps - knee;
        knee * self.compute + w * start + 0.5 * self.growth * w * w
    }

    /// Engine steps done in `dt` seconds (the inverse of [`Pace::time_for`]).
    fn steps_in(&self, dt: f64) -> f64 {
        if dt <= 0.0 {
            return 0.0;
        }
        let knee = self.knee;
        let knee_time = knee * self.compute;
        if dt <= knee_time {
            return dt / self.compute;
        }
        let rest = dt - knee_time;
        let start = self.start;
        // Root of start·w + growth·w²/2 = rest, in the form that stays exact as growth → 0.
        let w = 2.0 * rest / (start + (start * start + 2.0 * self.growth * rest).sqrt());
        knee + w
    }
}

/// The batch's pace since it last changed and where that began. A replica's course between
/// events is computed from this origin, so observing it in between changes nothing.
#[derive(Clone, Copy, Debug)]
struct Segment {
    start: f64,
    pace: Pace,
    /// Engine steps done since `start`.
    done: f64,
}

/// The serving state of one vLLM replica.
#[derive(Clone, Debug, Default)]
pub struct Replica {
    /// Simulated time this replica has been advanced to.
    pub now: f64,
    /// Takes new requests (false while draining).
    pub accepting: bool,
    v: f64,
    decoding: BinaryHeap<Decoding>,
    prefilling: VecDeque<Prefilling>,
    prefill_remaining: f64,
    /// Σ context of started requests (their prompt's KV).
    kv_context: f64,
    /// Σ v0 of decoding sequences: generated tokens held = n·v − Σv0.
    sum_v0: f64,
    /// Σ footprint of started requests, for admission.
    reserved: f64,
    /// Output tokens produced so far (vLLM's `generation_tokens_total`).
    pub generated_total: f64,
    /// Prompt tokens prefilled so far (vLLM's `prompt_tokens_total`).
    pub prompt_total: f64,
    /// Since the batch last changed (none: it just did).
    segment: Option<Segment>,
    /// Its next own event and [`Replica::open_at`] as last computed; both hold until the batch
    /// changes.
    watched: Option<(f64, f64)>,
}

impl Replica {
    /// An empty replica ready to serve from `now`.
    pub fn new(now: f64) -> Replica {
        Replica {
            now,
            accepting: true,
            ..Replica::default()
        }
    }

    /// Sequences being served: prefilling or decoding (vLLM's `num_requests_running`).
    pub fn running(&self) -> usize {
        self.decoding.len() + self.prefilling.len()
    }

    /// KV tokens held now.
    pub fn kv_tokens(&self) -> f64 {
        max(
            self.kv_context + self.decoding.len() as f64 * self.v - self.sum_v0,
            0.0,
        )
    }

    /// KV-cache use as vLLM reports it (`vllm:kv_cache_usage_perc`, 0–1).
    pub fn kv_usage(&self, perf: &Perf) -> f64 {
        min(self.kv_tokens() / perf.kv_capacity, 1.0)
    }

    /// Whether nothing is in flight.
    pub fn is_idle(&self) -> bool {
        self.decoding.is_empty() && self.prefilling.is_empty()
    }

    /// Whether `q` could start now: a free sequence slot, room in this step's token budget after
    /// the running prefills and decodes, and KV room for the whole request.
    fn has_room_for(&self, q: &Queued, perf: &Perf) -> bool {
        self.accepting
            && self.running() < perf.max_num_seqs
            && self.prefill_remaining + (self.decoding.len() as f64) < perf.token_budget
            && self.reserved + q.footprint() <= perf.kv_capacity
    }

    /// Starts waiting requests that have arrived, while there is room.
    fn admit(&mut self, queue: &mut VecDeque<Queued>, perf: &Perf, obs: &mut impl Observer) {
        while let Some(head) = queue.front() {
            if head.arrival > self.now + EPS || !self.has_room_for(head, perf) {
                break;
            }
            let q = *head;
            queue.pop_front();
            obs.started(self.now, max(self.now - q.arrival, 0.0));
            let context = f64::from(q.context.max(1));
            self.prefilling.push_back(Prefilling {
                arrival: q.arrival,
                remaining: context,
                context,
                generated: q.generated.max(1),
                footprint: q.footprint(),
            });
            self.prefill_remaining += context;
            self.kv_context += context;
            self.reserved += q.footprint();
            self.batch_changed();
        }
    }

    /// The engine's pace while the batch stays as it is.
    fn pace(&self, perf: &Perf) -> Pace {
        let n = self.decoding.len() as f64;
        let prefill = max(min(self.prefill_remaining, perf.token_budget - n), 0.0);
        Pace::new(
            perf.decode_step_s + perf.kv_read_s_per_token * self.kv_tokens(),
            perf.kv_read_s_per_token * n,
            (n + prefill) * perf.compute_s_per_token,
            prefill,
        )
    }

    /// Requests started or finished: the pace and the next events must be computed anew.
    fn batch_changed(&mut self) {
        self.segment = None;
        self.watched = None;
    }

    /// What the dispatcher needs to know of this replica.
    fn watch(&mut self, perf: &Perf) -> Watch {
        let (own, open) = match self.watched {
            Some(w) => w,
            None => {
                // The segment is computed once here and kept: advancing would compute the same.
                let seg = self.segment(perf);
                if !self.is_idle() {
                    self.segment = Some(seg);
                }
                let w = (self.next_internal(&seg), self.open_at(&seg, perf));
                self.watched = Some(w);
                w
            }
        };
        Watch {
            own: max(own, self.now),
            // A replica stops accepting when it starts draining, never the other way round.
            open: if self.accepting {
                max(open, self.now)
            } else {
                f64::INFINITY
            },
            reserved: self.reserved,
        }
    }

    /// The current segment (a new one from now if the batch just changed).
    fn segment(&self, perf: &Perf) -> Segment {
        self.segment.unwrap_or_else(|| Segment {
            start: self.now,
            pace: self.pace(perf),
            done: 0.0,
        })
    }

    /// When this replica's own next event happens (a prefill or a decode finishing), as long as
    /// it admits nothing before; infinite when nothing is in flight.
    fn next_internal(&self, seg: &Segment) -> f64 {
        if self.is_idle() {
            return f64::INFINITY;
        }
        let mut steps = f64::INFINITY;
        if let Some(p) = self.prefilling.front()
            && seg.pace.prefill > 0.0
        {
            steps = min(steps, p.remaining / seg.pace.prefill);
        }
        if let Some(d) = self.decoding.peek() {
            // A finishing sequence frees a slot and its KV, and stops generating.
            steps = min(steps, max(d.finish_v - self.v, 0.0));
        }
        max(seg.start + seg.pace.time_for(seg.done + steps), self.now)
    }

    /// The earliest time, from now and until this replica's next own event, at which it has a
    /// free slot and room in the token budget; infinite if not before that event. Slots free up
    /// only at events; the budget frees up continuously as the running prefills progress.
    /// (KV room, which depends on the request, is checked apart.)
    fn open_at(&self, seg: &Segment, perf: &Perf) -> f64 {
        if !self.accepting || self.running() >= perf.max_num_seqs {
            return f64::INFINITY;
        }
        let over_budget = self.prefill_remaining + self.decoding.len() as f64 - perf.token_budget;
        if over_budget < 0.0 {
            return self.now;
        }
        if seg.pace.prefill > 0.0 {
            // Just past the moment the budget has room (a strict inequality).
            let steps = seg.done + over_budget / seg.pace.prefill;
            max(seg.start + seg.pace.time_for(steps), self.now) + 1e-7
        } else {
            f64::INFINITY
        }
    }

    /// Advances to `until`, which must not be past the next event, at the current batch's pace.
    fn advance(&mut self, until: f64, perf: &Perf, obs: &mut impl Observer) {
        let dt = until - self.now;
        if dt > 0.0 && !self.is_idle() {
            let mut seg = self.segment(perf);
            let total = max(seg.pace.steps_in(until - seg.start), seg.done);
            let steps = total - seg.done;
            seg.done = total;
            self.segment = Some(seg);
            let n = self.decoding.len() as f64;
            self.v += steps;
            self.generated_total += n * steps;
            let mut tokens = seg.pace.prefill * steps;
            self.prompt_total += min(tokens, self.prefill_remaining);
            self.prefill_remaining = max(self.prefill_remaining - tokens, 0.0);
            while let Some(p) = self.prefilling.front_mut() {
                if p.remaining > tokens + EPS {
                    p.remaining -= tokens;
                    break;
                }
                tokens -= p.remaining;
                let p = *p;
                self.prefilling.pop_front();
                self.batch_changed();
                // The prefill step emits the first token.
                self.generated_total += 1.0;
                obs.first_token(until, until - p.arrival);
                if p.generated <= 1 {
                    self.kv_context -= p.context;
                    self.reserved -= p.footprint;
                } else {
                    self.decoding.push(Decoding {
                        finish_v: self.v + f64::from(p.generated - 1),
                        v0: self.v,
                        context: p.context,
                        footprint: p.footprint,
                    });
                    self.sum_v0 += self.v;
                }
            }
            if self.prefilling.is_empty() {
                self.prefill_remaining = 0.0;
            }
            while let Some(d) = self.decoding.peek() {
                if d.finish_v > self.v + EPS {
                    break;
                }
                let d = *d;
                self.decoding.pop();
                self.batch_changed();
                self.kv_context -= d.context;
                self.sum_v0 -= d.v0;
                self.reserved -= d.footprint;
            }
            if self.decoding.is_empty() {
                // Resetting keeps the virtual clock's sums free of accumulated rounding.
                self.sum_v0 = 0.0;
                self.v = 0.0;
                if self.prefilling.is_empty() {
                    self.kv_context = 0.0;
                    self.reserved = 0.0;
                }
            }
        }
        self.now = until;
    }
}

/// What the dispatcher keeps of a replica between its moves.
#[derive(Clone, Copy, Debug)]
struct Watch {
    /// Its next own event.
    own: f64,
    /// From when it has a slot and budget room ([`Replica::open_at`]).
    open: f64,
    /// KV tokens it has reserved.
    reserved: f64,
}

/// Advances every serving replica to `end`, event by event in time order: the next replica's
/// own event (a prefill or decode finishing) or the queue's head starting on the replica that has
/// room for it first (the lowest-numbered one on a tie). Only the replica an event concerns
/// moves, so the cost is per request, not per request and replica.
pub fn run_until(
    replicas: &mut [&mut Replica],
    queue: &mut VecDeque<Queued>,
    end: f64,
    perf: &Perf,
    obs: &mut impl Observer,
) {
    // What decides the next event, per replica; it changes only when that replica moves. One
    // array per field: the scans below read one field of every replica per event.
    let n = replicas.len();
    let (mut owns, mut opens, mut reserved) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    for (i, r) in replicas.iter_mut().enumerate() {
        let w = r.watch(perf);
        (owns[i], opens[i], reserved[i]) = (w.own, w.open, w.reserved);
    }
    // Time of the latest event: a request becomes the head no earlier (strict FIFO).
    let mut clock = f64::NEG_INFINITY;
    loop {
        let mut own_at = end;
        let mut own_pick = None;
        for (i, &own) in owns.iter().enumerate() {
            if own < own_at {
                own_at = own;
                own_pick = Some(i);
            }
        }
        // Own events at the same time go first: they may free what the head needs.
        let mut head_at = own_at;
        let mut head_pick = None;
        if let Some(h) = queue.front().filter(|h| h.arrival < own_at) {
            let earliest = max(h.arrival, clock);
            // The same test as admission's, so that a pick always admits.
            let footprint = h.footprint();
            for (i, (&open, &held)) in opens.iter().zip(&reserved).enumerate() {
                if held + footprint > perf.kv_capacity {
                    continue;
                }
                let at = max(open, earliest);
                if at < head_at {
                    head_at = at;
                    head_pick = Some(i);
                    if at <= earliest {
                        // Nobody can take it sooner; lower numbers win ties.
                        break;
                    }
                }
            }
        }
        let (i, mut at) = match (head_pick, own_pick) {
            (Some(i), _) => (i, head_at),
            (None, Some(i)) => (i, own_at),
            (None, None) => break,
        };
        let r = &mut *replicas[i];
        if head_pick.is_none() && at <= r.now + EPS {
            // A zero-length event (float noise): move on by a hair to guarantee progress.
            at = min(r.now + 1e-6, end);
        }
        r.advance(at, perf, obs);
        r.admit(queue, perf, obs);
        // Even when nothing started or finished (float noise), it has moved: look again.
        r.watched = None;
        let w = r.watch(perf);
        (owns[i], opens[i], reserved[i]) = (w.own, w.open, w.reserved);
        clock = max(clock, at);
    }
    for r in replicas.iter_mut() {
        r.advance(end, perf, obs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Log {
        waits: Vec<(f64, f64)>,
        ttfts: Vec<(f64, f64)>,
    }

    impl Observer for Log {
        fn started(&mut self, at: f64, wait: f64) {
            self.waits.push((at, wait));
        }
        fn first_token(&mut self, at: f64, ttft: f64) {
            self.ttfts.push((at, ttft));
        }
    }

    /// Round numbers: 1000 tokens/s of arithmetic, 20 ms per decode step, no KV read cost.
    fn perf() -> Perf {
        Perf {
            compute_s_per_token: 0.001,
            decode_step_s: 0.02,
            kv_read_s_per_token: 0.0,
            kv_capacity: 1e9,
            max_num_seqs: 256,
            token_budget: 2048.0,
        }
    }

    fn constant_arrivals(every: f64, count: usize, context: u32, generated: u32) -> Vec<Queued> {
        (0..count)
            .map(|i| Queued {
                arrival: i as f64 * every,
                context,
                generated,
            })
            .collect()
    }

    fn simulate(perf: &Perf, arrivals: Vec<Queued>, replicas: usize, end: f64) -> Log {
        let mut queue: VecDeque<Queued> = arrivals.into();
        let mut fleet: Vec<Replica> = (0..replicas).map(|_| Replica::new(0.0)).collect();
        let mut log = Log::default();
        let mut refs: Vec<&mut Replica> = fleet.iter_mut().collect();
        // 1 s control steps, as the engine runs them.
        let mut t = 0.0;
        while t < end {
            t += 1.0;
            run_until(&mut refs, &mut queue, t, perf, &mut log);
        }
        log
    }

    #[test]
    fn underloaded_replica_never_queues_and_ttft_is_the_prefill_time() {
        // 500-token prompts every 2 s; prefill takes 500 × 1 ms = 0.5 s.
        let log = simulate(&perf(), constant_arrivals(2.0, 10, 500, 1), 1, 30.0);
        assert_eq!(log.waits.len(), 10);
        assert!(log.waits.iter().all(|(_, w)| *w == 0.0), "{:?}", log.waits);
        for (i, (at, ttft)) in log.ttfts.iter().enumerate() {
            assert!((ttft - 0.5).abs() < 1e-6, "request {i}: ttft {ttft}");
            assert!((at - (i as f64 * 2.0 + 0.5)).abs() < 1e-6);
        }
    }

    #[test]
    fn overloaded_replica_queues_linearly() {
        // 1000-token prompts every 0.5 s (2000 tokens/s) on a replica that prefills 1000
        // tokens/s: always busy, first-come first-served, so request k has its first token at
        // k + 1 s (TTFT = 1 + 0.5 k). It leaves the queue once the prompts ahead of it fit in the
        // 2048-token budget, i.e. when less than 2048 of their 1000 k tokens remain: at
        // k - 2.048 s, so queue wait = max(0, 0.5 k - 2.048).
        let log = simulate(&perf(), constant_arrivals(0.5, 40, 1000, 1), 1, 60.0);
        for k in 0..25 {
            let (_, wait) = log.waits[k];
            let expect = (0.5 * k as f64 - 2.048).max(0.0);
            assert!(
                (wait - expect).abs() < 1e-6,
                "request {k} waited {wait}, not {expect}"
            );
            let (at, ttft) = log.ttfts[k];
            assert!(
                (at - (k as f64 + 1.0)).abs() < 1e-6,
                "request {k}: first token at {at}"
            );
            assert!(
                (ttft - (1.0 + 0.5 * k as f64)).abs() < 1e-6,
                "request {k}: {ttft}"
            );
        }
    }

    #[test]
    fn a_second_replica_absorbs_what_one_cannot() {
        // 1000-token prompts every 0.6 s: 1667 tokens/s, above one replica's 1000.
        let one = simulate(&perf(), constant_arrivals(0.6, 40, 1000, 1), 1, 60.0);
        assert!(one.waits.iter().any(|(_, w)| *w > 1.0));
        let two = simulate(&perf(), constant_arrivals(0.6, 40, 1000, 1), 2, 60.0);
        assert!(two.waits.iter().all(|(_, w)| *w < 1e-6), "{:?}", two.waits);
    }

    #[test]
    fn decode_runs_at_one_token_per_engine_step() {
        // One request, 100-token prompt (0.1 s), 51 tokens: 1 from prefill + 50 decode steps
        // of max(20 ms, 1 × 1 ms) = 1 s. It holds its slot until 1.1 s.
        let p = perf();
        let mut queue: VecDeque<Queued> = constant_arrivals(1.0, 1, 100, 51).into();
        let mut r = Replica::new(0.0);
        let mut log = Log::default();
        run_until(&mut [&mut r], &mut queue, 1.05, &p, &mut log);
        assert_eq!(r.running(), 1);
        assert!(
            (r.generated_total - (1.0 + 47.5)).abs() < 1e-6,
            "{}",
            r.generated_total
        );
        run_until(&mut [&mut r], &mut queue, 1.2, &p, &mut log);
        assert_eq!(r.running(), 0);
        assert!((r.generated_total - 51.0).abs() < 1e-6);
        assert_eq!(r.kv_tokens(), 0.0);
    }

    #[test]
    fn slot_limit_makes_requests_wait_for_a_decode_to_finish() {
        // One slot; each request decodes 49 tokens after a 0.1 s prefill: it holds the slot
        // 0.1 + 49 × 0.02 = 1.08 s. The second arrival (t = 0.5) waits until 1.08.
        let mut p = perf();
        p.max_num_seqs = 1;
        let log = simulate(&p, constant_arrivals(0.5, 2, 100, 50), 1, 5.0);
        assert_eq!(log.waits.len(), 2);
        assert!((log.waits[1].0 - 1.08).abs() < 1e-6, "{:?}", log.waits);
        assert!((log.waits[1].1 - 0.58).abs() < 1e-6, "{:?}", log.waits);
    }

    #[test]
    fn kv_capacity_limits_admission() {
        let mut p = perf();
        p.kv_capacity = 250.0; // room for one 150-token request at a time
        let log = simulate(&p, constant_arrivals(0.0, 2, 100, 50), 1, 5.0);
        assert_eq!(log.waits[0].1, 0.0);
        assert!((log.waits[1].1 - 1.08).abs() < 1e-6, "{:?}", log.waits);
    }

    #[test]
    fn pace_integrates_the_step_time_as_the_kv_cache_grows() {
        // Memory-bound from the start: 30 ms per step plus 0.1 ms per step of KV growth.
        let pace = Pace::new(0.03, 1e-4, 0.001, 0.0);
        // 50 steps: 50 × 30 ms + 1e-4 × 50² / 2 = 1.625 s.
        assert!((pace.time_for(50.0) - 1.625).abs() < 1e-12);
        assert!((pace.steps_in(1.625) - 50.0).abs() < 1e-9);
        // Compute-bound until the KV makes memory the longer part: 100 ms per step until
        // 0.03 + 1e-4 u = 0.1, i.e. for 700 steps (70 s), then growing.
        let pace = Pace::new(0.03, 1e-4, 0.1, 2000.0);
        assert!((pace.time_for(10.0) - 1.0).abs() < 1e-12);
        assert!((pace.time_for(710.0) - (70.0 + 10.0 * 0.1 + 0.5 * 1e-4 * 100.0)).abs() < 1e-9);
        // Without growth it is the constant step of the old fluid model, both ways.
        let flat = Pace::new(0.02, 0.0, 0.05, 100.0);
        assert_eq!(flat.time_for(4.0), 0.2);
        assert_eq!(flat.steps_in(0.2), 4.0);
        assert_eq!(flat.steps_in(0.0), 0.0);
        for pace in [pace, flat] {
            for dt in [1e-6, 0.01, 0.5, 3.0, 69.99, 70.0, 70.01, 500.0] {
                let back = pace.time_for(pace.steps_in(dt));
                assert!(
                    (back - dt).abs() < 1e-9 * dt.max(1.0),
                    "{pace:?} {dt} {back}"
                );
            }
        }
    }

    #[test]
    fn decode_slows_down_as_the_kv_cache_grows() {
        // 100-token prompt (0.1 s, compute-bound), then 50 decode steps of 0.02 s + 1e-4 s per
        // KV token held (100 at first, one more per step): 50 × 0.03 + 1e-4 × 50² / 2 = 1.625 s.
        let mut p = perf();
        p.kv_read_s_per_token = 1e-4;
        let mut queue: VecDeque<Queued> = constant_arrivals(1.0, 1, 100, 51).into();
        let mut r = Replica::new(0.0);
        let mut log = Log::default();
        run_until(&mut [&mut r], &mut queue, 1.72, &p, &mut log);
        assert_eq!(r.running(), 1);
        run_until(&mut [&mut r], &mut queue, 1.73, &p, &mut log);
        assert_eq!(r.running(), 0);
        assert!((r.generated_total - 51.0).abs() < 1e-6);
    }

    #[test]
    fn how_often_a_replica_is_observed_does_not_change_its_course() {
        let mut p = perf();
        p.kv_read_s_per_token = 1e-5;
        let arrivals = constant_arrivals(0.05, 200, 300, 80);
        let mut coarse = Replica::new(0.0);
        let mut fine = Replica::new(0.0);
        let (mut a, mut b) = (Log::default(), Log::default());
        let mut qa: VecDeque<Queued> = arrivals.clone().into();
        let mut qb: VecDeque<Queued> = arrivals.into();
        for k in 1..=12 {
            run_until(&mut [&mut coarse], &mut qa, f64::from(k), &p, &mut a);
            for j in 1..=100 {
                let t = f64::from(k - 1) + f64::from(j) / 100.0;
                run_until(&mut [&mut fine], &mut qb, t, &p, &mut b);
            }
            assert!(
                (coarse.generated_total - fine.generated_total).abs() < 1e-6,
                "at {k} s: {} vs {}",
                coarse.generated_total,
                fine.generated_total
            );
            assert_eq!(coarse.running(), fine.running());
        }
        assert_eq!(a.waits.len(), b.waits.len());
        for ((ta, wa), (tb, wb)) in a.waits.iter().zip(&b.waits) {
            assert!((ta - tb).abs() < 1e-6 && (wa - wb).abs() < 1e-6);
        }
    }

    #[test]
    fn the_head_goes_to_the_lowest_numbered_replica_with_room() {
        let p = perf();
        let mut queue: VecDeque<Queued> = constant_arrivals(0.1, 3, 100, 10).into();
        let mut fleet: Vec<Replica> = (0..3).map(|_| Replica::new(0.0)).collect();
        fleet[0].accepting = false; // draining
        let mut log = Log::default();
        let mut refs: Vec<&mut Replica> = fleet.iter_mut().collect();
        run_until(&mut refs, &mut queue, 0.25, &p, &mut log);
        // Replica 1 has room for all three (256 slots, 2048-token budget); 2 stays idle.
        assert_eq!(fleet[0].running(), 0);
        assert_eq!(fleet[1].running(), 3);
        assert_eq!(fleet[2].running(), 0);
        assert!(log.waits.iter().all(|(_, w)| *w == 0.0), "{:?}", log.waits);
        assert!(fleet.iter().all(|r| r.now == 0.25));
    }
}
