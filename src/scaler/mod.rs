//! The KEDA external scaler: a gRPC server (KEDA's `externalscaler` protocol) that turns vLLM
//! metrics into inference demand.
//!
//! - [`metadata`] parses a trigger's metadata into a typed configuration, [`admitted`] keeps
//!   each ScaledObject's parsed trigger while KEDA keeps sending the same table;
//! - [`Scaler`] reads the sources, applies the pure demand math ([`crate::core::demand`], shared
//!   with the simulator) and keeps explanations ([`explain`]);
//! - [`forecasts`] keeps the daily forecast of the triggers with `forecast: daily` (the pure
//!   [`crate::core::forecast`] model, shared with the simulator) and rebuilds it from Prometheus;
//! - [`capacities`] keeps the capacity per replica learned for the triggers with
//!   `capacity: learned` (the pure [`crate::core::capacity`] learner, shared with the simulator),
//!   which gives their token-rate targets;
//! - [`service`] is the thin gRPC adapter, [`error`] the one mapping to gRPC status codes;
//! - [`tls`] names the scaler's TLS/mTLS choices for [`crate::runtime::tls`] (reloaded from disk);
//! - [`start`] wires it into the process.
//!
//! Demand is reported as a metric value of `replicas × 100` against a fixed target of 100, so the
//! HPA's `ceil(value / target)` is the number of replicas needed.

pub mod admitted;
pub mod capacities;
pub mod error;
pub mod explain;
pub mod forecasts;
pub mod metadata;
pub mod metrics;
pub mod service;
pub mod tls;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use clap::Args;
use tokio_util::sync::CancellationToken;

use admitted::Admitted;
use capacities::Capacities;
pub use error::{Error, StartError};
use explain::{Decisions, ErrorView, Explanation, TermView};
use forecasts::{ForecastOptions, Forecasts};
use metadata::{EmptyResult, Source, TriggerConfig};

use crate::{
    core::capacity::CapacityConfig,
    core::demand::{self, Signal},
    runtime::Context,
    runtime::tls::{Metrics as TlsMetrics, ServerTls},
    sources::{
        Selection,
        discovery::Discovery,
        metrics::SourceMetrics,
        policy::{Namespaces, SourcePolicy},
        prometheus::PrometheusSource,
        scrape::ScrapeSource,
    },
};

/// Options of the KEDA external scaler.
#[derive(Clone, Debug, Args)]
pub struct ScalerArgs {
    /// Address of the scaler's gRPC server (KEDA's `scalerAddress` points here).
    #[arg(long, env = "NIGHTSHIFT_SCALER_ADDR", default_value = "0.0.0.0:6000")]
    pub scaler_addr: SocketAddr,

    /// How long an upstream answer (Prometheus query, pod scrape pass) is reused. Every
    /// ScaledObject polling within this time shares one upstream request per metric family.
    #[arg(long, env = "NIGHTSHIFT_SCALER_CACHE_TTL", default_value = "1s", value_parser = crate::core::duration::parse_duration)]
    pub scaler_cache_ttl: Duration,

    /// How often a `StreamIsActive` stream re-evaluates (it sends only on transitions).
    #[arg(long, env = "NIGHTSHIFT_SCALER_STREAM_INTERVAL", default_value = "5s", value_parser = crate::core::duration::parse_duration)]
    pub scaler_stream_interval: Duration,

    /// PEM certificate chain for serving gRPC over TLS (with --scaler-tls-key); re-read when it
    /// changes. Plaintext when unset.
    #[arg(long, env = "NIGHTSHIFT_SCALER_TLS_CERT", requires = "scaler_tls_key")]
    pub scaler_tls_cert: Option<PathBuf>,

    /// PEM private key for --scaler-tls-cert; re-read when it changes.
    #[arg(long, env = "NIGHTSHIFT_SCALER_TLS_KEY", requires = "scaler_tls_cert")]
    pub scaler_tls_key: Option<PathBuf>,

    /// PEM CA bundle: when set, clients (KEDA, with a TriggerAuthentication's tlsClientCert and
    /// tlsClientKey) must present a certificate signed by it (mTLS); re-read when it changes.
    #[arg(
        long,
        env = "NIGHTSHIFT_SCALER_TLS_CLIENT_CA",
        requires = "scaler_tls_cert"
    )]
    pub scaler_tls_client_ca: Option<PathBuf>,

    /// How often the TLS files are checked for rotation.
    #[arg(long, env = "NIGHTSHIFT_SCALER_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = crate::core::duration::parse_duration)]
    pub scaler_tls_reload_interval: Duration,

    /// Prometheus that scrapes nightshift (e.g. `http://prometheus.monitoring:9090`): a trigger
    /// with `forecast: daily` rebuilds its daily shape from nightshift's own measured-demand
    /// series there when first evaluated after a start. Without it the shape learns from live
    /// evaluations only.
    #[arg(long, env = "NIGHTSHIFT_SCALER_FORECAST_PROMETHEUS")]
    pub scaler_forecast_prometheus: Option<String>,

    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// Which upstreams ScaledObjects may make the scaler call (docs/security.md). Their authors are
/// untrusted; the defaults deny what would let them reach what they could not reach themselves.
#[derive(Clone, Debug, Args)]
pub struct PolicyArgs {
    /// Prometheus base URLs a trigger's `serverAddress` may be (or be under), comma-separated;
    /// `*` allows any. The default is the platform Prometheus the manifests and docs name.
    #[arg(
        long,
        env = "NIGHTSHIFT_SCALER_ALLOWED_PROMETHEUS",
        value_delimiter = ',',
        default_value = "http://prometheus.monitoring:9090"
    )]
    pub scaler_allowed_prometheus: Vec<String>,

    /// Namespaces, besides the ScaledObject's own, whose Services a trigger may scrape,
    /// comma-separated; `*` allows any. Empty: own namespace only.
    #[arg(
        long,
        env = "NIGHTSHIFT_SCALER_SCRAPE_NAMESPACES",
        value_delimiter = ','
    )]
    pub scaler_scrape_namespaces: Vec<String>,

    /// Accept `endpoints` (a static list of pod IP:port) in triggers. Off by default: a list of
    /// addresses cannot be tied to the ScaledObject's namespace; `service` can.
    #[arg(long, env = "NIGHTSHIFT_SCALER_ALLOW_ENDPOINTS")]
    pub scaler_allow_endpoints: bool,

    /// Let triggers reach loopback and unspecified addresses (127.0.0.0/8, ::1, 0.0.0.0,
    /// `localhost`): the scaler's own pod. For tests and local development.
    #[arg(long, env = "NIGHTSHIFT_SCALER_ALLOW_LOOPBACK")]
    pub scaler_allow_loopback: bool,

    /// Let triggers reach link-local addresses (169.254.0.0/16, fe80::/10), where clouds serve
    /// instance metadata and credentials.
    #[arg(long, env = "NIGHTSHIFT_SCALER_ALLOW_LINK_LOCAL")]
    pub scaler_allow_link_local: bool,
}

impl PolicyArgs {
    /// The source policy these flags describe.
    pub fn policy(&self) -> SourcePolicy {
        SourcePolicy {
            prometheus: self
                .scaler_allowed_prometheus
                .iter()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            namespaces: Namespaces::from_list(&self.scaler_scrape_namespaces),
            endpoints: self.scaler_allow_endpoints,
            loopback: self.scaler_allow_loopback,
            link_local: self.scaler_allow_link_local,
        }
    }
}

/// Options of the scaler core.
#[derive(Clone, Debug)]
pub struct Options {
    pub cache_ttl: Duration,
    pub stream_interval: Duration,
    /// Which upstreams ScaledObjects may make the scaler call.
    pub policy: SourcePolicy,
    /// How triggers with `forecast` learn and rebuild their daily shape.
    pub forecast: ForecastOptions,
}

/// Name of the metric in `GetMetricSpec`/`GetMetrics` (KEDA prefixes it with `s{index}-`).
pub const METRIC_NAME: &str = "vllm-demand";

/// The outcome of one evaluation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Evaluation {
    /// Demand in replicas.
    pub replicas: f64,
    /// `replicas × METRIC_TARGET` and its ceiling, for `GetMetrics`.
    pub metric_value: f64,
    pub metric_value_int: i64,
    /// Demand above the activation threshold.
    pub active: bool,
}

/// Reads sources and decides; shared by every gRPC call.
pub struct Scaler {
    prometheus: PrometheusSource,
    scrape: ScrapeSource,
    admitted: Admitted,
    decisions: Decisions,
    forecasts: Forecasts,
    capacities: Capacities,
    metrics: metrics::ScalerMetrics,
    options: Options,
    shutdown: CancellationToken,
}

impl Scaler {
    /// Builds the scaler. `kube` is `None` without a cluster: `service` triggers then fail with
    /// a clear error, `serverAddress` and `endpoints` triggers work.
    pub fn new(
        options: Options,
        kube: Option<kube::Client>,
        source_metrics: SourceMetrics,
        metrics: metrics::ScalerMetrics,
        shutdown: CancellationToken,
    ) -> Result<Self, StartError> {
        let discovery = Arc::new(Discovery::new(kube, shutdown.clone()));
        let policy = Arc::new(options.policy.clone());
        Ok(Self {
            prometheus: PrometheusSource::new(options.cache_ttl, source_metrics.clone()),
            scrape: ScrapeSource::new(options.cache_ttl, discovery, source_metrics, policy)?,
            admitted: Admitted::default(),
            decisions: Decisions::default(),
            forecasts: Forecasts::new(options.forecast.clone(), metrics.clone(), shutdown.clone()),
            capacities: Capacities::new(CapacityConfig::default(), metrics.clone()),
            metrics,
            options,
            shutdown,
        })
    }

    /// The explanations store (for the admin routes).
    pub fn decisions(&self) -> &Decisions {
        &self.decisions
    }

    /// The request metrics.
    pub fn metrics(&self) -> &metrics::ScalerMetrics {
        &self.metrics
    }

    /// Stream re-evaluation interval.
    pub fn stream_interval(&self) -> Duration {
        self.options.stream_interval
    }

    /// Cancelled when the process shuts down.
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// A ScaledObject's trigger, parsed and checked against the source policy: what every RPC
    /// does first, so a refused source is refused before any request is sent.
    pub fn admit(
        &self,
        namespace: &str,
        raw_metadata: &metadata::Table,
    ) -> Result<TriggerConfig, Error> {
        let config = metadata::parse(raw_metadata, namespace)?;
        let policy = &self.options.policy;
        match &config.source {
            Source::Prometheus { server, .. } => policy.check_prometheus(server)?,
            Source::Scrape(target) => policy.check_scrape(target, namespace)?,
        }
        Ok(config)
    }

    /// Checks ScaledObject `namespace/name`'s trigger metadata as [`Scaler::admit`] does, from
    /// the table its evaluations admitted when `raw_metadata` is that table; keeps nothing.
    pub fn check(
        &self,
        namespace: &str,
        name: &str,
        raw_metadata: &metadata::Table,
    ) -> Result<(), Error> {
        if self.admitted.get(namespace, name, raw_metadata).is_some() {
            return Ok(());
        }
        self.admit(namespace, raw_metadata).map(drop)
    }

    /// Evaluates a ScaledObject's trigger and records the explanation.
    pub async fn evaluate(
        &self,
        namespace: &str,
        name: &str,
        raw_metadata: &metadata::Table,
    ) -> Result<Evaluation, Error> {
        let config = self
            .admitted
            .get_or_admit(namespace, name, raw_metadata, || {
                self.admit(namespace, raw_metadata)
            })?;
        let mut explanation = Explanation {
            namespace: namespace.to_string(),
            name: name.to_string(),
            at: jiff::Timestamp::now(),
            source: config.reads().source_name.clone(),
            pods: None,
            terms: Vec::new(),
            driver: None,
            replicas: None,
            metric_value: None,
            active: None,
            activation_threshold: config.activation_threshold,
            error: None,
            forecast: None,
            capacity: None,
        };
        if config.capacity.is_none() {
            self.capacities.forget(namespace, name);
        }
        let measured = self.decide(&config, &mut explanation).await;
        let result = self.forecast(namespace, name, &config, measured, &mut explanation);
        match &result {
            Ok(ev) => {
                explanation.replicas = Some(ev.replicas);
                explanation.metric_value = Some(ev.metric_value);
                explanation.active = Some(ev.active);
                let measured = explanation
                    .forecast
                    .as_ref()
                    .and_then(|f| f.measured)
                    .unwrap_or(ev.replicas);
                self.metrics.demand(
                    namespace,
                    name,
                    config.service(),
                    ev.replicas,
                    measured,
                    explanation.pods,
                );
            }
            Err(e) => {
                tracing::warn!(%namespace, scaled_object = %name, error = %e, "no demand reported");
                explanation.error = Some(ErrorView {
                    code: format!("{:?}", e.code()),
                    message: e.to_string(),
                });
            }
        }
        for (namespace, name) in self.decisions.record(explanation) {
            self.metrics.forget(&namespace, &name);
            self.admitted.forget(&namespace, &name);
            self.forecasts.forget(&namespace, &name);
            self.capacities.forget(&namespace, &name);
        }
        result
    }

    /// Applies the trigger's daily forecast to the measured evaluation: the shape learns the
    /// measured demand, and the answer is max(measured, expected within the lead). A failed read
    /// stays the error it is: the forecast neither learns from it nor answers in its place, so
    /// KEDA's `fallback` applies as for any trigger (a forecast-only answer would hide a broken
    /// source behind yesterday's demand). Without `forecast`, the ScaledObject's shape, if any,
    /// is dropped.
    fn forecast(
        &self,
        namespace: &str,
        name: &str,
        config: &TriggerConfig,
        measured: Result<Evaluation, Error>,
        explanation: &mut Explanation,
    ) -> Result<Evaluation, Error> {
        let Some(forecast) = config.forecast else {
            self.forecasts.forget(namespace, name);
            return measured;
        };
        let measured = match measured {
            Ok(ev) => ev,
            Err(e) => {
                explanation.forecast =
                    Some(self.forecasts.unavailable(namespace, name, forecast.lead));
                return Err(e);
            }
        };
        let (reported, view) = self.forecasts.apply(
            namespace,
            name,
            config.service(),
            forecast.lead,
            measured.replicas,
        );
        let decided = view.decided;
        explanation.forecast = Some(view);
        if !decided {
            return Ok(measured);
        }
        let decision = demand::Decision {
            replicas: reported,
            driver: None,
            terms: Vec::new(),
        };
        Ok(Evaluation {
            replicas: reported,
            metric_value: decision.metric_value(),
            metric_value_int: decision.metric_value_int(),
            active: decision.is_active(config.activation_threshold),
        })
    }

    async fn decide(
        &self,
        config: &TriggerConfig,
        explanation: &mut Explanation,
    ) -> Result<Evaluation, Error> {
        let reads = config.reads();
        if let Some(raw) = &config.query {
            let Some(query) = &reads.raw else {
                return Err(Error::QueryWithoutServer);
            };
            let value = match *self.prometheus.raw_query(query).await? {
                Some(v) => v,
                None if config.empty_result == EmptyResult::Zero => 0.0,
                None => {
                    return Err(Error::Empty {
                        source_name: reads.source_name.to_string(),
                        family: "query",
                        selection: format!("{:?}", raw.query),
                    });
                }
            };
            let replicas = value / raw.target;
            explanation.terms.push(TermView {
                signal: "query",
                raw: value,
                target: raw.target,
                ratio: replicas,
            });
            explanation.driver = Some("query");
            let metric_value = replicas * demand::METRIC_TARGET;
            return Ok(Evaluation {
                replicas,
                metric_value,
                metric_value_int: metric_value.ceil() as i64,
                active: replicas > config.activation_threshold,
            });
        }

        let readings = self.read(config).await?;
        let mut totals = demand::Totals::default();
        for (signal, aggregate) in readings {
            let value = match aggregate {
                Some(a) => {
                    totals.pods = totals.pods.max(a.pods);
                    a.total
                }
                None if config.empty_result == EmptyResult::Zero => 0.0,
                None => {
                    return Err(Error::Empty {
                        source_name: reads.source_name.to_string(),
                        family: signal.family(),
                        selection: selection_text(&config.selection),
                    });
                }
            };
            *totals.signals.get_mut(signal) = Some(value);
        }
        explanation.pods = Some(totals.pods);
        let targets = self.learned_targets(config, &totals, explanation);
        let decision = demand::compute(&totals, &targets)?;
        explanation.terms = decision
            .terms
            .iter()
            .map(|t| TermView {
                signal: t.signal.name(),
                raw: t.total,
                target: t.target,
                ratio: t.ratio,
            })
            .collect();
        explanation.driver = decision.driver.map(Signal::name);
        Ok(Evaluation {
            replicas: decision.replicas,
            metric_value: decision.metric_value(),
            metric_value_int: decision.metric_value_int(),
            active: decision.is_active(config.activation_threshold),
        })
    }

    /// The trigger's targets for this evaluation: with learned capacity, the learner is fed
    /// this evaluation's totals and gives the token-rate targets that are not set by hand (none
    /// before its first saturated reading: the other signals decide meanwhile).
    fn learned_targets(
        &self,
        config: &TriggerConfig,
        totals: &demand::Totals,
        explanation: &mut Explanation,
    ) -> demand::Targets {
        let mut targets = config.targets;
        let Some(learning) = config.capacity else {
            return targets;
        };
        // Every one was read (an empty one answered per `emptyResult`); NaN is ignored by the
        // learner and refused by the demand math.
        let total = |s: Signal| totals.signals.get(s).unwrap_or(f64::NAN);
        let (learned, mut view) = self.capacities.learn(
            &explanation.namespace,
            &explanation.name,
            config.service(),
            learning.utilization,
            (
                totals.pods,
                total(Signal::Waiting),
                total(Signal::PromptTokens),
                total(Signal::GenerationTokens),
            ),
        );
        for (signal, target) in [
            (Signal::PromptTokens, learned.prompt_target),
            (Signal::GenerationTokens, learned.generated_target),
        ] {
            let slot = targets.get_mut(signal);
            if slot.is_some() {
                view.hand_set.push(signal.name().to_string());
            } else {
                *slot = target;
            }
        }
        explanation.capacity = Some(view);
        targets
    }

    /// Reads the wanted signals; `None` for a signal with no series for the selection.
    async fn read(&self, config: &TriggerConfig) -> Result<Readings, Error> {
        let reads = config.reads();
        match &config.source {
            Source::Prometheus { .. } if let Some(fresh) = self.read_fresh(config) => fresh,
            Source::Prometheus { labels, .. } => {
                let fetches =
                    reads
                        .signals
                        .iter()
                        .zip(&reads.families)
                        .map(|(&signal, query)| async move {
                            let index = self.prometheus.family(query, labels, signal).await?;
                            Ok::<_, Error>((signal, index.select(&config.selection)))
                        });
                futures::future::try_join_all(fetches).await
            }
            Source::Scrape(target) => {
                let snapshot = self.scrape.snapshot(target).await?;
                let mut out = Vec::with_capacity(reads.signals.len());
                for &signal in &reads.signals {
                    let rated = matches!(signal, Signal::GenerationTokens | Signal::PromptTokens);
                    if rated && snapshot.rates_warming_up {
                        return Err(Error::WarmingUp {
                            source_name: reads.source_name.to_string(),
                        });
                    }
                    let agg = snapshot.families.get(signal).select(&config.selection);
                    out.push((signal, agg));
                }
                Ok(out)
            }
        }
    }

    /// [`Scaler::read`] of a Prometheus trigger whose families are all fresh in the cache (every
    /// poll but one per cache time): at once, without a future per family to build and join;
    /// `None` when one of them would be waited for or queried.
    fn read_fresh(&self, config: &TriggerConfig) -> Option<Result<Readings, Error>> {
        let reads = config.reads();
        let mut readings = Vec::with_capacity(reads.signals.len());
        for (&signal, query) in reads.signals.iter().zip(&reads.families) {
            match self.prometheus.fresh_family(query)? {
                Ok(index) => readings.push((signal, index.select(&config.selection))),
                Err(e) => return Some(Err(e.into())),
            }
        }
        Some(Ok(readings))
    }
}

/// Each signal read, with its aggregate (`None`: no series for the selection).
type Readings = Vec<(Signal, Option<crate::sources::Aggregate>)>;

fn selection_text(s: &Selection) -> String {
    s.to_string()
}

/// Loads the TLS files named by the options (`None`: plaintext); their certificate's expiry is
/// reported in `metrics`.
pub fn load_tls(
    args: &ScalerArgs,
    metrics: &TlsMetrics,
) -> Result<Option<Arc<ServerTls>>, StartError> {
    match (&args.scaler_tls_cert, &args.scaler_tls_key) {
        (Some(cert), Some(key)) => Ok(Some(tls::load(
            cert,
            key,
            args.scaler_tls_client_ca.as_deref(),
            metrics,
        )?)),
        _ => Ok(None),
    }
}

/// Starts the scaler as a component of the process: registers metrics, readiness and admin
/// routes, binds the gRPC port and spawns the server. Returns the scaler, whose latest decisions
/// the researchers' view reads and whose evaluations the pool's reclaim notices use when they
/// run in the same process.
pub async fn start(args: ScalerArgs, ctx: &mut Context) -> Result<Arc<Scaler>, StartError> {
    let ScalerArgs {
        scaler_addr,
        scaler_cache_ttl,
        scaler_stream_interval,
        scaler_forecast_prometheus,
        ..
    } = args.clone();
    let tls = load_tls(&args, &ctx.tls_metrics)?;
    let source_metrics = SourceMetrics::default();
    source_metrics.register(&mut ctx.registry);
    let scaler_metrics = metrics::ScalerMetrics::default();
    scaler_metrics.register(&mut ctx.registry);
    if ctx.kube.is_none() {
        tracing::warn!(
            "no Kubernetes connection: scaler triggers with `service` are off (they answer \
             FAILED_PRECONDITION); `serverAddress` and `endpoints` triggers work"
        );
    }
    let scaler = Arc::new(Scaler::new(
        Options {
            cache_ttl: scaler_cache_ttl,
            stream_interval: scaler_stream_interval,
            policy: args.policy.policy(),
            forecast: ForecastOptions {
                prometheus: scaler_forecast_prometheus
                    .map(|a| a.trim().trim_end_matches('/').to_string())
                    .filter(|a| !a.is_empty()),
                ..ForecastOptions::default()
            },
        },
        ctx.kube.clone(),
        source_metrics,
        scaler_metrics,
        ctx.supervisor.shutdown_token(),
    )?);
    ctx.add_admin_routes(scaler.decisions().routes());
    let shared = scaler.clone();
    let ready = ctx.readiness.register("scaler gRPC server");
    let listener = tokio::net::TcpListener::bind(scaler_addr)
        .await
        .map_err(|source| StartError::Bind {
            addr: scaler_addr,
            source,
        })?;
    let token = ctx.supervisor.shutdown_token();
    if let Some(tls) = &tls {
        ctx.registry.register(
            "scaler_tls_reloads",
            "Times rotated scaler TLS files (certificate, key, client CA) were loaded from disk",
            tls.reloads(),
        );
        let (tls, t) = (tls.clone(), token.clone());
        let interval = args.scaler_tls_reload_interval;
        ctx.supervisor.spawn("scaler-tls-reload", async move {
            tls.watch(interval, t).await;
            Ok(())
        });
    }
    ctx.supervisor.spawn("scaler", async move {
        ready.set(true);
        service::serve(listener, scaler, tls, service::Limits::default(), token).await?;
        Ok(())
    });
    Ok(shared)
}
