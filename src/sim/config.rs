//! The simulated scenario: fleet, autoscaling, GPU pool, research jobs, SLO and the policies to
//! compare. Every default cites where its value comes from; every field can be overridden from a
//! TOML file (`nightshift simulate --config scenario.toml`; `--print-config` shows them all).

use serde::{Deserialize, Serialize};

use crate::core::demand::Targets;

/// Everything a run depends on besides the trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    pub run: RunConfig,
    pub envelope: EnvelopeConfig,
    pub mix: MixConfig,
    pub model: ModelConfig,
    pub autoscaling: AutoscalingConfig,
    pub prometheus: PrometheusConfig,
    pub pool: PoolConfig,
    pub research: ResearchConfig,
    pub slo: SloConfig,
    pub policies: PoliciesConfig,
    /// Inference services sharing the pool (none: one service, made of the sections above).
    /// Each keeps the scenario's model, autoscaling, SLO and policies, with a trace, a day and a
    /// token mix of its own ([`Scenario::service_scenarios`]).
    pub services: Vec<ServiceConfig>,
}

/// One inference service of a pool shared by several: what sets it apart from the others.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceConfig {
    /// Its name in reports (unique in the scenario).
    pub name: String,
    /// Its request trace, relative to the scenario file (none: the run's `--trace`).
    pub trace: Option<std::path::PathBuf>,
    /// Where its replay starts in its trace (another seed than a service sharing the trace
    /// keeps their bursts apart).
    pub seed: u64,
    /// Its day and week, in the pool's clock (a service of another time zone peaks at other
    /// hours).
    pub envelope: EnvelopeConfig,
    pub mix: MixConfig,
    /// Replicas it runs at peak: static peak's size, the night window's day size, and its
    /// ScaledObject's `maxReplicaCount`. The night window shrinks it in proportion:
    /// ⌈`night_window.night_replicas` × `peak_replicas` / `night_window.day_replicas`⌉.
    pub peak_replicas: u32,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            name: String::new(),
            trace: None,
            seed: RunConfig::default().seed,
            envelope: EnvelopeConfig::default(),
            mix: MixConfig::default(),
            peak_replicas: StaticPeakConfig::default().replicas,
        }
    }
}

/// Length, seed and time step of the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Simulated days, starting at midnight.
    pub days: f64,
    /// Chooses where in the trace the replay starts.
    pub seed: u64,
    /// Control step in seconds. Requests are timed exactly within a step; autoscaling, pool and
    /// research decisions happen at step boundaries. 1 s is finer than any of them react
    /// (HPA sync 15 s, scrape 15 s, start-up minutes).
    pub step_s: f64,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            days: 7.0,
            seed: 1,
            step_s: 1.0,
        }
    }
}

/// The shape of traffic over a day and a week, as multipliers of the trace's own arrival rate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvelopeConfig {
    /// Multiplier at each hour h:00 (linear in between), 24 values.
    pub hourly: Vec<f64>,
    /// Multiplier of each day of the week, day 0 of the run first (7 values; all 1 by default:
    /// every day alike). A weekend at half the traffic is `[1, 1, 1, 1, 1, 0.5, 0.5]`.
    pub weekly: Vec<f64>,
}

/// The token mix: every request's prompt and output lengths scaled from the trace's. The
/// conversation trace is decode-heavy (1,155 prompt and 211 generated tokens on average); a
/// code-completion-like, prefill-heavy service is e.g. `context = 2.0, generated = 0.12`
/// (≈ 2,300 and 25).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MixConfig {
    pub context: f64,
    pub generated: f64,
}

impl Default for MixConfig {
    fn default() -> Self {
        MixConfig {
            context: 1.0,
            generated: 1.0,
        }
    }
}

impl Default for EnvelopeConfig {
    fn default() -> Self {
        // Shaped like the deployment that motivates nightshift: busy daytime, low 20:00–08:00,
        // when about 52 of 64 GPUs sat idle (≈ 3 of 16 four-GPU replicas busy). At 1× the Azure
        // conversation trace (5.4 req/s, ≈ 7.4k tokens/s) this fleet model needs 2 replicas on
        // average, so night = 1×. The daytime plateau of 4× needs ≈ 7 replicas on average; its
        // 10-second bursts (up to 2.6× the hour's mean in the trace) fill the 16-replica fleet
        // a team provisioning for peak would run.
        EnvelopeConfig {
            hourly: vec![
                1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, // 00–07
                1.0, 2.5, 3.5, 4.0, 4.0, 4.0, 4.0, 4.0, // 08–15
                4.0, 3.5, 2.5, 1.5, 1.0, 1.0, 1.0, 1.0, // 16–23
            ],
            weekly: vec![1.0; 7],
        }
    }
}

/// One vLLM replica serving Llama-2-70B (bf16) with tensor parallelism 4 on 4× A100-SXM4-80GB.
///
/// Iteration model (continuous batching with chunked prefill): an engine step that decodes `n`
/// sequences holding `kv` tokens of KV cache and prefills `p` prompt tokens takes
/// `max(decode_step_s + kv × kv_read_s_per_token, (n + p) / prefill_tokens_per_s)`: the larger
/// of reading the weights and the KV cache from HBM and the matrix arithmetic. `n + p` is capped
/// by `max_num_batched_tokens`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Model and hardware, for reports.
    pub name: String,
    /// GPUs per replica (tensor parallelism); the motivating deployment used 4.
    pub gpus_per_replica: u32,
    /// Tokens per second when compute-bound: 4 × 312 TFLOPS (A100 bf16 dense, NVIDIA A100
    /// datasheet) × 50 % model-FLOPs utilisation / (2 × 69 × 10⁹ FLOPs per token, Llama-2-70B).
    pub prefill_tokens_per_s: f64,
    /// Seconds per decode step to read the weights: 138 GB / 4 GPUs / (2.039 TB/s HBM2e, NVIDIA
    /// A100-80GB SXM datasheet × 55 % bandwidth utilisation, the figure Databricks' "LLM
    /// Inference Performance Engineering: Best Practices" (2023) reports at 4-way tensor
    /// parallelism).
    pub decode_step_s: f64,
    /// Seconds per decode step per KV token: 327,680 bytes per token (2 × 80 layers × 8 KV
    /// heads × 128 dims × 2 bytes, Llama-2-70B config.json) / 4 GPUs / (2.039 TB/s × 55 %).
    pub kv_read_s_per_token: f64,
    /// KV-cache capacity in tokens: 4 × 80 GB × 0.9 (vLLM's default `gpu_memory_utilization`)
    /// − 138 GB of weights − ≈ 19 GB activations and CUDA graphs = ≈ 131 GB / 327,680 bytes.
    pub kv_capacity_tokens: f64,
    /// vLLM's `max_num_seqs` default for the OpenAI server on A100 (vLLM engine arguments:
    /// 256 outside H100/H200-class GPUs).
    pub max_num_seqs: u32,
    /// vLLM's `max_num_batched_tokens` default for the OpenAI server on A100 (vLLM engine
    /// arguments: 2048 outside H100/H200-class GPUs), the chunked-prefill token budget.
    pub max_num_batched_tokens: u32,
    /// Seconds from a pod being bound to a node to serving: image pull (30–60 s when not
    /// cached), 140 GB of weights from node-local NVMe (30–60 s), engine warm-up and CUDA-graph
    /// capture (kunwar.page "The model cold-start problem and pre-cached weights"; Spheron's
    /// KEDA/Knative guide reports 3–10 min). 180 s assumes weights cached on the node.
    pub startup_s: f64,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            name: "Llama-2-70B bf16, TP=4 on 4x A100-SXM4-80GB, vLLM".to_owned(),
            gpus_per_replica: 4,
            prefill_tokens_per_s: 4_500.0,
            decode_step_s: 0.031,
            kv_read_s_per_token: 7.3e-8,
            kv_capacity_tokens: 400_000.0,
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            startup_s: 180.0,
        }
    }
}

/// KEDA and HorizontalPodAutoscaler behaviour, shared by the autoscaled policies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutoscalingConfig {
    /// ScaledObject `minReplicaCount`: 1, since scaling a model to zero needs a router metric
    /// (vLLM production-stack notes).
    pub min_replicas: u32,
    /// ScaledObject `maxReplicaCount`: the 16 replicas (64 GPUs) provisioned for peak.
    pub max_replicas: u32,
    /// Replicas running at the start (warm).
    pub initial_replicas: u32,
    /// HPA sync period (kube-controller-manager `--horizontal-pod-autoscaler-sync-period`, 15 s).
    pub hpa_sync_s: f64,
    /// HPA tolerance (`--horizontal-pod-autoscaler-tolerance`, 0.1).
    pub tolerance: f64,
    /// HPA `behavior.scaleUp.stabilizationWindowSeconds` default (0).
    pub scale_up_window_s: f64,
    /// HPA `behavior.scaleDown.stabilizationWindowSeconds` default (300); vLLM production-stack
    /// uses the same.
    pub scale_down_window_s: f64,
    /// HPA `behavior.scaleUp.policies` and `selectPolicy`; the default adds up to 4 pods or
    /// 100 % per 15 s, whichever is more.
    pub scale_up_policies: Vec<HpaPolicy>,
    pub scale_up_select: HpaSelect,
    /// HPA `behavior.scaleDown.policies` and `selectPolicy`; the default removes up to 100 %
    /// per 15 s.
    pub scale_down_policies: Vec<HpaPolicy>,
    pub scale_down_select: HpaSelect,
    /// KEDA `pollingInterval` (30 s default). With `use_cached_metrics` the HPA reads the value
    /// KEDA polled last; otherwise (KEDA's default) each HPA sync queries the scaler.
    pub keda_polling_s: f64,
    pub use_cached_metrics: bool,
}

impl Default for AutoscalingConfig {
    fn default() -> Self {
        AutoscalingConfig {
            min_replicas: 1,
            max_replicas: 16,
            initial_replicas: 4,
            hpa_sync_s: 15.0,
            tolerance: 0.1,
            scale_up_window_s: 0.0,
            scale_down_window_s: 300.0,
            scale_up_policies: vec![
                HpaPolicy {
                    kind: HpaPolicyKind::Pods,
                    value: 4.0,
                    period_s: 15.0,
                },
                HpaPolicy {
                    kind: HpaPolicyKind::Percent,
                    value: 100.0,
                    period_s: 15.0,
                },
            ],
            scale_up_select: HpaSelect::Max,
            scale_down_policies: vec![HpaPolicy {
                kind: HpaPolicyKind::Percent,
                value: 100.0,
                period_s: 15.0,
            }],
            scale_down_select: HpaSelect::Max,
            keda_polling_s: 30.0,
            use_cached_metrics: false,
        }
    }
}

/// One HPA scaling policy (`behavior.scaleUp.policies[]`, `behavior.scaleDown.policies[]`): at
/// most `value` pods, or `value` per cent of the replicas at the period's start, added (or
/// removed) within any `period_s`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HpaPolicy {
    pub kind: HpaPolicyKind,
    pub value: f64,
    pub period_s: f64,
}

/// `type` of an HPA scaling policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HpaPolicyKind {
    Pods,
    Percent,
}

/// `selectPolicy`: `max` takes the policy allowing the largest change, `min` the smallest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HpaSelect {
    Max,
    Min,
}

/// Prometheus, for the policies that read metrics through it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrometheusConfig {
    /// Scrape interval: 15 s, the low end of the 15–30 s lag Prometheus-based scaling paths show
    /// (keda-gpu-scaler's measurements).
    pub scrape_interval_s: f64,
    /// Window of `rate()` for counters (`[1m]`, the usual dashboard window).
    pub rate_window_s: f64,
}

impl Default for PrometheusConfig {
    fn default() -> Self {
        PrometheusConfig {
            scrape_interval_s: 15.0,
            rate_window_s: 60.0,
        }
    }
}

/// The GPU pool shared by inference and research.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// 8 nodes × 8 GPUs = 64 GPUs, the motivating deployment's peak fleet (DGX/HGX A100 nodes
    /// carry 8 GPUs).
    pub nodes: u32,
    pub gpus_per_node: u32,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            nodes: 8,
            gpus_per_node: 8,
        }
    }
}

/// The research backlog: always more jobs waiting than GPUs (the motivating team ran ~85 jobs,
/// ~95,000 GPU-hours in three months).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResearchConfig {
    /// GPUs per job: one 4-GPU step (SFT/evaluation scale), the replica's size.
    pub gpus_per_job: u32,
    /// Work per job in hours of its GPUs.
    pub job_hours: f64,
    /// Seconds between checkpoints; work since the last one is lost on preemption. 30 min is a
    /// common trainer setting (e.g. `save_steps` sized to ~30 min); set yours.
    pub checkpoint_interval_s: f64,
    /// `terminationGracePeriodSeconds` of research pods (Kubernetes default 30 s); the GPUs stay
    /// held, doing no saved work, until it ends.
    pub grace_period_s: f64,
    /// Seconds a job needs to write a checkpoint when it gets a reclaim notice; it does no other
    /// work meanwhile, and a preemption before it ends loses the checkpoint (unless it ends
    /// within the grace period).
    pub notice_checkpoint_s: f64,
    /// The trainer's behaviour under a reclaim notice: it writes a checkpoint whenever this many
    /// seconds of work are unsaved (at once if that many already are when the notice comes), for
    /// as long as the notice lasts.
    pub notice_checkpoint_every_s: f64,
    /// Most checkpoints the trainer writes under one notice (0: it never checkpoints on a
    /// notice, only exits at once on SIGTERM).
    pub notice_checkpoints_max: u32,
    /// The PriorityClasses research jobs run in, each with the share of jobs it gets. The
    /// scheduler preempts the lowest class first, whatever the start times.
    pub classes: Vec<ResearchClass>,
}

/// A research PriorityClass and the share of jobs in it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResearchClass {
    pub name: String,
    /// The class's `value` (below the inference class's).
    pub priority: i32,
    /// Share of jobs (relative to the other classes' shares).
    pub share: f64,
}

impl ResearchConfig {
    /// The priority of the `k`-th job: classes are dealt in proportion to their shares, spread
    /// evenly over the job sequence (a golden-ratio sequence: no run of one class), the same in
    /// every run.
    pub fn class_of(&self, k: u64) -> i32 {
        let total: f64 = self.classes.iter().map(|c| c.share).sum();
        // The fractional part of k × φ spreads evenly over [0, 1) for any run of k.
        let x = ((k as f64 + 1.0) * 0.618_033_988_749_895).fract() * total;
        let mut upto = 0.0;
        for c in &self.classes {
            upto += c.share;
            if x < upto {
                return c.priority;
            }
        }
        self.classes.last().map_or(0, |c| c.priority)
    }
}

impl Default for ResearchConfig {
    fn default() -> Self {
        ResearchConfig {
            gpus_per_job: 4,
            job_hours: 6.0,
            checkpoint_interval_s: 1800.0,
            grace_period_s: 30.0,
            // Two minutes: a sharded checkpoint of a mid-size model to fast storage; more than
            // the grace period, which is why a notice helps at all.
            notice_checkpoint_s: 120.0,
            // 20 minutes: most notices are withdrawn, so a 2-minute checkpoint can pay only for
            // a lot of unsaved work. 300-900 s lost more in the sweep; no notice checkpoint at
            // all lost less (98.3 against 111.5 GPU-h), but this models a trainer that does act
            // on notices, to show their cost (docs/simulator.md, "Reclaim notice").
            notice_checkpoint_every_s: 1200.0,
            // No limit: the trainer keeps its unsaved work bounded for as long as the notice
            // lasts (one per notice lost about the same in the sweep).
            notice_checkpoints_max: u32::MAX,
            // The base manifests' research class, and a lower tier below it for a quarter of
            // the jobs (sweeps a team marks as the first to give way): with two classes the
            // scheduler's choice of victims is not only by start time.
            classes: vec![
                ResearchClass {
                    name: "nightshift-research".into(),
                    priority: -1000,
                    share: 0.75,
                },
                ResearchClass {
                    name: "research-scavenger".into(),
                    priority: -2000,
                    share: 0.25,
                },
            ],
        }
    }
}

/// The inference service-level objective.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SloConfig {
    /// A minute meets the SLO when the p99 queue wait of requests started in it is at most this.
    pub queue_wait_p99_s: f64,
}

impl Default for SloConfig {
    fn default() -> Self {
        SloConfig {
            queue_wait_p99_s: 1.0,
        }
    }
}

/// The policies compared, each through the same simulated cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoliciesConfig {
    pub static_peak: StaticPeakConfig,
    pub night_window: NightWindowConfig,
    pub keda_prometheus: KedaPrometheusConfig,
    pub nightshift: NightshiftConfig,
}

/// Inference provisioned for peak, always; nothing lent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StaticPeakConfig {
    pub replicas: u32,
}

impl Default for StaticPeakConfig {
    fn default() -> Self {
        StaticPeakConfig { replicas: 16 }
    }
}

/// Inference shrunk to a fixed size during a nightly window; research runs on what is free.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NightWindowConfig {
    /// 20:00–08:00, the motivating team's first approach.
    pub start_hour: u32,
    pub end_hour: u32,
    /// 3 replicas (12 GPUs) at night: 52 of 64 GPUs were lent.
    pub night_replicas: u32,
    pub day_replicas: u32,
}

impl Default for NightWindowConfig {
    fn default() -> Self {
        NightWindowConfig {
            start_hour: 20,
            end_hour: 8,
            night_replicas: 3,
            day_replicas: 16,
        }
    }
}

/// KEDA's Prometheus scaler on `sum(vllm:num_requests_waiting)` (vLLM production-stack's
/// default trigger).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KedaPrometheusConfig {
    /// Trigger `threshold` (production-stack: 5 waiting requests per replica).
    pub threshold: f64,
}

impl Default for KedaPrometheusConfig {
    fn default() -> Self {
        KedaPrometheusConfig { threshold: 5.0 }
    }
}

/// Where nightshift reads vLLM metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricSource {
    /// Scrapes the pods' `/metrics` when KEDA asks: no Prometheus lag.
    Scrape,
    /// Reads them from Prometheus, with its scrape lag.
    Prometheus,
}

/// nightshift's composite demand: per-replica targets, source and spare headroom.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NightshiftConfig {
    /// Per-replica targets of the composite demand (unset = signal not used).
    pub waiting: Option<f64>,
    pub running: Option<f64>,
    pub kv_cache: Option<f64>,
    pub generation_tokens: Option<f64>,
    pub prompt_tokens: Option<f64>,
    /// Learn the token targets from the service itself (the trigger's `capacity: learned`):
    /// prompt and generated tokens/s at `utilization` of what a replica sustained while
    /// requests queued. An explicit token target above wins for its signal.
    pub learn_capacity: bool,
    pub utilization: f64,
    /// The "+ forecast" policy (the trigger's `forecast: daily` with its `forecastLead`):
    /// demand = max(now, the daily shape's demand over the next `forecast_lead_s`).
    pub forecast_lead_s: f64,
    pub source: MetricSource,
    /// Window over which the token counters are turned into rates (the trigger's `rateWindow`).
    pub rate_window_s: f64,
    /// GPUs kept free of research so that a scale-up rarely waits for a preemption (the pool
    /// controller's `--pool-headroom`).
    pub headroom_gpus: u32,
    /// Reclaim notice (the policies with notices on; the pool controller's
    /// `--pool-notice-window`, `--pool-notice-margin`, `--pool-notice-hysteresis`): the window
    /// whose demand peak is watched, how close that peak (replicas) must come to the next
    /// replica for its victims to be warned, and how much further it must fall for the notice
    /// to be withdrawn.
    pub notice_window_s: f64,
    pub notice_margin: f64,
    pub notice_hysteresis: f64,
}

impl NightshiftConfig {
    /// The targets in the live scaler's type.
    pub fn targets(&self) -> Targets {
        Targets {
            waiting: self.waiting,
            running: self.running,
            kv_cache: self.kv_cache,
            generation_tokens: self.generation_tokens,
            prompt_tokens: self.prompt_tokens,
        }
    }
}

impl Default for NightshiftConfig {
    fn default() -> Self {
        use crate::core::{demand, forecast, notice::NoticePolicy};
        // nightshift as shipped, taken from the constants the live code uses (tests pin them
        // to what the scaler parses from a trigger that sets nothing, and to the pool
        // controller's flag defaults): a trigger with no per-model numbers scales on the queue
        // (5 per replica, as in vLLM production-stack) and on token targets learned from the
        // replicas at the default utilization, scraping the pods; `forecast: daily` looks one
        // replica start-up ahead; no headroom (`--pool-headroom`), so a scale-up waits out a
        // 30 s grace period at most; the notice policy is the controller's.
        let notices = NoticePolicy::default();
        NightshiftConfig {
            waiting: Some(demand::LEARNED_WAITING_TARGET),
            running: None,
            kv_cache: None,
            generation_tokens: None,
            prompt_tokens: None,
            learn_capacity: true,
            utilization: demand::DEFAULT_UTILIZATION,
            forecast_lead_s: forecast::DEFAULT_FORECAST_LEAD.as_secs_f64(),
            source: MetricSource::Scrape,
            rate_window_s: demand::DEFAULT_RATE_WINDOW.as_secs_f64(),
            headroom_gpus: 0,
            notice_window_s: notices.window_s,
            notice_margin: notices.margin,
            notice_hysteresis: notices.hysteresis,
        }
    }
}

impl Scenario {
    /// Reads a scenario from TOML; absent fields keep their defaults.
    pub fn from_toml(text: &str) -> Result<Scenario, toml::de::Error> {
        toml::from_str(text)
    }

    /// The scenario as TOML, for `--print-config`.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }

    /// The scenario of each service, with its name: the scenario itself when it names none;
    /// otherwise, per service, the scenario with the service's seed, envelope, mix and size
    /// (static peak, the night window's day and night sizes, `max_replicas`) and no services.
    /// The pool, the research, the SLO and the policies' settings stay the scenario's.
    pub fn service_scenarios(&self) -> Vec<(String, Scenario)> {
        if self.services.is_empty() {
            return vec![(String::new(), self.clone())];
        }
        let shared = Scenario {
            services: Vec::new(),
            ..self.clone()
        };
        self.services
            .iter()
            .map(|s| {
                let mut sc = shared.clone();
                sc.run.seed = s.seed;
                sc.envelope = s.envelope.clone();
                sc.mix = s.mix.clone();
                sc.policies.static_peak.replicas = s.peak_replicas;
                sc.policies.night_window = self.night_window_of(s.peak_replicas);
                sc.autoscaling.max_replicas = s.peak_replicas;
                sc.autoscaling.min_replicas = sc.autoscaling.min_replicas.min(s.peak_replicas);
                sc.autoscaling.initial_replicas = sc
                    .autoscaling
                    .initial_replicas
                    .clamp(sc.autoscaling.min_replicas, s.peak_replicas);
                (s.name.clone(), sc)
            })
            .collect()
    }

    /// The night window of a service of `peak` replicas in a shared pool: the scenario's hours,
    /// its day size `peak`, its night size in proportion to the scenario's (rounded up: a
    /// service shrunk to nothing cannot serve).
    pub fn night_window_of(&self, peak: u32) -> NightWindowConfig {
        let nw = &self.policies.night_window;
        if self.services.is_empty() {
            return nw.clone();
        }
        let day = nw.day_replicas.max(1);
        let night = (u64::from(nw.night_replicas) * u64::from(peak)).div_ceil(u64::from(day));
        NightWindowConfig {
            night_replicas: u32::try_from(night).unwrap_or(peak).min(peak),
            day_replicas: peak,
            ..nw.clone()
        }
    }

    /// Checks values no model can run with.
    pub fn validate(&self) -> Result<(), String> {
        self.validate_services()?;
        if !self.services.is_empty() {
            for (_, sc) in self.service_scenarios() {
                sc.validate_one()?;
            }
        }
        self.validate_one()
    }

    /// Checks the services of a shared pool: named once each, and all at their peak fitting
    /// the pool (or static peak, the yardstick, could not run).
    fn validate_services(&self) -> Result<(), String> {
        let mut names = std::collections::BTreeSet::new();
        for s in &self.services {
            if s.name.is_empty() || !names.insert(s.name.as_str()) {
                return Err(format!(
                    "services: every service needs a name of its own, got {:?}",
                    s.name
                ));
            }
            if s.peak_replicas == 0 {
                return Err(format!("services: {:?} needs peak_replicas ≥ 1", s.name));
            }
        }
        let gpr = self.model.gpus_per_replica;
        let per_node = self.pool.gpus_per_node / gpr.max(1);
        let fits = u64::from(self.pool.nodes) * u64::from(per_node);
        let peak: u64 = self
            .services
            .iter()
            .map(|s| u64::from(s.peak_replicas))
            .sum();
        if peak > fits {
            return Err(format!(
                "services: their peaks add up to {peak} replicas; the pool holds {fits}"
            ));
        }
        Ok(())
    }

    /// Checks the values of one service's scenario.
    fn validate_one(&self) -> Result<(), String> {
        let positive = [
            ("run.days", self.run.days),
            ("run.step_s", self.run.step_s),
            (
                "model.prefill_tokens_per_s",
                self.model.prefill_tokens_per_s,
            ),
            ("model.decode_step_s", self.model.decode_step_s),
            ("model.kv_capacity_tokens", self.model.kv_capacity_tokens),
            ("autoscaling.hpa_sync_s", self.autoscaling.hpa_sync_s),
            (
                "autoscaling.keda_polling_s",
                self.autoscaling.keda_polling_s,
            ),
            (
                "prometheus.scrape_interval_s",
                self.prometheus.scrape_interval_s,
            ),
            ("prometheus.rate_window_s", self.prometheus.rate_window_s),
            ("research.job_hours", self.research.job_hours),
            (
                "research.checkpoint_interval_s",
                self.research.checkpoint_interval_s,
            ),
            ("slo.queue_wait_p99_s", self.slo.queue_wait_p99_s),
            (
                "research.notice_checkpoint_every_s",
                self.research.notice_checkpoint_every_s,
            ),
            (
                "policies.keda_prometheus.threshold",
                self.policies.keda_prometheus.threshold,
            ),
            (
                "policies.nightshift.rate_window_s",
                self.policies.nightshift.rate_window_s,
            ),
            (
                "policies.nightshift.forecast_lead_s",
                self.policies.nightshift.forecast_lead_s,
            ),
            ("mix.context", self.mix.context),
            ("mix.generated", self.mix.generated),
        ];
        for (name, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!(
                    "{name} must be a finite number above zero, got {v}"
                ));
            }
        }
        for (name, policies) in [
            (
                "autoscaling.scale_up_policies",
                &self.autoscaling.scale_up_policies,
            ),
            (
                "autoscaling.scale_down_policies",
                &self.autoscaling.scale_down_policies,
            ),
        ] {
            if policies.is_empty() {
                return Err(format!("{name} needs at least one policy"));
            }
            for p in policies {
                let whole = p.kind == HpaPolicyKind::Percent || p.value.fract() == 0.0;
                let positive = |v: f64| v.is_finite() && v > 0.0;
                if !(positive(p.value) && whole && positive(p.period_s)) {
                    return Err(format!(
                        "{name}: value (whole pods, or per cent) and period_s must be finite \
                         numbers above zero, got {} and {}",
                        p.value, p.period_s
                    ));
                }
            }
        }
        let non_negative = [
            ("model.kv_read_s_per_token", self.model.kv_read_s_per_token),
            ("model.startup_s", self.model.startup_s),
            ("autoscaling.tolerance", self.autoscaling.tolerance),
            (
                "autoscaling.scale_up_window_s",
                self.autoscaling.scale_up_window_s,
            ),
            (
                "autoscaling.scale_down_window_s",
                self.autoscaling.scale_down_window_s,
            ),
            ("research.grace_period_s", self.research.grace_period_s),
            (
                "research.notice_checkpoint_s",
                self.research.notice_checkpoint_s,
            ),
            (
                "policies.nightshift.notice_window_s",
                self.policies.nightshift.notice_window_s,
            ),
            (
                "policies.nightshift.notice_margin",
                self.policies.nightshift.notice_margin,
            ),
            (
                "policies.nightshift.notice_hysteresis",
                self.policies.nightshift.notice_hysteresis,
            ),
        ];
        for (name, v) in non_negative {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{name} must be a finite number ≥ 0, got {v}"));
            }
        }
        let u = self.policies.nightshift.utilization;
        if !(u.is_finite() && u > 0.0 && u <= 1.0) {
            return Err(format!(
                "policies.nightshift.utilization must be in (0, 1], got {u}"
            ));
        }
        let a = &self.autoscaling;
        if a.min_replicas == 0 || a.min_replicas > a.max_replicas {
            return Err(format!(
                "autoscaling needs 1 ≤ min_replicas ≤ max_replicas, got {} and {}",
                a.min_replicas, a.max_replicas
            ));
        }
        let m = &self.model;
        if m.gpus_per_replica == 0 || m.gpus_per_replica > self.pool.gpus_per_node {
            return Err(format!(
                "model.gpus_per_replica ({}) must be between 1 and pool.gpus_per_node ({})",
                m.gpus_per_replica, self.pool.gpus_per_node
            ));
        }
        if m.max_num_seqs == 0 || m.max_num_batched_tokens <= m.max_num_seqs {
            return Err(
                "model needs max_num_seqs ≥ 1 and max_num_batched_tokens > max_num_seqs".into(),
            );
        }
        let r = &self.research;
        if r.gpus_per_job == 0 || r.gpus_per_job > self.pool.gpus_per_node {
            return Err(format!(
                "research.gpus_per_job ({}) must be between 1 and pool.gpus_per_node ({})",
                r.gpus_per_job, self.pool.gpus_per_node
            ));
        }
        if r.classes.is_empty() {
            return Err("research.classes needs at least one class".into());
        }
        for c in &r.classes {
            if !(c.share.is_finite() && c.share > 0.0) {
                return Err(format!(
                    "research.classes: {:?} needs a share above zero, got {}",
                    c.name, c.share
                ));
            }
            if c.priority >= super::pool::INFERENCE_PRIORITY {
                return Err(format!(
                    "research.classes: {:?} must rank below inference ({}), got {}",
                    c.name,
                    super::pool::INFERENCE_PRIORITY,
                    c.priority
                ));
            }
        }
        if self.pool.nodes == 0 {
            return Err("pool.nodes must be at least 1".into());
        }
        let nw = &self.policies.night_window;
        if nw.start_hour > 23 || nw.end_hour > 23 {
            return Err("policies.night_window hours must be 0–23".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_round_trip_through_toml() {
        let s = Scenario::default();
        s.validate().expect("defaults valid");
        let back = Scenario::from_toml(&s.to_toml()).expect("own TOML parses");
        assert_eq!(back, s);
    }

    #[test]
    fn a_file_overrides_only_what_it_names() {
        let s = Scenario::from_toml("[run]\ndays = 2\n[model]\nstartup_s = 60\n").expect("valid");
        assert_eq!(s.run.days, 2.0);
        assert_eq!(s.model.startup_s, 60.0);
        assert_eq!(s.model.max_num_seqs, ModelConfig::default().max_num_seqs);
    }

    #[test]
    fn unknown_keys_and_impossible_values_are_rejected() {
        assert!(Scenario::from_toml("[model]\nstartup = 60\n").is_err());
        let mut s = Scenario::default();
        s.autoscaling.min_replicas = 20;
        assert!(s.validate().is_err());
        let mut s = Scenario::default();
        s.run.step_s = 0.0;
        assert!(
            s.validate()
                .expect_err("a zero step is refused")
                .contains("run.step_s")
        );
    }

    #[test]
    fn hpa_policies_are_read_from_a_file_and_checked() {
        let s = Scenario::from_toml(
            "[autoscaling]\nscale_down_select = \"min\"\n\
             scale_down_policies = [{ kind = \"pods\", value = 1, period_s = 300 }]\n",
        )
        .expect("valid");
        assert_eq!(s.autoscaling.scale_down_select, HpaSelect::Min);
        assert_eq!(
            s.autoscaling.scale_down_policies,
            [HpaPolicy {
                kind: HpaPolicyKind::Pods,
                value: 1.0,
                period_s: 300.0
            }]
        );
        s.validate().expect("valid");
        assert!(Scenario::from_toml("[autoscaling]\nscale_up_select = \"most\"\n").is_err());
        for bad in [
            "scale_up_policies = []",
            "scale_up_policies = [{ kind = \"pods\", value = 1.5, period_s = 15 }]",
            "scale_down_policies = [{ kind = \"percent\", value = 50, period_s = 0 }]",
        ] {
            let s = Scenario::from_toml(&format!("[autoscaling]\n{bad}\n")).expect("parses");
            let error = s.validate().expect_err(bad);
            assert!(error.contains("autoscaling.scale_"), "{error}");
        }
    }

    /// Two services on the default pool, each at half of it.
    const TWO_SERVICES: &str = "[policies.night_window]\nnight_replicas = 3\nday_replicas = 16\n\
        [[services]]\nname = \"chat\"\nseed = 4\npeak_replicas = 8\n\
        [[services]]\nname = \"code\"\npeak_replicas = 5\n[services.mix]\ncontext = 2.0\n\
        [services.envelope]\nhourly = [0.5]\n";

    #[test]
    fn each_service_is_the_scenario_with_its_own_traffic_size_and_shrunk_night() {
        let s = Scenario::from_toml(TWO_SERVICES).expect("parses");
        let each = s.service_scenarios();
        let names: Vec<&str> = each.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["chat", "code"]);
        let (_, chat) = &each[0];
        let (_, code) = &each[1];
        assert_eq!((chat.run.seed, code.run.seed), (4, 1));
        assert_eq!(code.mix.context, 2.0);
        assert_eq!(code.envelope.hourly, [0.5]);
        assert_eq!(chat.envelope, EnvelopeConfig::default());
        // Sized to its peak; the night window keeps its hours and shrinks in proportion,
        // rounded up: 3 × 8 / 16 = 1.5 → 2, 3 × 5 / 16 = 0.94 → 1.
        assert_eq!(chat.policies.static_peak.replicas, 8);
        assert_eq!(chat.autoscaling.max_replicas, 8);
        let nights: Vec<(u32, u32)> = [chat, code]
            .iter()
            .map(|sc| {
                let nw = &sc.policies.night_window;
                (nw.night_replicas, nw.day_replicas)
            })
            .collect();
        assert_eq!(nights, [(2, 8), (1, 5)]);
        assert_eq!(code.policies.night_window.start_hour, 20);
        // The pool, the research and the SLO stay the scenario's; no service has services.
        assert!(each.iter().all(|(_, sc)| sc.pool == s.pool
            && sc.research == s.research
            && sc.slo == s.slo
            && sc.services.is_empty()));
        // Without services, the scenario is its own one service.
        let one = Scenario::default();
        assert_eq!(one.service_scenarios(), [(String::new(), one.clone())]);
        assert_eq!(one.night_window_of(5), one.policies.night_window);
    }

    #[test]
    fn services_need_names_of_their_own_and_peaks_the_pool_holds() {
        Scenario::from_toml(TWO_SERVICES)
            .expect("parses")
            .validate()
            .expect("valid");
        for (bad, says) in [
            ("[[services]]\npeak_replicas = 2\n", "name"),
            (
                "[[services]]\nname = \"a\"\n[[services]]\nname = \"a\"\n",
                "name",
            ),
            (
                "[[services]]\nname = \"a\"\npeak_replicas = 0\n",
                "peak_replicas",
            ),
            // The default pool holds 16 replicas of 4 GPUs.
            (
                "[[services]]\nname = \"a\"\npeak_replicas = 9\n\
                 [[services]]\nname = \"b\"\npeak_replicas = 8\n",
                "add up to 17 replicas; the pool holds 16",
            ),
            (
                "[[services]]\nname = \"a\"\n[services.mix]\ngenerated = 0\n",
                "mix.generated",
            ),
        ] {
            let s = Scenario::from_toml(bad).expect("parses");
            let error = s.validate().expect_err(bad);
            assert!(error.contains(says), "{bad}: {error}");
        }
        assert!(Scenario::from_toml("[[services]]\nname = \"a\"\nreplicas = 2\n").is_err());
    }
}

/// The simulated defaults are the product's: the default scenario's nightshift is what the live
/// scaler and pool controller do when nothing is set, and `data/scenarios/shipped-example.toml`
/// is the example ScaledObject. A change to a live default or to the example fails here until
/// the simulator follows.
#[cfg(test)]
mod shipped {
    use std::{collections::BTreeSet, path::Path};

    use clap::{CommandFactory, FromArgMatches};
    use serde_json::Value;

    use super::*;
    use crate::{
        cli::{Cli, Command},
        core::notice::NoticePolicy,
        pool::{PoolArgs, windows::Windows},
        scaler::metadata::{self, EmptyResult, Source, TriggerConfig},
        sim::policy::ScalingPolicy,
    };

    /// A file of the repository, as text.
    fn read(path: &str) -> String {
        let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        std::fs::read_to_string(&full)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", full.display()))
    }

    /// What the live scaler makes of these trigger metadata (in the ScaledObject's namespace).
    fn live_trigger(pairs: &[(&str, &str)]) -> TriggerConfig {
        let table: metadata::Table = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        metadata::parse(&table, "inference")
            .unwrap_or_else(|e| panic!("the live scaler refuses {pairs:?}: {e}"))
    }

    /// The pool controller's options of `nightshift run` (what the shipped Deployment runs) with
    /// no flag set; environment variables are ignored, so that the machine's cannot change it.
    fn pool_defaults() -> PoolArgs {
        let command = Cli::command()
            .mut_args(|a| a.env(None))
            .mut_subcommand("run", |run| run.mut_args(|a| a.env(None)));
        let matches = command
            .try_get_matches_from(["nightshift", "run"])
            .expect("`nightshift run` needs no flag");
        match Cli::from_arg_matches(&matches).expect("parsed").command {
            Command::Run(run) => run.pool,
            _ => panic!("`nightshift run` parsed as another command"),
        }
    }

    /// `live` (a trigger as the scaler parsed it) is simulated by `policy` with the scenario's
    /// nightshift settings: every field of the trigger that changes a decision.
    fn assert_simulates(live: &TriggerConfig, ns: &NightshiftConfig, policy: ScalingPolicy) {
        assert!(policy.is_nightshift(), "{policy:?}");
        // Per-replica targets, the learned waiting target included.
        assert_eq!(live.targets, ns.targets(), "targets");
        assert_eq!(live.query, None, "a raw query has no simulated counterpart");
        assert_eq!(
            live.capacity.map(|c| c.utilization),
            ns.learn_capacity.then_some(ns.utilization),
            "capacity: learned and capacityUtilization"
        );
        assert_eq!(
            live.forecast.is_some(),
            policy.forecasts(),
            "forecast: daily"
        );
        if let Some(forecast) = live.forecast {
            assert_eq!(
                forecast.lead.as_secs_f64(),
                ns.forecast_lead_s,
                "forecastLead"
            );
        }
        let source = match live.source {
            Source::Scrape(_) => MetricSource::Scrape,
            Source::Prometheus { .. } => MetricSource::Prometheus,
        };
        assert_eq!(source, ns.source, "source");
        assert_eq!(
            live.rate_window.as_secs_f64(),
            ns.rate_window_s,
            "rateWindow"
        );
        // A reading that fails is an error, never a zero: the simulated HPA then keeps its
        // replicas (`demand_errors`), as KEDA's does before `fallback`.
        assert_eq!(live.empty_result, EmptyResult::Error, "emptyResult");
    }

    /// The pool controller's options are the scenario's notice and lending settings, and
    /// whether `policy` gives notices is whether the controller does.
    fn assert_pool_simulated(pool: &PoolArgs, ns: &NightshiftConfig, policy: ScalingPolicy) {
        assert_eq!(pool.notice.enabled, policy.notices(), "--pool-notices");
        let notices = pool
            .notice
            .policy()
            .expect("default notice options are valid");
        assert_eq!(
            notices,
            NoticePolicy {
                window_s: ns.notice_window_s,
                margin: ns.notice_margin,
                hysteresis: ns.notice_hysteresis,
            },
            "--pool-notice-window, --pool-notice-margin, --pool-notice-hysteresis"
        );
        assert_eq!(
            pool.lending.headroom,
            u64::from(ns.headroom_gpus),
            "--pool-headroom"
        );
        // The simulated pool lends at any hour.
        assert_eq!(
            pool.lending.lending_windows,
            Windows::default(),
            "--pool-lending-windows"
        );
    }

    #[test]
    fn the_default_nightshift_is_the_live_scaler_with_a_trigger_that_sets_nothing() {
        let ns = Scenario::default().policies.nightshift;
        // Where to read is the one thing a trigger must say; the examples name a Service.
        let plain = live_trigger(&[("service", "vllm")]);
        assert_simulates(&plain, &ns, ScalingPolicy::Nightshift);
        assert_simulates(&plain, &ns, ScalingPolicy::NightshiftWithoutNotices);
        let forecast = live_trigger(&[("service", "vllm"), ("forecast", "daily")]);
        assert_simulates(&forecast, &ns, ScalingPolicy::NightshiftForecast);
    }

    #[test]
    fn the_default_notices_are_the_pool_controllers_flag_defaults() {
        let ns = Scenario::default().policies.nightshift;
        let pool = pool_defaults();
        assert_pool_simulated(&pool, &ns, ScalingPolicy::Nightshift);
        assert_pool_simulated(&pool, &ns, ScalingPolicy::NightshiftForecast);
        // Only the policy that switches them off differs.
        assert!(!ScalingPolicy::NightshiftWithoutNotices.notices());
    }

    /// Kubernetes' HPA defaults (autoscaling/v2 `HorizontalPodAutoscalerBehavior`, and
    /// kube-controller-manager's sync period and tolerance): what a ScaledObject without
    /// `advanced.horizontalPodAutoscalerConfig.behavior` gets; with KEDA's defaults for the
    /// metric (`pollingInterval` 30 s, no `useCachedMetrics`).
    #[test]
    fn the_default_hpa_is_kubernetes_defaults() {
        let a = Scenario::default().autoscaling;
        let policy = |kind, value, period_s| HpaPolicy {
            kind,
            value,
            period_s,
        };
        assert_eq!(a.hpa_sync_s, 15.0);
        assert_eq!(a.tolerance, 0.1);
        assert_eq!(a.scale_up_window_s, 0.0);
        assert_eq!(a.scale_up_select, HpaSelect::Max);
        assert_eq!(
            a.scale_up_policies,
            [
                policy(HpaPolicyKind::Pods, 4.0, 15.0),
                policy(HpaPolicyKind::Percent, 100.0, 15.0)
            ]
        );
        assert_eq!(a.scale_down_window_s, 300.0);
        assert_eq!(a.scale_down_select, HpaSelect::Max);
        assert_eq!(
            a.scale_down_policies,
            [policy(HpaPolicyKind::Percent, 100.0, 15.0)]
        );
        assert_eq!(a.keda_polling_s, 30.0);
        assert!(!a.use_cached_metrics);
    }

    /// The keys of a YAML mapping.
    fn keys(value: &Value) -> BTreeSet<&str> {
        value
            .as_object()
            .unwrap_or_else(|| panic!("not a mapping: {value}"))
            .keys()
            .map(String::as_str)
            .collect()
    }

    /// Asserts that `value`'s keys are exactly `expected`: a key the test does not map is a
    /// change of the example the scenario has not followed.
    fn assert_keys(value: &Value, expected: &[&str], what: &str) {
        let expected: BTreeSet<&str> = expected.iter().copied().collect();
        assert_eq!(
            keys(value),
            expected,
            "{what}: map the new field to the scenario (or say why it is not simulated)"
        );
    }

    /// One direction of the manifest's HPA `behavior` as the scenario spells it: the
    /// stabilization window, `selectPolicy` (Kubernetes' default `Max` when absent) and the
    /// policies in order.
    fn behaviour(rules: &Value) -> (f64, HpaSelect, Vec<HpaPolicy>) {
        assert_keys(
            rules,
            &["stabilizationWindowSeconds", "selectPolicy", "policies"],
            "behavior rules",
        );
        let window = rules["stabilizationWindowSeconds"]
            .as_f64()
            .expect("stabilizationWindowSeconds is a number");
        let select = match rules["selectPolicy"].as_str().unwrap_or("Max") {
            "Max" => HpaSelect::Max,
            "Min" => HpaSelect::Min,
            other => panic!("selectPolicy {other} is not simulated"),
        };
        let policies = rules["policies"]
            .as_array()
            .expect("policies is a list")
            .iter()
            .map(|p| {
                assert_keys(p, &["type", "value", "periodSeconds"], "HPA policy");
                HpaPolicy {
                    kind: match p["type"].as_str().expect("type") {
                        "Pods" => HpaPolicyKind::Pods,
                        "Percent" => HpaPolicyKind::Percent,
                        other => panic!("policy type {other} is not simulated"),
                    },
                    value: p["value"].as_f64().expect("value is a number"),
                    period_s: p["periodSeconds"]
                        .as_f64()
                        .expect("periodSeconds is a number"),
                }
            })
            .collect();
        (window, select, policies)
    }

    #[test]
    fn the_shipped_example_scenario_is_the_example_scaled_object() {
        let manifest: Value =
            serde_yaml_ng::from_str(&read("manifests/examples/vllm/scaledobject.yaml"))
                .expect("the example ScaledObject is YAML");
        let scenario = Scenario::from_toml(&read("data/scenarios/shipped-example.toml"))
            .expect("the scenario parses");
        scenario.validate().expect("the scenario is valid");
        let a = &scenario.autoscaling;
        let ns = &scenario.policies.nightshift;
        assert_eq!(manifest["kind"], "ScaledObject");
        let spec = &manifest["spec"];
        assert_keys(
            spec,
            &[
                // Which Deployment: the simulated fleet is the one service.
                "scaleTargetRef",
                "pollingInterval",
                // Only for scaling to zero, which minReplicaCount ≥ 1 rules out (below).
                "cooldownPeriod",
                "minReplicaCount",
                "maxReplicaCount",
                // Not simulated: the simulated scrape never fails (a failure would count in
                // `demand_errors`, with the HPA holding its replicas).
                "fallback",
                "advanced",
                "triggers",
            ],
            "spec",
        );

        // spec.minReplicaCount, maxReplicaCount, pollingInterval → [autoscaling].
        let number = |v: &Value, what: &str| v.as_f64().unwrap_or_else(|| panic!("{what}"));
        assert_eq!(
            f64::from(a.min_replicas),
            number(&spec["minReplicaCount"], "minReplicaCount")
        );
        assert!(a.min_replicas >= 1, "cooldownPeriod would matter");
        assert_eq!(
            f64::from(a.max_replicas),
            number(&spec["maxReplicaCount"], "maxReplicaCount")
        );
        assert_eq!(
            a.keda_polling_s,
            number(&spec["pollingInterval"], "pollingInterval")
        );

        // spec.advanced.horizontalPodAutoscalerConfig.behavior → the HPA's windows and policies.
        assert_keys(
            &spec["advanced"],
            &["horizontalPodAutoscalerConfig"],
            "advanced",
        );
        let hpa = &spec["advanced"]["horizontalPodAutoscalerConfig"];
        assert_keys(hpa, &["behavior"], "horizontalPodAutoscalerConfig");
        assert_keys(&hpa["behavior"], &["scaleUp", "scaleDown"], "behavior");
        assert_eq!(
            behaviour(&hpa["behavior"]["scaleUp"]),
            (
                a.scale_up_window_s,
                a.scale_up_select,
                a.scale_up_policies.clone()
            ),
            "behavior.scaleUp"
        );
        assert_eq!(
            behaviour(&hpa["behavior"]["scaleDown"]),
            (
                a.scale_down_window_s,
                a.scale_down_select,
                a.scale_down_policies.clone()
            ),
            "behavior.scaleDown"
        );

        // spec.triggers: one nightshift trigger, an AverageValue metric (what the simulated
        // HPA computes), its metadata as the live scaler parses it → [policies.nightshift].
        let triggers = spec["triggers"].as_array().expect("triggers is a list");
        assert_eq!(triggers.len(), 1, "one trigger");
        let trigger = &triggers[0];
        assert_keys(trigger, &["type", "metricType", "metadata"], "trigger");
        assert_eq!(trigger["type"], "external");
        assert_eq!(trigger["metricType"], "AverageValue");
        // `useCachedMetrics` is absent: each HPA sync asks the scaler.
        assert!(!a.use_cached_metrics);
        let pairs: Vec<(&str, &str)> = trigger["metadata"]
            .as_object()
            .expect("metadata is a mapping")
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().expect("metadata values are strings")))
            .collect();
        // Every key either decides something `assert_simulates` compares, or says which pods
        // and series to read (the simulated fleet is the one service) or how KEDA reaches
        // nightshift, or only matters at zero replicas.
        let compared = [
            "service",
            "serverAddress",
            "endpoints",
            "waitingTarget",
            "runningTarget",
            "kvCacheTarget",
            "generationTokensTarget",
            "promptTokensTarget",
            "capacity",
            "capacityUtilization",
            "forecast",
            "forecastLead",
            "rateWindow",
            "emptyResult",
        ];
        let not_simulated = ["scalerAddress", "port", "model", "activationThreshold"];
        for (key, _) in &pairs {
            assert!(
                compared.contains(key) || not_simulated.contains(key),
                "trigger metadata {key}: map it to the scenario (or say why it is not simulated)"
            );
        }
        let namespace = manifest["metadata"]["namespace"]
            .as_str()
            .expect("namespace");
        let table: metadata::Table = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let live = metadata::parse(&table, namespace).expect("the live scaler parses it");
        assert_simulates(&live, ns, ScalingPolicy::Nightshift);

        // The service the example is written for: the fleet provisioned for its peak is its
        // maxReplicaCount, on a pool that holds exactly that.
        assert_eq!(scenario.policies.static_peak.replicas, a.max_replicas);
        assert_eq!(scenario.policies.night_window.day_replicas, a.max_replicas);
        assert_eq!(
            scenario.pool.nodes * scenario.pool.gpus_per_node,
            a.max_replicas * scenario.model.gpus_per_replica
        );

        // The example sets no pool option: the controller's defaults, notices on.
        assert_pool_simulated(&pool_defaults(), ns, ScalingPolicy::Nightshift);
    }
}
