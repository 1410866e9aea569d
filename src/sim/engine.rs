//! The simulation loop: arrivals → fleet → metrics → policy → HPA → pods → GPU pool → research,
//! once per control step, for one policy. Every policy sees the same arrivals, fleet model, pool
//! and research backlog; only the replica decisions differ.
//!
//! [`run_policy`] drives a `PolicyRun`, the run's state, whose `step` calls the phases in that
//! order, one method each.

use std::{collections::VecDeque, iter::Peekable};

use serde::Serialize;

use super::{
    ceiling::Ceiling,
    config::{MetricSource, NightWindowConfig, Scenario},
    fleet::{self, Observer, Perf, Queued, Replica},
    policy::{self, Hpa, ScalingPolicy},
    pool::{Placement, Pool, ResearchStats},
    service::Service,
    slo,
    trace::Arrivals,
};
use crate::core::capacity::{CapacityConfig, LearnedCapacity};
use crate::core::demand::{self, Decision, PerSignal, Targets, Totals};
use crate::core::forecast::{DailyShape, ForecastConfig, with_forecast};
use crate::core::notice::{NOTICE_INTERVAL, NoticePolicy, Watch};
use crate::core::slo_loop::{self, SloLoop, TailReading};

/// Queue waits and TTFTs are kept in 1 ms buckets up to this many seconds (beyond: one bucket).
const HIST_SPAN_S: f64 = 600.0;

/// A latency histogram with 1 ms resolution; exact zeros counted apart (most waits are zero).
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    zero: u64,
    buckets: Vec<u64>,
    over: u64,
    count: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            zero: 0,
            buckets: vec![0; (HIST_SPAN_S * 1000.0) as usize],
            over: 0,
            count: 0,
        }
    }
}

impl LatencyHistogram {
    pub fn record(&mut self, seconds: f64) {
        self.count += 1;
        if seconds <= 0.0 {
            self.zero += 1;
            return;
        }
        let i = (seconds * 1000.0) as usize;
        match self.buckets.get_mut(i) {
            Some(b) => *b += 1,
            None => self.over += 1,
        }
    }

    /// Adds `other`'s requests to this histogram.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        self.zero += other.zero;
        self.over += other.over;
        self.count += other.count;
        for (b, o) in self.buckets.iter_mut().zip(&other.buckets) {
            *b += o;
        }
    }

    /// The `q` quantile in seconds (upper edge of its bucket; 0 for zeros).
    pub fn quantile(&self, q: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).max(1);
        let mut seen = self.zero;
        if seen >= rank {
            return 0.0;
        }
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b;
            if seen >= rank {
                return (i + 1) as f64 / 1000.0;
            }
        }
        HIST_SPAN_S
    }
}

/// Upper bounds (s) of the buckets of vLLM's `vllm:request_queue_time_seconds` histogram (its
/// request-latency buckets, vLLM v1 `loggers.py`); the `+Inf` bucket follows.
pub const VLLM_QUEUE_TIME_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Buckets of the exported queue-time histogram, `+Inf` included.
const QUEUE_BUCKETS: usize = VLLM_QUEUE_TIME_BUCKETS.len() + 1;

/// Collects per-request figures and per-minute SLO compliance.
struct Recorder {
    /// What vLLM exports of the queue waits: observations per bucket since the start (summed
    /// over the service's pods).
    queue_buckets: [f64; QUEUE_BUCKETS],
    waits: LatencyHistogram,
    ttfts: LatencyHistogram,
    minute_waits: Vec<f32>,
    slo: f64,
    minutes: u64,
    minutes_over: u64,
}

impl Observer for Recorder {
    fn started(&mut self, _at: f64, wait: f64) {
        let bucket = VLLM_QUEUE_TIME_BUCKETS
            .iter()
            .position(|b| wait <= *b)
            .unwrap_or(VLLM_QUEUE_TIME_BUCKETS.len());
        self.queue_buckets[bucket] += 1.0;
        self.waits.record(wait);
        self.minute_waits.push(wait as f32);
    }
    fn first_token(&mut self, _at: f64, ttft: f64) {
        self.ttfts.record(ttft);
    }
}

impl Recorder {
    /// An empty recorder judging minutes against a p99 queue-wait target of `slo` seconds.
    fn new(slo: f64) -> Recorder {
        Recorder {
            queue_buckets: [0.0; QUEUE_BUCKETS],
            waits: LatencyHistogram::default(),
            ttfts: LatencyHistogram::default(),
            minute_waits: Vec::new(),
            slo,
            minutes: 0,
            minutes_over: 0,
        }
    }

    /// Closes a minute, judged by the SLO's one definition ([`slo::minute_within_slo`]): the
    /// p99 wait of the requests started in it, and the oldest request still waiting.
    fn close_minute(&mut self, oldest_waiting: f64) -> bool {
        self.minutes += 1;
        let ok = slo::minute_within_slo(&mut self.minute_waits, oldest_waiting, self.slo);
        self.minute_waits.clear();
        if !ok {
            self.minutes_over += 1;
        }
        ok
    }
}

/// Fleet-level metric values at the end of one control step, as summed over pods.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    t: f64,
    pods: usize,
    waiting: f64,
    running: f64,
    kv_cache: f64,
    generated_total: f64,
    prompt_total: f64,
    /// The queue-time histogram's observations per bucket since the start.
    queue_buckets: [f64; QUEUE_BUCKETS],
}

/// Where an inference pod is in its life.
#[derive(Clone, Copy, Debug, PartialEq)]
enum PodPhase {
    Pending { nominated: Option<usize> },
    Starting { node: usize, ready_at: f64 },
    Ready { node: usize },
    Draining { node: usize },
}

/// An inference pod of the Deployment and the vLLM replica it runs.
struct ReplicaPod {
    phase: PodPhase,
    replica: Replica,
}

impl ReplicaPod {
    /// Serving pods take part in the fleet and report metrics; draining ones still serve.
    fn is_serving(&self) -> bool {
        matches!(
            self.phase,
            PodPhase::Ready { .. } | PodPhase::Draining { .. }
        )
    }
}

/// One minute of the run, for the chart.
#[derive(Clone, Copy, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MinutePoint {
    /// GPUs held by inference pods (starting, serving or draining), averaged over the minute.
    pub inference_gpus: f32,
    /// GPUs held by research pods (running or in their grace period).
    pub research_gpus: f32,
    /// GPUs an oracle would give inference this minute.
    pub ideal_inference_gpus: f32,
    /// GPUs the honest ceiling's schedule holds for inference this minute
    /// ([`super::ceiling`]).
    pub ceiling_inference_gpus: f32,
    pub slo_ok: bool,
}

/// Summary figures of one policy's run.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    pub policy: ScalingPolicy,
    pub label: &'static str,
    pub lent_gpu_hours: f64,
    /// Lent minus lost: research work kept.
    pub useful_gpu_hours: f64,
    /// Lent GPU-hours over the ideally idle GPU-hours (the token-price oracle).
    pub harvest_share: f64,
    /// Lent GPU-hours over the honest ceiling's idle GPU-hours ([`super::ceiling`]).
    pub ceiling_share: f64,
    pub lost_gpu_hours: f64,
    pub preemptions: u64,
    /// Preemptions per day of one GPU lent (`None` when nothing was lent): how often research
    /// is interrupted for the hours it gets.
    pub preemptions_per_lent_gpu_day: Option<f64>,
    pub completed_jobs: u64,
    pub inference_gpu_hours: f64,
    pub queue_wait_p50_s: f64,
    pub queue_wait_p99_s: f64,
    pub ttft_p50_s: f64,
    pub ttft_p99_s: f64,
    pub minutes: u64,
    pub minutes_over_slo: u64,
    pub minutes_within_slo_share: f64,
    pub scale_events: u64,
    pub requests: u64,
    /// Requests still waiting when the run ended.
    pub unserved: u64,
    /// Requests that can never fit one replica's KV cache (dropped).
    pub rejected: u64,
    /// Times the live demand code was called (nightshift only) and how many calls failed.
    pub demand_calls: u64,
    pub demand_errors: u64,
    /// Readings where the forecast raised the demand above the measured one.
    pub forecast_decisions: u64,
    /// Reclaim notices given and withdrawn (a withdrawn notice cost a checkpoint for nothing).
    pub notices: u64,
    pub notices_withdrawn: u64,
    /// Notices held by jobs that finished their work under them (neither withdrawn nor
    /// preempted).
    pub notices_completed: u64,
    /// Preemptions after the notice's checkpoint was written, during it, and without notice.
    pub preempted_after_checkpoint: u64,
    pub preempted_during_checkpoint: u64,
    pub preempted_without_notice: u64,
    /// Of those, preempted while other jobs held notices (the predictor named others).
    pub preempted_in_place_of_warned: u64,
    /// Seconds from notice to preemption (preempted jobs that had a notice).
    pub notice_lead_p50_s: f64,
    pub notice_lead_p99_s: f64,
    /// GPU-hours spent writing notice checkpoints (part of the lost GPU-hours).
    pub notice_checkpoint_gpu_hours: f64,
    /// Each service's own figures (one entry when the pool serves one service).
    pub services: Vec<ServiceSummary>,
}

/// One service's figures in a policy's run. The run's minutes within the SLO are those of the
/// service that kept the fewest.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSummary {
    pub name: String,
    pub requests: u64,
    /// GPU-hours its pods held (starting, serving or draining).
    pub inference_gpu_hours: f64,
    pub queue_wait_p99_s: f64,
    pub ttft_p99_s: f64,
    pub minutes_over_slo: u64,
    pub minutes_within_slo_share: f64,
    pub scale_events: u64,
    pub unserved: u64,
    /// The SLO loop's utilization at the end of the run and its cuts (the SLO-loop policy).
    pub slo_loop_utilization: Option<f64>,
    pub slo_loop_cuts: u64,
}

impl RunSummary {
    /// All counts at zero, before the first step.
    fn new(policy: ScalingPolicy) -> RunSummary {
        RunSummary {
            policy,
            label: policy.label(),
            lent_gpu_hours: 0.0,
            useful_gpu_hours: 0.0,
            harvest_share: 0.0,
            ceiling_share: 0.0,
            lost_gpu_hours: 0.0,
            preemptions: 0,
            preemptions_per_lent_gpu_day: None,
            completed_jobs: 0,
            inference_gpu_hours: 0.0,
            queue_wait_p50_s: 0.0,
            queue_wait_p99_s: 0.0,
            ttft_p50_s: 0.0,
            ttft_p99_s: 0.0,
            minutes: 0,
            minutes_over_slo: 0,
            minutes_within_slo_share: 0.0,
            scale_events: 0,
            requests: 0,
            unserved: 0,
            rejected: 0,
            demand_calls: 0,
            demand_errors: 0,
            forecast_decisions: 0,
            notices: 0,
            notices_withdrawn: 0,
            notices_completed: 0,
            preempted_after_checkpoint: 0,
            preempted_during_checkpoint: 0,
            preempted_without_notice: 0,
            preempted_in_place_of_warned: 0,
            notice_lead_p50_s: 0.0,
            notice_lead_p99_s: 0.0,
            notice_checkpoint_gpu_hours: 0.0,
            services: Vec::new(),
        }
    }
}

/// A policy's run: summary, timeline and (on request) the demand decisions it took.
pub struct RunOutcome {
    pub result: RunSummary,
    pub timeline: Vec<MinutePoint>,
    pub ideal_idle_gpu_hours: f64,
    pub pool_gpu_hours: f64,
    pub decisions: Vec<(Totals, Targets, Decision)>,
}

impl RunOutcome {
    /// The outcome with the honest ceiling's figures added: its share of the ceiling's idle
    /// GPU-hours and the ceiling's inference GPUs beside each minute.
    pub fn against_ceiling(mut self, ceiling: &Ceiling, gpus_per_replica: u32) -> RunOutcome {
        self.result.ceiling_share = if ceiling.idle_gpu_hours > 0.0 {
            self.result.lent_gpu_hours / ceiling.idle_gpu_hours
        } else {
            0.0
        };
        for (point, held) in self.timeline.iter_mut().zip(&ceiling.held) {
            point.ceiling_inference_gpus = (*held * gpus_per_replica) as f32;
        }
        self
    }
}

/// Runs one policy through the scenario, its services sharing one pool. `record_decisions`
/// keeps every (totals, decision) pair the nightshift policy computed, for verification.
pub fn run_policy(
    policy: ScalingPolicy,
    sc: &Scenario,
    services: &[Service],
    record_decisions: bool,
) -> RunOutcome {
    let run = PolicyRun::new(policy, sc, services, record_decisions, &[]);
    drive(run, u64::MAX).unwrap_or_else(|run| run.finish())
}

/// Replays a schedule of replicas per service, one count per minute (the last one on past its
/// end), through the scenario: the honest ceiling's held replicas ([`super::ceiling`]), as
/// [`ScalingPolicy::CeilingReplay`].
pub fn run_schedule(schedules: &[Vec<u32>], sc: &Scenario, services: &[Service]) -> RunOutcome {
    let run = PolicyRun::new(ScalingPolicy::CeilingReplay, sc, services, false, schedules);
    drive(run, u64::MAX).unwrap_or_else(|run| run.finish())
}

/// Runs one policy through the scenario unless more than `most_over` of its minutes miss the
/// SLO: `None` as soon as one more does (the rest of the run is not simulated).
pub fn run_within(
    policy: ScalingPolicy,
    sc: &Scenario,
    services: &[Service],
    most_over: u64,
) -> Option<RunOutcome> {
    let run = PolicyRun::new(policy, sc, services, false, &[]);
    drive(run, most_over).ok()
}

/// Steps a run to its end, or until more than `most_over` minutes missed the SLO (`Err`: the
/// run as far as it went).
fn drive(mut run: PolicyRun<'_>, most_over: u64) -> Result<RunOutcome, Box<PolicyRun<'_>>> {
    let started = std::time::Instant::now();
    let policy = run.policy;
    for k in 0..run.steps {
        run.step(k);
        if run.minutes_over > most_over {
            tracing::debug!(
                policy = policy.label(),
                at_s = (k + 1) as f64 * run.dt,
                elapsed_s = started.elapsed().as_secs_f64(),
                "policy run stopped: too many minutes over the SLO"
            );
            return Err(Box::new(run));
        }
    }
    for s in &run.services {
        let learned = s.capacity.as_ref().and_then(LearnedCapacity::per_replica);
        tracing::debug!(
            policy = policy.label(),
            service = s.name,
            learned_prompt_per_replica = learned.map(|t| t.prompt),
            learned_generated_per_replica = learned.map(|t| t.generated),
            slo_loop_utilization = s.slo_loop.as_ref().map(SloLoop::utilization),
            slo_loop_cuts = s.slo_loop.as_ref().map(SloLoop::cuts),
            "service's learned capacity and SLO loop"
        );
    }
    let outcome = run.finish();
    tracing::debug!(
        policy = policy.label(),
        elapsed_s = started.elapsed().as_secs_f64(),
        "policy run finished"
    );
    Ok(outcome)
}

/// The minute being accumulated for the timeline.
#[derive(Default)]
struct OpenMinute {
    point: MinutePoint,
    /// Control steps added so far.
    steps: f64,
}

/// One policy's run in progress: the pool the services share, each service's part and the
/// figures collected so far. [`PolicyRun::step`] advances it by one control step.
struct PolicyRun<'a> {
    policy: ScalingPolicy,
    /// Control step (s).
    dt: f64,
    end: f64,
    steps: u64,
    steps_per_minute: f64,
    /// GPUs kept free of research (nightshift only).
    headroom: u32,
    pool: Pool,
    pool_gpus: u32,
    services: Vec<ServiceRun<'a>>,
    /// Reclaim notices (the policies with notices on), and when the pool controller next
    /// decides them.
    notice: Option<NoticePolicy>,
    next_notice: f64,
    /// Minutes closed, and the most minutes any one service missed the SLO in (the run keeps
    /// the SLO as well as its worst-served service does).
    minutes: u64,
    minutes_over: u64,

    result: RunSummary,
    timeline: Vec<MinutePoint>,
    minute: OpenMinute,
    ideal_idle_gpu_hours: f64,
    inference_gpu_s: f64,
}

impl<'a> PolicyRun<'a> {
    /// The run at midnight of day 0: each service's initial replicas serving, in the services'
    /// order, on an empty pool. `schedules` holds the replicas per minute of each service of a
    /// schedule-following run ([`ScalingPolicy::CeilingReplay`]).
    fn new(
        policy: ScalingPolicy,
        sc: &'a Scenario,
        services: &'a [Service],
        record_decisions: bool,
        schedules: &'a [Vec<u32>],
    ) -> PolicyRun<'a> {
        let dt = sc.run.step_s;
        let end = sc.run.days * 86_400.0;
        let ns = &sc.policies.nightshift;
        let mut pool = Pool::new(sc.pool.nodes, sc.pool.gpus_per_node, sc.research.clone());
        let pool_gpus = pool.total_gpus();
        let services = services
            .iter()
            .enumerate()
            .map(|(i, service)| {
                let schedule = schedules.get(i).map_or(&[][..], Vec::as_slice);
                ServiceRun::new(policy, sc, service, record_decisions, schedule, &mut pool)
            })
            .collect();
        PolicyRun {
            policy,
            dt,
            end,
            steps: (end / dt).ceil() as u64,
            steps_per_minute: (60.0 / dt).max(1.0),
            headroom: if policy.is_nightshift() {
                ns.headroom_gpus
            } else {
                0
            },
            pool,
            pool_gpus,
            services,
            notice: policy.notices().then_some(NoticePolicy {
                window_s: ns.notice_window_s,
                margin: ns.notice_margin,
                hysteresis: ns.notice_hysteresis,
            }),
            next_notice: NOTICE_INTERVAL.as_secs_f64(),
            minutes: 0,
            minutes_over: 0,
            result: RunSummary::new(policy),
            timeline: Vec::with_capacity((end / 60.0).ceil() as usize),
            minute: OpenMinute::default(),
            ideal_idle_gpu_hours: 0.0,
            inference_gpu_s: 0.0,
        }
    }

    /// Control step `k`, which ends at `(k + 1) × dt`.
    fn step(&mut self, k: u64) {
        let t1 = (k + 1) as f64 * self.dt;
        for s in &mut self.services {
            s.admit_arrivals(t1);
            s.serve(t1);
            s.retire_and_start_pods(t1, &mut self.pool);
            s.sample_metrics(t1);
            s.decide_replicas(t1);
        }
        self.give_notices(t1);
        for s in &mut self.services {
            s.converge(t1, &mut self.pool);
        }
        for s in &mut self.services {
            s.schedule_pending(t1, &mut self.pool);
        }
        // Research takes what is left.
        self.pool.tick_research(t1, self.dt, self.headroom);
        self.account(t1, k + 1 == self.steps);
    }

    /// Reclaim notices (policies with notices on), decided as the pool controller decides them:
    /// every [`NOTICE_INTERVAL`] it evaluates each service's trigger against the replicas its
    /// Deployment is asked for, and warns the research the services' next replicas would
    /// displace, service after service on one view of the pool, with the live decision code.
    fn give_notices(&mut self, t1: f64) {
        let Some(policy) = self.notice else {
            return;
        };
        if t1 < self.next_notice {
            return;
        }
        self.next_notice += NOTICE_INTERVAL.as_secs_f64();
        let wanted: Vec<(u32, u32)> = self
            .services
            .iter_mut()
            .map(|s| (s.notice_extra(&policy, t1), s.gpr))
            .collect();
        self.pool.notice(t1, &wanted);
    }

    /// Adds this step's GPU use to the totals and the open minute; closes the minute when it is
    /// full or the run ends.
    fn account(&mut self, t1: f64, last_step: bool) {
        let inference = f64::from(self.pool.inference_gpus());
        self.inference_gpu_s += inference * self.dt;
        for s in &mut self.services {
            s.gpu_s += f64::from(s.gpus_held()) * self.dt;
        }
        self.minute.point.inference_gpus += inference as f32;
        self.minute.point.research_gpus += self.pool.research_gpus() as f32;
        self.minute.steps += 1.0;
        if self.minute.steps >= self.steps_per_minute || last_step {
            self.close_minute(t1);
        }
    }

    /// Judges the minute against the SLO for every service (the chart marks it within when
    /// every service is), compares it with an oracle's GPU use and adds it to the timeline.
    fn close_minute(&mut self, t1: f64) {
        let OpenMinute { mut point, steps } = std::mem::take(&mut self.minute);
        let span = steps * self.dt;
        let mut ok = true;
        let mut ideal_gpus = 0.0;
        for s in &mut self.services {
            let (within, ideal) = s.close_minute(t1, span);
            ok &= within;
            ideal_gpus += ideal;
        }
        self.minutes += 1;
        self.minutes_over = self
            .services
            .iter()
            .map(|s| s.rec.minutes_over)
            .max()
            .unwrap_or(0);
        point.slo_ok = ok;
        point.inference_gpus /= steps as f32;
        point.research_gpus /= steps as f32;
        point.ideal_inference_gpus = ideal_gpus as f32;
        self.ideal_idle_gpu_hours +=
            (f64::from(self.pool_gpus) - ideal_gpus).max(0.0) * span / 3600.0;
        self.timeline.push(point);
    }

    /// The run's figures once every step is done.
    fn finish(self) -> RunOutcome {
        let PolicyRun {
            mut result,
            pool,
            services,
            minutes,
            minutes_over,
            ideal_idle_gpu_hours,
            inference_gpu_s,
            pool_gpus,
            end,
            timeline,
            ..
        } = self;
        research_figures(&mut result, pool.stats);
        result.harvest_share = if ideal_idle_gpu_hours > 0.0 {
            result.lent_gpu_hours / ideal_idle_gpu_hours
        } else {
            0.0
        };
        result.inference_gpu_hours = inference_gpu_s / 3600.0;
        result.minutes = minutes;
        result.minutes_over_slo = minutes_over;
        result.minutes_within_slo_share = within_share(minutes, minutes_over);
        let mut waits = LatencyHistogram::default();
        let mut ttfts = LatencyHistogram::default();
        let mut decisions = Vec::new();
        for s in services {
            waits.merge(&s.rec.waits);
            ttfts.merge(&s.rec.ttfts);
            let c = &s.counts;
            result.requests += c.requests;
            result.rejected += c.rejected;
            result.scale_events += c.scale_events;
            result.demand_calls += c.demand_calls;
            result.demand_errors += c.demand_errors;
            result.forecast_decisions += c.forecast_decisions;
            result.unserved += s.queue.len() as u64;
            result.services.push(s.summary());
            decisions.extend(s.decisions);
        }
        result.queue_wait_p50_s = waits.quantile(0.5);
        result.queue_wait_p99_s = waits.quantile(0.99);
        result.ttft_p50_s = ttfts.quantile(0.5);
        result.ttft_p99_s = ttfts.quantile(0.99);
        RunOutcome {
            result,
            timeline,
            ideal_idle_gpu_hours,
            pool_gpu_hours: f64::from(pool_gpus) * end / 3600.0,
            decisions,
        }
    }
}

/// The research figures of a run, from its pool's totals.
fn research_figures(result: &mut RunSummary, stats: ResearchStats) {
    result.lent_gpu_hours = stats.lent_gpu_s / 3600.0;
    result.lost_gpu_hours = stats.lost_gpu_s / 3600.0;
    result.useful_gpu_hours = result.lent_gpu_hours - result.lost_gpu_hours;
    result.preemptions = stats.preemptions;
    result.preemptions_per_lent_gpu_day = (result.lent_gpu_hours > 0.0)
        .then(|| stats.preemptions as f64 / (result.lent_gpu_hours / 24.0));
    result.completed_jobs = stats.completed_jobs;
    result.notices = stats.notices;
    result.notices_withdrawn = stats.notices_withdrawn;
    result.notices_completed = stats.notices_completed;
    result.preempted_after_checkpoint = stats.preempted_after_checkpoint;
    result.preempted_during_checkpoint = stats.preempted_during_checkpoint;
    result.preempted_in_place_of_warned = stats.preempted_in_place_of_warned;
    result.preempted_without_notice =
        stats.preemptions - stats.preempted_after_checkpoint - stats.preempted_during_checkpoint;
    let mut leads = stats.lead_times_s;
    leads.sort_by(f64::total_cmp);
    result.notice_lead_p50_s = quantile(&leads, 0.5);
    result.notice_lead_p99_s = quantile(&leads, 0.99);
    result.notice_checkpoint_gpu_hours = stats.notice_checkpoint_gpu_s / 3600.0;
}

/// The share of `minutes` within the SLO when `over` of them missed it (all of none).
fn within_share(minutes: u64, over: u64) -> f64 {
    if minutes > 0 {
        1.0 - over as f64 / minutes as f64
    } else {
        1.0
    }
}

/// What one service counts over a run.
#[derive(Default)]
struct Counts {
    requests: u64,
    rejected: u64,
    scale_events: u64,
    demand_calls: u64,
    demand_errors: u64,
    forecast_decisions: u64,
}

/// One service's part of a policy's run: its requests, its pods, their metrics and its
/// autoscaler. The pool is the run's, lent to each method that needs it.
struct ServiceRun<'a> {
    name: &'a str,
    policy: ScalingPolicy,
    sc: &'a Scenario,
    perf: Perf,
    /// GPUs per inference replica.
    gpr: u32,
    targets: demand::Targets,
    record_decisions: bool,
    /// Replicas per minute of a schedule-following run ([`ScalingPolicy::CeilingReplay`]).
    schedule: &'a [u32],
    /// Its night window (the night window policies).
    night: NightWindowConfig,

    arrivals: Peekable<Arrivals<'a>>,
    queue: VecDeque<Queued>,
    pods: Vec<ReplicaPod>,
    rec: Recorder,

    /// Samples kept for rate windows and scrape lags; at most `history_len`.
    history: VecDeque<Sample>,
    history_len: usize,
    /// Tokens generated and prefilled by pods that have left (their counters are gone, the sums
    /// are not).
    retired_generated: f64,
    retired_prompt: f64,

    hpa: Hpa,
    desired: u32,
    next_sync: f64,
    next_poll: f64,
    cached_value: Option<f64>,

    /// Its reclaim-notice state (the policies with notices on).
    watch: Option<Watch>,
    /// Its utilization closed on its measured queue wait (the SLO-loop policy).
    slo_loop: Option<SloLoop>,
    /// The trigger's learned capacity (nightshift with `learn_capacity`) and daily forecast
    /// (the forecast policies): the live scaler's code.
    capacity: Option<LearnedCapacity>,
    shape: Option<DailyShape>,

    counts: Counts,
    decisions: Vec<(Totals, Targets, Decision)>,
    /// Tokens (context and generated) of the requests that arrived in the open minute.
    minute_tokens: f64,
    /// GPU-seconds its pods held (bound: starting, serving or draining).
    gpu_s: f64,
}

impl<'a> ServiceRun<'a> {
    fn new(
        policy: ScalingPolicy,
        shared: &'a Scenario,
        service: &'a Service,
        record_decisions: bool,
        schedule: &'a [u32],
        pool: &mut Pool,
    ) -> ServiceRun<'a> {
        let sc = &service.sc;
        let ns = &sc.policies.nightshift;
        let night = shared.night_window_of(sc.policies.static_peak.replicas);
        let desired = fixed_replicas(policy, sc, &night, schedule, 0.0)
            .unwrap_or(sc.autoscaling.initial_replicas);
        let pods = warm_start(pool, desired, sc.model.gpus_per_replica);
        let history_len = history_len(sc);
        ServiceRun {
            name: &service.name,
            policy,
            sc,
            perf: Perf::new(&sc.model),
            gpr: sc.model.gpus_per_replica,
            targets: ns.targets(),
            record_decisions,
            schedule,
            night,
            arrivals: Arrivals::new(&service.trace, &service.envelope, sc.run.seed).peekable(),
            queue: VecDeque::new(),
            pods,
            rec: Recorder::new(sc.slo.queue_wait_p99_s),
            history: VecDeque::with_capacity(history_len + 1),
            history_len,
            retired_generated: 0.0,
            retired_prompt: 0.0,
            hpa: Hpa::new(sc.autoscaling.clone()),
            desired,
            next_sync: sc.autoscaling.hpa_sync_s,
            next_poll: 0.0,
            cached_value: None,
            watch: policy.notices().then(Watch::default),
            slo_loop: policy
                .closes_the_slo_loop()
                .then(|| SloLoop::new(slo_loop::config(sc.slo.queue_wait_p99_s), ns.utilization)),
            capacity: (policy.is_nightshift() && ns.learn_capacity)
                .then(|| LearnedCapacity::new(CapacityConfig::default())),
            shape: policy
                .forecasts()
                .then(|| DailyShape::new(ForecastConfig::default())),
            counts: Counts::default(),
            decisions: Vec::new(),
            minute_tokens: 0.0,
            gpu_s: 0.0,
        }
    }

    /// Arrivals of this step join the router's queue.
    fn admit_arrivals(&mut self, t1: f64) {
        while let Some(a) = self.arrivals.next_if(|a| a.at < t1) {
            self.counts.requests += 1;
            self.minute_tokens += f64::from(a.context) + f64::from(a.generated);
            let q = Queued {
                arrival: a.at,
                context: a.context,
                generated: a.generated,
            };
            if q.footprint() > self.perf.kv_capacity {
                self.counts.rejected += 1;
                continue;
            }
            self.queue.push_back(q);
        }
    }

    /// Serving replicas work through the step.
    fn serve(&mut self, t1: f64) {
        let mut serving: Vec<&mut Replica> = self
            .pods
            .iter_mut()
            .filter(|p| p.is_serving())
            .map(|p| &mut p.replica)
            .collect();
        fleet::run_until(&mut serving, &mut self.queue, t1, &self.perf, &mut self.rec);
    }

    /// Pod lifecycle: drained pods leave, started pods begin serving.
    fn retire_and_start_pods(&mut self, t1: f64, pool: &mut Pool) {
        let mut i = 0;
        while i < self.pods.len() {
            match self.pods[i].phase {
                PodPhase::Draining { node } if self.pods[i].replica.is_idle() => {
                    pool.release_inference(node, self.gpr);
                    self.retired_generated += self.pods[i].replica.generated_total;
                    self.retired_prompt += self.pods[i].replica.prompt_total;
                    self.pods.remove(i);
                    continue;
                }
                PodPhase::Starting { node, ready_at } if ready_at <= t1 => {
                    self.pods[i].phase = PodPhase::Ready { node };
                    self.pods[i].replica = Replica::new(t1);
                }
                _ => {}
            }
            i += 1;
        }
    }

    /// What the pods' /metrics say now, summed over pods, joins the history.
    fn sample_metrics(&mut self, t1: f64) {
        let mut s = Sample {
            t: t1,
            waiting: self.queue.len() as f64,
            generated_total: self.retired_generated,
            prompt_total: self.retired_prompt,
            queue_buckets: self.rec.queue_buckets,
            ..Sample::default()
        };
        for p in &self.pods {
            s.generated_total += p.replica.generated_total;
            s.prompt_total += p.replica.prompt_total;
            if p.is_serving() {
                s.pods += 1;
                s.running += p.replica.running() as f64;
                s.kv_cache += p.replica.kv_usage(&self.perf);
            }
        }
        self.history.push_back(s);
        if self.history.len() > self.history_len {
            self.history.pop_front();
        }
    }

    /// Pods the Deployment counts as its replicas.
    fn non_draining_pods(&self) -> u32 {
        self.pods
            .iter()
            .filter(|p| !matches!(p.phase, PodPhase::Draining { .. }))
            .count() as u32
    }

    /// GPUs its pods hold: bound ones, starting, serving or draining.
    fn gpus_held(&self) -> u32 {
        let bound = self
            .pods
            .iter()
            .filter(|p| !matches!(p.phase, PodPhase::Pending { .. }))
            .count() as u32;
        bound * self.gpr
    }

    /// Policy decision: a fixed schedule, or the HPA on the policy's metric.
    fn decide_replicas(&mut self, t1: f64) {
        let before = self.desired;
        match fixed_replicas(self.policy, self.sc, &self.night, self.schedule, t1) {
            Some(r) => self.desired = r,
            None => self.autoscale(t1, self.non_draining_pods()),
        }
        if self.desired != before {
            self.counts.scale_events += 1;
        }
    }

    /// The replicas beyond those its Deployment is asked for that its reclaim notices cover:
    /// the scaler's own evaluation of its trigger (which feeds the learned capacity and the
    /// forecast as KEDA's calls do) decided with the live code. A failed evaluation keeps the
    /// notices given.
    fn notice_extra(&mut self, policy: &NoticePolicy, t1: f64) -> u32 {
        let demand = self.evaluate(t1).map(|(replicas, _)| replicas);
        let Some(watch) = self.watch.as_mut() else {
            return 0;
        };
        match demand {
            Some(replicas) => policy.update(watch, t1, replicas, self.desired),
            None => watch.covered().saturating_sub(self.desired),
        }
    }

    /// KEDA polls the metric (when its cache is on) and the HPA syncs, each on its own period.
    fn autoscale(&mut self, t1: f64, current: u32) {
        let sc = self.sc;
        let auto = &sc.autoscaling;
        if auto.use_cached_metrics && t1 >= self.next_poll {
            self.next_poll += auto.keda_polling_s;
            self.cached_value = self.read_metric(t1);
        }
        if t1 >= self.next_sync {
            self.next_sync += auto.hpa_sync_s;
            let value = if auto.use_cached_metrics {
                self.cached_value
            } else {
                self.read_metric(t1)
            };
            let target = match self.policy {
                ScalingPolicy::KedaPrometheus => sc.policies.keda_prometheus.threshold,
                _ => demand::METRIC_TARGET,
            };
            self.desired = self.hpa.desired(t1, current, value, target);
        }
    }

    /// The metric value KEDA hands the HPA at `t1` (`None`: it could not be read).
    fn read_metric(&mut self, t1: f64) -> Option<f64> {
        let prometheus = &self.sc.prometheus;
        match self.policy {
            ScalingPolicy::KedaPrometheus => {
                // sum(vllm:num_requests_waiting) as of the latest scrape; an empty result is
                // 0 (KEDA's ignoreNullValues default).
                let at = scrape_time(t1, prometheus.scrape_interval_s);
                Some(sample_at(&self.history, at).waiting)
            }
            _ => self.evaluate(t1).map(|(_, value)| value),
        }
    }

    /// nightshift's evaluation of its trigger at `t1`, as the live scaler's: the totals its
    /// source reports, the learned targets, the live demand code and, with the forecast, the
    /// daily shape. The demand in replicas and the value reported to KEDA; `None` when the
    /// demand code fails (KEDA receives an error).
    fn evaluate(&mut self, t1: f64) -> Option<(f64, f64)> {
        let ns = &self.sc.policies.nightshift;
        let at = match ns.source {
            MetricSource::Scrape => t1,
            MetricSource::Prometheus => scrape_time(t1, self.sc.prometheus.scrape_interval_s),
        };
        let totals = totals_at(&self.history, at, ns.rate_window_s);
        self.counts.demand_calls += 1;
        let utilization = self.closed_utilization(at);
        let mut targets = self.learned_targets(&totals, utilization);
        if self.slo_loop.is_some() {
            // The queue target tightens and eases with the utilization.
            let scale = utilization / ns.utilization;
            targets.waiting = targets.waiting.map(|w| w * scale);
        }
        match policy::nightshift_metric(&totals, &targets) {
            Ok((decision, value)) => {
                let answer = match self.shape.as_mut() {
                    Some(shape) => {
                        shape.observe(t1, decision.replicas);
                        let expected = shape.expected(t1, ns.forecast_lead_s);
                        let (replicas, decided) = with_forecast(decision.replicas, expected);
                        if decided {
                            self.counts.forecast_decisions += 1;
                        }
                        (replicas, replicas * demand::METRIC_TARGET)
                    }
                    None => (decision.replicas, value),
                };
                if self.record_decisions {
                    self.decisions.push((totals, targets, decision));
                }
                Some(answer)
            }
            Err(_) => {
                self.counts.demand_errors += 1;
                None
            }
        }
    }

    /// The trigger's targets for this reading: learned token targets (when the policy learns
    /// them and a replica has been seen saturated) fill the token signals the scenario does not
    /// set by hand.
    fn learned_targets(&mut self, totals: &Totals, utilization: f64) -> Targets {
        let mut targets = self.targets;
        let Some(capacity) = self.capacity.as_mut() else {
            return targets;
        };
        let s = &totals.signals;
        if let (Some(waiting), Some(prompt), Some(generated)) =
            (s.waiting, s.prompt_tokens, s.generation_tokens)
        {
            capacity.observe(totals.pods, waiting, prompt, generated);
        }
        if let Some(learned) = capacity.targets(utilization) {
            if targets.prompt_tokens.is_none() && learned.prompt > 0.0 {
                targets.prompt_tokens = Some(learned.prompt);
            }
            if targets.generation_tokens.is_none() && learned.generated > 0.0 {
                targets.generation_tokens = Some(learned.generated);
            }
        }
        targets
    }

    /// The utilization of the learned capacity for a reading at `at`: the scenario's, or (the
    /// SLO-loop policy) the loop's after it read the queue-time histogram over the rate window
    /// ending at `at`, the p99 as Prometheus' `histogram_quantile` computes it.
    fn closed_utilization(&mut self, at: f64) -> f64 {
        let ns = &self.sc.policies.nightshift;
        let Some(slo_loop) = self.slo_loop.as_mut() else {
            return ns.utilization;
        };
        let now = sample_at(&self.history, at);
        let before = sample_at(&self.history, at - ns.rate_window_s);
        let counts: Vec<f64> = now
            .queue_buckets
            .iter()
            .zip(&before.queue_buckets)
            .map(|(n, b)| (n - b).max(0.0))
            .collect();
        let reading =
            slo_loop::histogram_quantile(0.99, &VLLM_QUEUE_TIME_BUCKETS, &counts).map(|p99_s| {
                TailReading {
                    p99_s,
                    requests: counts.iter().sum(),
                }
            });
        slo_loop.observe(at, reading)
    }

    /// The Deployment converges to the desired count.
    fn converge(&mut self, t1: f64, pool: &mut Pool) {
        let current = self.non_draining_pods();
        if current < self.desired {
            for _ in current..self.desired {
                self.pods.push(ReplicaPod {
                    phase: PodPhase::Pending { nominated: None },
                    replica: Replica::new(t1),
                });
            }
        } else if current > self.desired {
            self.scale_down(current - self.desired, pool);
        }
    }

    /// Removes `excess` pods in ReplicaSet order: unscheduled pods, then not-ready ones, then
    /// the newest (which drain: they finish what they run, then leave).
    fn scale_down(&mut self, mut excess: u32, pool: &mut Pool) {
        for pass in 0..3 {
            let mut i = self.pods.len();
            while excess > 0 && i > 0 {
                i -= 1;
                let remove = match (pass, self.pods[i].phase) {
                    (0, PodPhase::Pending { nominated }) => {
                        if let Some(n) = nominated {
                            pool.unclaim(n, self.gpr);
                        }
                        true
                    }
                    (1, PodPhase::Starting { node, .. }) => {
                        pool.release_inference(node, self.gpr);
                        true
                    }
                    (2, PodPhase::Ready { node }) => {
                        self.pods[i].phase = PodPhase::Draining { node };
                        self.pods[i].replica.accepting = false;
                        excess -= 1;
                        false
                    }
                    _ => false,
                };
                if remove {
                    self.pods.remove(i);
                    excess -= 1;
                }
            }
        }
    }

    /// The scheduler binds pending pods, preempting research when it must.
    fn schedule_pending(&mut self, t1: f64, pool: &mut Pool) {
        let startup_s = self.sc.model.startup_s;
        for p in self.pods.iter_mut() {
            if let PodPhase::Pending { nominated } = p.phase {
                p.phase = match pool.place_inference(self.gpr, nominated, t1) {
                    Placement::Bound(node) => PodPhase::Starting {
                        node,
                        ready_at: t1 + startup_s,
                    },
                    Placement::Nominated(n) => PodPhase::Pending { nominated: Some(n) },
                    Placement::Unschedulable => PodPhase::Pending { nominated: None },
                };
            }
        }
    }

    /// Closes the service's minute of `span` seconds: whether it kept the SLO, and the GPUs an
    /// oracle would have given it.
    fn close_minute(&mut self, t1: f64, span: f64) -> (bool, f64) {
        let oldest = self
            .queue
            .front()
            .map_or(0.0, |q| (t1 - q.arrival).max(0.0));
        let ok = self.rec.close_minute(oldest);
        let auto = &self.sc.autoscaling;
        let tokens = std::mem::take(&mut self.minute_tokens);
        let ideal_replicas = (tokens * self.perf.compute_s_per_token / span)
            .ceil()
            .clamp(f64::from(auto.min_replicas), f64::from(auto.max_replicas));
        (ok, ideal_replicas * f64::from(self.gpr))
    }

    /// Its own figures, for a pool shared by several services.
    fn summary(&self) -> ServiceSummary {
        ServiceSummary {
            name: self.name.to_owned(),
            requests: self.counts.requests,
            inference_gpu_hours: self.gpu_s / 3600.0,
            queue_wait_p99_s: self.rec.waits.quantile(0.99),
            ttft_p99_s: self.rec.ttfts.quantile(0.99),
            minutes_over_slo: self.rec.minutes_over,
            minutes_within_slo_share: within_share(self.rec.minutes, self.rec.minutes_over),
            scale_events: self.counts.scale_events,
            unserved: self.queue.len() as u64,
            slo_loop_utilization: self.slo_loop.as_ref().map(SloLoop::utilization),
            slo_loop_cuts: self.slo_loop.as_ref().map_or(0, SloLoop::cuts),
        }
    }
}

/// The `q` quantile of sorted `values` (nearest rank; 0 when empty).
fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// Replicas a fixed-schedule policy runs a service at at `t` (`None`: the policy autoscales).
/// `night` is the service's night window, `schedule` a schedule-following run's replicas per
/// minute.
fn fixed_replicas(
    policy: ScalingPolicy,
    sc: &Scenario,
    night: &NightWindowConfig,
    schedule: &[u32],
    t: f64,
) -> Option<u32> {
    match policy {
        ScalingPolicy::StaticPeak => Some(sc.policies.static_peak.replicas),
        ScalingPolicy::NightWindow | ScalingPolicy::NightWindowHindsight => {
            Some(policy::night_window_replicas(night, t))
        }
        ScalingPolicy::CeilingReplay => {
            let minute = (t.max(0.0) / 60.0).floor() as usize;
            let held = schedule.get(minute).or(schedule.last()).copied();
            Some(held.unwrap_or(sc.autoscaling.max_replicas))
        }
        ScalingPolicy::KedaPrometheus
        | ScalingPolicy::Nightshift
        | ScalingPolicy::NightshiftWithoutNotices
        | ScalingPolicy::NightshiftForecast
        | ScalingPolicy::NightshiftSloLoop => None,
    }
}

/// Warm start: the initial replicas are serving at midnight of day 0.
fn warm_start(pool: &mut Pool, replicas: u32, gpr: u32) -> Vec<ReplicaPod> {
    (0..replicas)
        .map(|_| ReplicaPod {
            phase: match pool.place_inference(gpr, None, 0.0) {
                Placement::Bound(node) => PodPhase::Ready { node },
                Placement::Nominated(n) => PodPhase::Pending { nominated: Some(n) },
                Placement::Unschedulable => PodPhase::Pending { nominated: None },
            },
            replica: Replica::new(0.0),
        })
        .collect()
}

/// Samples to keep: enough for the longest rate window behind the latest scrape.
fn history_len(sc: &Scenario) -> usize {
    let dt = sc.run.step_s;
    let window = sc
        .policies
        .nightshift
        .rate_window_s
        .max(sc.prometheus.rate_window_s);
    // + 3: the sample at the window's start, and a margin for rounding the span to steps.
    ((window + sc.prometheus.scrape_interval_s) / dt).ceil() as usize + 3
}

/// The time of the latest Prometheus scrape at or before `t`.
fn scrape_time(t: f64, interval: f64) -> f64 {
    (t / interval).floor() * interval
}

/// The latest sample at or before `t` (the oldest kept if none is that old).
fn sample_at(history: &VecDeque<Sample>, t: f64) -> Sample {
    history
        .iter()
        .rev()
        .find(|s| s.t <= t + 1e-9)
        .or(history.front())
        .copied()
        .unwrap_or_default()
}

/// Signal totals as nightshift's sources report them at `t`: gauges summed over the pods that
/// report, generated tokens as a rate over `window`. No reporting pod means no reading.
fn totals_at(history: &VecDeque<Sample>, t: f64, window: f64) -> Totals {
    let now = sample_at(history, t);
    if now.pods == 0 {
        return Totals::default();
    }
    let before = sample_at(history, t - window);
    let span = now.t - before.t;
    let rate = |now: f64, before: f64| {
        if span > 0.0 {
            (now - before).max(0.0) / span
        } else {
            0.0
        }
    };
    Totals {
        pods: now.pods,
        signals: PerSignal {
            waiting: Some(now.waiting),
            running: Some(now.running),
            kv_cache: Some(now.kv_cache),
            generation_tokens: Some(rate(now.generated_total, before.generated_total)),
            prompt_tokens: Some(rate(now.prompt_total, before.prompt_total)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::trace::Trace;

    /// A small synthetic trace: steady 4 req/s of 1000 + 100 tokens.
    fn steady_trace() -> Trace {
        let mut body = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
        for i in 0..240 {
            body.push_str(&format!(
                "2023-11-16 18:{:02}:{:02}.{:03},1000,100\n",
                i / 240,
                (i / 4) % 60,
                (i % 4) * 250
            ));
        }
        Trace::parse(&body).expect("valid trace")
    }

    /// A two-hour run of `sc` (one service per trace given).
    fn run_of(
        sc: &mut Scenario,
        traces: &[&Trace],
        kind: ScalingPolicy,
        record: bool,
    ) -> RunOutcome {
        sc.run.days = 2.0 / 24.0;
        let services = Service::all(sc, traces).expect("valid services");
        run_policy(kind, sc, &services, record)
    }

    /// A short scenario over the steady trace.
    fn small_run(kind: ScalingPolicy, record: bool) -> RunOutcome {
        run_of(&mut Scenario::default(), &[&steady_trace()], kind, record)
    }

    #[test]
    fn the_slo_loop_eases_on_a_quiet_queue_and_cuts_on_a_congested_one() {
        let quiet = small_run(ScalingPolicy::NightshiftSloLoop, false).result;
        let s = &quiet.services[0];
        // Waits of zero for two hours: one ease, after the first hour of low tail.
        assert_eq!((s.slo_loop_utilization, s.slo_loop_cuts), (Some(0.62), 0));
        assert_eq!(quiet.minutes_over_slo, 0);
        assert_eq!(
            small_run(ScalingPolicy::Nightshift, false).result.services[0].slo_loop_utilization,
            None
        );

        // Ten times the steady trace's rate from the start: more than the warm fleet serves
        // within a second while it scales up.
        let mut sc = Scenario::default();
        sc.envelope.hourly = vec![10.0; 24];
        let busy = run_of(
            &mut sc,
            &[&steady_trace()],
            ScalingPolicy::NightshiftSloLoop,
            false,
        );
        let s = &busy.result.services[0];
        assert!(s.slo_loop_cuts >= 1, "{s:?}");
        assert!(s.slo_loop_utilization.is_some_and(|u| u < 0.6), "{s:?}");
    }

    #[test]
    fn a_scenario_naming_its_one_service_runs_as_the_scenario_itself() {
        let trace = steady_trace();
        let named = Scenario {
            services: vec![crate::sim::config::ServiceConfig {
                name: "chat".into(),
                ..Default::default()
            }],
            ..Scenario::default()
        };
        for kind in [ScalingPolicy::Nightshift, ScalingPolicy::NightWindow] {
            let alone = small_run(kind, false).result;
            let mut shared = run_of(&mut named.clone(), &[&trace], kind, false).result;
            assert_eq!(shared.services[0].name, "chat");
            shared.services[0].name = String::new();
            assert_eq!(
                serde_json::to_string(&shared).expect("json"),
                serde_json::to_string(&alone).expect("json"),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn services_sharing_a_pool_keep_their_own_traffic_and_share_its_gpus() {
        let trace = steady_trace();
        let mut sc = Scenario::default();
        let service = |name: &str, seed, peak_replicas| crate::sim::config::ServiceConfig {
            name: name.into(),
            seed,
            peak_replicas,
            ..Default::default()
        };
        sc.services = vec![service("a", 1, 10), service("b", 7, 6)];
        let both = run_of(
            &mut sc.clone(),
            &[&trace, &trace],
            ScalingPolicy::StaticPeak,
            false,
        );
        // Static peak holds both peaks: 16 replicas of 4 GPUs for two hours, nothing lent.
        let r = &both.result;
        assert_eq!(r.lent_gpu_hours, 0.0);
        assert!(
            (r.inference_gpu_hours - 128.0).abs() < 1e-9,
            "{}",
            r.inference_gpu_hours
        );
        let per: Vec<f64> = r.services.iter().map(|s| s.inference_gpu_hours).collect();
        assert!(
            (per[0] - 80.0).abs() < 1e-9 && (per[1] - 48.0).abs() < 1e-9,
            "{per:?}"
        );
        // Each service replays its own arrivals, the same as it would alone.
        for (i, name) in ["a", "b"].iter().enumerate() {
            let mut alone = sc.clone();
            alone.services.retain(|s| s.name == *name);
            let own = run_of(&mut alone, &[&trace], ScalingPolicy::StaticPeak, false);
            assert_eq!(own.result.requests, r.services[i].requests, "{name}");
        }
        assert_eq!(
            r.requests,
            r.services.iter().map(|s| s.requests).sum::<u64>()
        );

        // Autoscaled, research fills what both leave and the run is judged by its worst-served
        // service.
        let shared = run_of(&mut sc, &[&trace, &trace], ScalingPolicy::Nightshift, false).result;
        assert!(shared.lent_gpu_hours > 0.0);
        let per_day = shared.preemptions as f64 * 24.0 / shared.lent_gpu_hours;
        assert_eq!(shared.preemptions_per_lent_gpu_day, Some(per_day));
        let worst = shared.services.iter().map(|s| s.minutes_over_slo).max();
        assert_eq!(Some(shared.minutes_over_slo), worst);
        assert_eq!(shared.demand_calls, 2 * (2 * 3600 / 15 + 2 * 3600 / 5));
    }

    #[test]
    fn nightshift_policy_decides_with_the_live_demand_code() {
        let out = small_run(ScalingPolicy::Nightshift, true);
        assert!(out.decisions.len() > 100, "{}", out.decisions.len());
        assert_eq!(out.result.demand_calls as usize, out.decisions.len());
        let hand_set = Scenario::default().policies.nightshift.targets();
        for (totals, targets, decision) in &out.decisions {
            // Re-deciding with the scaler's own function gives the same answer: the simulator
            // did not use a copy that could drift.
            assert_eq!(&demand::compute(totals, targets).expect("valid"), decision);
            // Learned token targets only fill what the scenario does not set by hand.
            assert_eq!(targets.waiting, hand_set.waiting);
        }
        // A light steady load never queues: nothing learned, the queue alone decides.
        assert!(out.decisions.iter().all(|(_, t, d)| {
            t.generation_tokens.is_none() && d.terms.len() == 1 && d.replicas == 0.0
        }));
    }

    #[test]
    fn with_notices_the_pool_controller_evaluates_the_trigger_between_hpa_syncs() {
        let plain = small_run(ScalingPolicy::NightshiftWithoutNotices, false);
        let noticed = small_run(ScalingPolicy::Nightshift, false);
        // Two hours: one evaluation per 15 s HPA sync, and with notices one per 5 s pass more.
        assert_eq!(plain.result.demand_calls, 2 * 3600 / 15);
        assert_eq!(noticed.result.demand_calls, 2 * 3600 / 15 + 2 * 3600 / 5);
        assert_eq!(plain.result.notices, 0);
    }

    #[test]
    fn runs_are_deterministic() {
        let a = small_run(ScalingPolicy::Nightshift, false);
        let b = small_run(ScalingPolicy::Nightshift, false);
        assert_eq!(
            serde_json::to_string(&a.result).expect("json"),
            serde_json::to_string(&b.result).expect("json")
        );
    }

    #[test]
    fn static_peak_lends_nothing_and_serves_everything() {
        let out = small_run(ScalingPolicy::StaticPeak, false);
        assert_eq!(out.result.lent_gpu_hours, 0.0);
        assert_eq!(out.result.preemptions_per_lent_gpu_day, None);
        assert_eq!(out.result.minutes_over_slo, 0);
        assert_eq!(out.result.unserved, 0);
        assert!(out.result.requests > 20_000, "{}", out.result.requests);
    }

    #[test]
    fn histogram_quantiles_have_millisecond_resolution() {
        let mut h = LatencyHistogram::default();
        for _ in 0..90 {
            h.record(0.0);
        }
        for i in 0..10 {
            h.record(0.5 + f64::from(i) * 0.1);
        }
        assert_eq!(h.quantile(0.5), 0.0);
        assert!(
            (h.quantile(0.95) - 0.901).abs() < 1e-9,
            "{}",
            h.quantile(0.95)
        );
        assert!(
            (h.quantile(0.99) - 1.301).abs() < 1e-9,
            "{}",
            h.quantile(0.99)
        );
    }

    #[test]
    fn a_minute_misses_the_slo_on_its_p99_or_on_a_stuck_queue() {
        let mut r = Recorder::new(1.0);
        for _ in 0..99 {
            r.started(0.0, 0.0);
        }
        r.started(0.0, 5.0);
        assert!(
            r.close_minute(0.0),
            "1 slow in 100: p99 is the 99th value, 0"
        );
        for _ in 0..98 {
            r.started(60.0, 0.0);
        }
        r.started(60.0, 2.0);
        r.started(60.0, 2.0);
        assert!(!r.close_minute(0.0));
        assert!(
            !r.close_minute(3.0),
            "nothing started, but a request waits 3 s"
        );
        assert_eq!(r.minutes_over, 2);
    }

    #[test]
    fn totals_sum_gauges_and_rate_the_token_counter() {
        let mut h = VecDeque::new();
        for t in 0..=60 {
            h.push_back(Sample {
                t: f64::from(t),
                pods: 2,
                waiting: 3.0,
                running: 40.0,
                kv_cache: 0.9,
                generated_total: 500.0 * f64::from(t),
                prompt_total: 2000.0 * f64::from(t),
                ..Sample::default()
            });
        }
        let totals = totals_at(&h, 60.0, 30.0);
        assert_eq!(totals.pods, 2);
        assert_eq!(totals.signals.waiting, Some(3.0));
        assert_eq!(totals.signals.generation_tokens, Some(500.0));
        assert_eq!(totals.signals.prompt_tokens, Some(2000.0));
        assert_eq!(sample_at(&h, scrape_time(59.0, 15.0)).t, 45.0);
        let empty = VecDeque::from([Sample::default()]);
        assert_eq!(totals_at(&empty, 0.0, 30.0), Totals::default());
    }
}
