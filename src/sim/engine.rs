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
    config::{MetricSource, Scenario},
    fleet::{self, Observer, Perf, Queued, Replica},
    policy::{self, Hpa, ScalingPolicy},
    pool::{Placement, Pool},
    slo,
    trace::{Arrivals, Envelope, Trace},
};
use crate::core::capacity::{CapacityConfig, LearnedCapacity};
use crate::core::demand::{self, Decision, PerSignal, Targets, Totals};
use crate::core::forecast::{DailyShape, ForecastConfig, with_forecast};
use crate::core::notice::{NOTICE_INTERVAL, NoticePolicy, Watch};

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

/// Collects per-request figures and per-minute SLO compliance.
struct Recorder {
    waits: LatencyHistogram,
    ttfts: LatencyHistogram,
    minute_waits: Vec<f32>,
    slo: f64,
    minutes: u64,
    minutes_over: u64,
}

impl Observer for Recorder {
    fn started(&mut self, _at: f64, wait: f64) {
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

/// Runs one policy through the scenario. `record_decisions` keeps every (totals, decision)
/// pair the nightshift policy computed, for verification.
pub fn run_policy(
    policy: ScalingPolicy,
    sc: &Scenario,
    trace: &Trace,
    envelope: &Envelope,
    record_decisions: bool,
) -> RunOutcome {
    let run = PolicyRun::new(policy, sc, trace, envelope, record_decisions, &[]);
    drive(run, u64::MAX).unwrap_or_else(|run| run.finish())
}

/// Replays a schedule of replicas, one count per minute (the last one on past its end), through
/// the scenario: the honest ceiling's held replicas ([`super::ceiling`]), as
/// [`ScalingPolicy::CeilingReplay`].
pub fn run_schedule(
    replicas: &[u32],
    sc: &Scenario,
    trace: &Trace,
    envelope: &Envelope,
) -> RunOutcome {
    let run = PolicyRun::new(
        ScalingPolicy::CeilingReplay,
        sc,
        trace,
        envelope,
        false,
        replicas,
    );
    drive(run, u64::MAX).unwrap_or_else(|run| run.finish())
}

/// Runs one policy through the scenario unless more than `most_over` of its minutes miss the
/// SLO: `None` as soon as one more does (the rest of the run is not simulated).
pub fn run_within(
    policy: ScalingPolicy,
    sc: &Scenario,
    trace: &Trace,
    envelope: &Envelope,
    most_over: u64,
) -> Option<RunOutcome> {
    let run = PolicyRun::new(policy, sc, trace, envelope, false, &[]);
    drive(run, most_over).ok()
}

/// Steps a run to its end, or until more than `most_over` minutes missed the SLO (`Err`: the
/// run as far as it went).
fn drive(mut run: PolicyRun<'_>, most_over: u64) -> Result<RunOutcome, Box<PolicyRun<'_>>> {
    let started = std::time::Instant::now();
    let policy = run.policy;
    for k in 0..run.steps {
        run.step(k);
        if run.rec.minutes_over > most_over {
            tracing::debug!(
                policy = policy.label(),
                at_s = (k + 1) as f64 * run.dt,
                elapsed_s = started.elapsed().as_secs_f64(),
                "policy run stopped: too many minutes over the SLO"
            );
            return Err(Box::new(run));
        }
    }
    let learned = run.capacity.as_ref().and_then(LearnedCapacity::per_replica);
    let outcome = run.finish();
    tracing::debug!(
        policy = policy.label(),
        learned_prompt_per_replica = learned.map(|t| t.prompt),
        learned_generated_per_replica = learned.map(|t| t.generated),
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
    /// Tokens (context and generated) of the requests that arrived in it.
    tokens: f64,
}

/// One policy's run in progress: the cluster, the autoscaler and the figures collected so far.
/// [`PolicyRun::step`] advances it by one control step.
struct PolicyRun<'a> {
    policy: ScalingPolicy,
    sc: &'a Scenario,
    perf: Perf,
    /// GPUs per inference replica.
    gpr: u32,
    /// Control step (s).
    dt: f64,
    end: f64,
    steps: u64,
    steps_per_minute: f64,
    targets: demand::Targets,
    /// GPUs kept free of research (nightshift only).
    headroom: u32,
    record_decisions: bool,
    /// Replicas per minute of a schedule-following run ([`ScalingPolicy::CeilingReplay`]).
    schedule: &'a [u32],

    arrivals: Peekable<Arrivals<'a>>,
    queue: VecDeque<Queued>,
    pool: Pool,
    pool_gpus: u32,
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

    /// Reclaim notices (the policies with notices on): the policy and the service's notice
    /// state, and when the pool controller next decides them.
    notice: Option<(NoticePolicy, Watch)>,
    next_notice: f64,
    /// The trigger's learned capacity (nightshift with `learn_capacity`) and daily forecast
    /// (the forecast policies): the live scaler's code.
    capacity: Option<LearnedCapacity>,
    shape: Option<DailyShape>,

    result: RunSummary,
    decisions: Vec<(Totals, Targets, Decision)>,
    timeline: Vec<MinutePoint>,
    minute: OpenMinute,
    ideal_idle_gpu_hours: f64,
    inference_gpu_s: f64,
}

impl<'a> PolicyRun<'a> {
    fn new(
        policy: ScalingPolicy,
        sc: &'a Scenario,
        trace: &'a Trace,
        envelope: &'a Envelope,
        record_decisions: bool,
        schedule: &'a [u32],
    ) -> PolicyRun<'a> {
        let dt = sc.run.step_s;
        let end = sc.run.days * 86_400.0;
        let ns = &sc.policies.nightshift;
        let mut pool = Pool::new(sc.pool.nodes, sc.pool.gpus_per_node, sc.research.clone());
        let pool_gpus = pool.total_gpus();
        let desired =
            fixed_replicas(policy, sc, schedule, 0.0).unwrap_or(sc.autoscaling.initial_replicas);
        let pods = warm_start(&mut pool, desired, sc.model.gpus_per_replica);
        let history_len = history_len(sc);
        PolicyRun {
            policy,
            sc,
            perf: Perf::new(&sc.model),
            gpr: sc.model.gpus_per_replica,
            dt,
            end,
            steps: (end / dt).ceil() as u64,
            steps_per_minute: (60.0 / dt).max(1.0),
            targets: ns.targets(),
            headroom: if policy.is_nightshift() {
                ns.headroom_gpus
            } else {
                0
            },
            record_decisions,
            schedule,
            arrivals: Arrivals::new(trace, envelope, sc.run.seed).peekable(),
            queue: VecDeque::new(),
            pool,
            pool_gpus,
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
            notice: policy.notices().then(|| {
                (
                    NoticePolicy {
                        window_s: ns.notice_window_s,
                        margin: ns.notice_margin,
                        hysteresis: ns.notice_hysteresis,
                    },
                    Watch::default(),
                )
            }),
            next_notice: NOTICE_INTERVAL.as_secs_f64(),
            capacity: (policy.is_nightshift() && ns.learn_capacity)
                .then(|| LearnedCapacity::new(CapacityConfig::default())),
            shape: policy
                .forecasts()
                .then(|| DailyShape::new(ForecastConfig::default())),
            result: RunSummary::new(policy),
            decisions: Vec::new(),
            timeline: Vec::with_capacity((end / 60.0).ceil() as usize),
            minute: OpenMinute::default(),
            ideal_idle_gpu_hours: 0.0,
            inference_gpu_s: 0.0,
        }
    }

    /// Control step `k`, which ends at `(k + 1) × dt`.
    fn step(&mut self, k: u64) {
        let t1 = (k + 1) as f64 * self.dt;
        self.admit_arrivals(t1);
        self.serve(t1);
        self.retire_and_start_pods(t1);
        self.sample_metrics(t1);
        let current = self.non_draining_pods();
        self.decide_replicas(t1, current);
        self.give_notices(t1);
        self.converge(t1, current);
        self.schedule_pending(t1);
        // Research takes what is left.
        self.pool.tick_research(t1, self.dt, self.headroom);
        self.account(t1, k + 1 == self.steps);
    }

    /// Arrivals of this step join the router's queue.
    fn admit_arrivals(&mut self, t1: f64) {
        while let Some(a) = self.arrivals.next_if(|a| a.at < t1) {
            self.result.requests += 1;
            self.minute.tokens += f64::from(a.context) + f64::from(a.generated);
            let q = Queued {
                arrival: a.at,
                context: a.context,
                generated: a.generated,
            };
            if q.footprint() > self.perf.kv_capacity {
                self.result.rejected += 1;
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
    fn retire_and_start_pods(&mut self, t1: f64) {
        let mut i = 0;
        while i < self.pods.len() {
            match self.pods[i].phase {
                PodPhase::Draining { node } if self.pods[i].replica.is_idle() => {
                    self.pool.release_inference(node, self.gpr);
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

    /// Policy decision: a fixed schedule, or the HPA on the policy's metric.
    fn decide_replicas(&mut self, t1: f64, current: u32) {
        let before = self.desired;
        match fixed_replicas(self.policy, self.sc, self.schedule, t1) {
            Some(r) => self.desired = r,
            None => self.autoscale(t1, current),
        }
        if self.desired != before {
            self.result.scale_events += 1;
        }
    }

    /// Reclaim notices (policies with notices on), decided as the pool controller decides them:
    /// every [`NOTICE_INTERVAL`] it evaluates the service's trigger (the scaler's own
    /// evaluation, which feeds the learned capacity and the forecast as KEDA's calls do) against
    /// the replicas the Deployment is asked for, warns the research the next replicas would
    /// displace and withdraws warnings no longer due, with the live decision code. A failed
    /// evaluation keeps the notices given.
    fn give_notices(&mut self, t1: f64) {
        if self.notice.is_none() || t1 < self.next_notice {
            return;
        }
        self.next_notice += NOTICE_INTERVAL.as_secs_f64();
        let demand = self.evaluate(t1).map(|(replicas, _)| replicas);
        let Some((policy, watch)) = self.notice.as_mut() else {
            return;
        };
        let extra = match demand {
            Some(replicas) => policy.update(watch, t1, replicas, self.desired),
            None => watch.covered().saturating_sub(self.desired),
        };
        self.pool.notice(t1, extra, self.gpr);
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
        self.result.demand_calls += 1;
        let targets = self.learned_targets(&totals);
        match policy::nightshift_metric(&totals, &targets) {
            Ok((decision, value)) => {
                let answer = match self.shape.as_mut() {
                    Some(shape) => {
                        shape.observe(t1, decision.replicas);
                        let expected = shape.expected(t1, ns.forecast_lead_s);
                        let (replicas, decided) = with_forecast(decision.replicas, expected);
                        if decided {
                            self.result.forecast_decisions += 1;
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
                self.result.demand_errors += 1;
                None
            }
        }
    }

    /// The trigger's targets for this reading: learned token targets (when the policy learns
    /// them and a replica has been seen saturated) fill the token signals the scenario does not
    /// set by hand.
    fn learned_targets(&mut self, totals: &Totals) -> Targets {
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
        if let Some(learned) = capacity.targets(self.sc.policies.nightshift.utilization) {
            if targets.prompt_tokens.is_none() && learned.prompt > 0.0 {
                targets.prompt_tokens = Some(learned.prompt);
            }
            if targets.generation_tokens.is_none() && learned.generated > 0.0 {
                targets.generation_tokens = Some(learned.generated);
            }
        }
        targets
    }

    /// The Deployment converges to the desired count.
    fn converge(&mut self, t1: f64, current: u32) {
        if current < self.desired {
            for _ in current..self.desired {
                self.pods.push(ReplicaPod {
                    phase: PodPhase::Pending { nominated: None },
                    replica: Replica::new(t1),
                });
            }
        } else if current > self.desired {
            self.scale_down(current - self.desired);
        }
    }

    /// Removes `excess` pods in ReplicaSet order: unscheduled pods, then not-ready ones, then
    /// the newest (which drain: they finish what they run, then leave).
    fn scale_down(&mut self, mut excess: u32) {
        for pass in 0..3 {
            let mut i = self.pods.len();
            while excess > 0 && i > 0 {
                i -= 1;
                let remove = match (pass, self.pods[i].phase) {
                    (0, PodPhase::Pending { nominated }) => {
                        if let Some(n) = nominated {
                            self.pool.unclaim(n, self.gpr);
                        }
                        true
                    }
                    (1, PodPhase::Starting { node, .. }) => {
                        self.pool.release_inference(node, self.gpr);
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
    fn schedule_pending(&mut self, t1: f64) {
        let startup_s = self.sc.model.startup_s;
        for p in self.pods.iter_mut() {
            if let PodPhase::Pending { nominated } = p.phase {
                p.phase = match self.pool.place_inference(self.gpr, nominated, t1) {
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

    /// Adds this step's GPU use to the totals and the open minute; closes the minute when it is
    /// full or the run ends.
    fn account(&mut self, t1: f64, last_step: bool) {
        let inference = f64::from(self.pool.inference_gpus());
        self.inference_gpu_s += inference * self.dt;
        self.minute.point.inference_gpus += inference as f32;
        self.minute.point.research_gpus += self.pool.research_gpus() as f32;
        self.minute.steps += 1.0;
        if self.minute.steps >= self.steps_per_minute || last_step {
            self.close_minute(t1);
        }
    }

    /// Judges the minute against the SLO, compares it with an oracle's GPU use and adds it to
    /// the timeline.
    fn close_minute(&mut self, t1: f64) {
        let auto = &self.sc.autoscaling;
        let OpenMinute {
            mut point,
            steps,
            tokens,
        } = std::mem::take(&mut self.minute);
        let oldest = self
            .queue
            .front()
            .map_or(0.0, |q| (t1 - q.arrival).max(0.0));
        point.slo_ok = self.rec.close_minute(oldest);
        point.inference_gpus /= steps as f32;
        point.research_gpus /= steps as f32;
        let ideal_replicas = (tokens * self.perf.compute_s_per_token / (steps * self.dt))
            .ceil()
            .clamp(f64::from(auto.min_replicas), f64::from(auto.max_replicas));
        let ideal_gpus = ideal_replicas * f64::from(self.gpr);
        point.ideal_inference_gpus = ideal_gpus as f32;
        self.ideal_idle_gpu_hours +=
            (f64::from(self.pool_gpus) - ideal_gpus).max(0.0) * steps * self.dt / 3600.0;
        self.timeline.push(point);
    }

    /// The run's figures once every step is done.
    fn finish(self) -> RunOutcome {
        let PolicyRun {
            mut result,
            pool,
            rec,
            queue,
            ideal_idle_gpu_hours,
            inference_gpu_s,
            pool_gpus,
            end,
            timeline,
            decisions,
            ..
        } = self;
        let stats = pool.stats;
        result.lent_gpu_hours = stats.lent_gpu_s / 3600.0;
        result.lost_gpu_hours = stats.lost_gpu_s / 3600.0;
        result.useful_gpu_hours = result.lent_gpu_hours - result.lost_gpu_hours;
        result.harvest_share = if ideal_idle_gpu_hours > 0.0 {
            result.lent_gpu_hours / ideal_idle_gpu_hours
        } else {
            0.0
        };
        result.preemptions = stats.preemptions;
        result.completed_jobs = stats.completed_jobs;
        result.notices = stats.notices;
        result.notices_withdrawn = stats.notices_withdrawn;
        result.notices_completed = stats.notices_completed;
        result.preempted_after_checkpoint = stats.preempted_after_checkpoint;
        result.preempted_during_checkpoint = stats.preempted_during_checkpoint;
        result.preempted_in_place_of_warned = stats.preempted_in_place_of_warned;
        result.preempted_without_notice = stats.preemptions
            - stats.preempted_after_checkpoint
            - stats.preempted_during_checkpoint;
        let mut leads = stats.lead_times_s;
        leads.sort_by(f64::total_cmp);
        result.notice_lead_p50_s = quantile(&leads, 0.5);
        result.notice_lead_p99_s = quantile(&leads, 0.99);
        result.notice_checkpoint_gpu_hours = stats.notice_checkpoint_gpu_s / 3600.0;
        result.inference_gpu_hours = inference_gpu_s / 3600.0;
        result.queue_wait_p50_s = rec.waits.quantile(0.5);
        result.queue_wait_p99_s = rec.waits.quantile(0.99);
        result.ttft_p50_s = rec.ttfts.quantile(0.5);
        result.ttft_p99_s = rec.ttfts.quantile(0.99);
        result.minutes = rec.minutes;
        result.minutes_over_slo = rec.minutes_over;
        result.minutes_within_slo_share = if rec.minutes > 0 {
            1.0 - rec.minutes_over as f64 / rec.minutes as f64
        } else {
            1.0
        };
        result.unserved = queue.len() as u64;
        RunOutcome {
            result,
            timeline,
            ideal_idle_gpu_hours,
            pool_gpu_hours: f64::from(pool_gpus) * end / 3600.0,
            decisions,
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

/// Replicas a fixed-schedule policy runs at `t` (`None`: the policy autoscales). `schedule` is
/// a schedule-following run's replicas per minute.
fn fixed_replicas(policy: ScalingPolicy, sc: &Scenario, schedule: &[u32], t: f64) -> Option<u32> {
    match policy {
        ScalingPolicy::StaticPeak => Some(sc.policies.static_peak.replicas),
        ScalingPolicy::NightWindow | ScalingPolicy::NightWindowHindsight => {
            Some(policy::night_window_replicas(&sc.policies.night_window, t))
        }
        ScalingPolicy::CeilingReplay => {
            let minute = (t.max(0.0) / 60.0).floor() as usize;
            let held = schedule.get(minute).or(schedule.last()).copied();
            Some(held.unwrap_or(sc.autoscaling.max_replicas))
        }
        ScalingPolicy::KedaPrometheus
        | ScalingPolicy::Nightshift
        | ScalingPolicy::NightshiftWithoutNotices
        | ScalingPolicy::NightshiftForecast => None,
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

    /// A short scenario over a small synthetic trace (steady 4 req/s of 1000 + 100 tokens).
    fn small_run(kind: ScalingPolicy, record: bool) -> RunOutcome {
        let mut body = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
        for i in 0..240 {
            body.push_str(&format!(
                "2023-11-16 18:{:02}:{:02}.{:03},1000,100\n",
                i / 240,
                (i / 4) % 60,
                (i % 4) * 250
            ));
        }
        let trace = Trace::parse(&body).expect("valid trace");
        let mut sc = Scenario::default();
        sc.run.days = 2.0 / 24.0;
        let envelope = Envelope::new(&sc.envelope.hourly).expect("valid envelope");
        run_policy(kind, &sc, &trace, &envelope, record)
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
