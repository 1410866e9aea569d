//! The scaler's forecasts: one [`DailyShape`] per ScaledObject whose trigger has
//! `forecast: daily`, fed the *measured* demand at each evaluation, asked for the demand expected
//! one lead time ahead, and rebuilt after a start from Prometheus when one is configured.
//!
//! The shape itself is the pure [`crate::core::forecast`] model, the one the simulator runs. This
//! module owns what surrounds it in the live scaler: the wall clock (injectable, see [`Clock`]),
//! the map of shapes (dropped with the ScaledObject's other state when it is no longer
//! evaluated), and the rebuild.
//!
//! # Rebuild
//!
//! On the first evaluation of a forecast-enabled ScaledObject, when `--scaler-forecast-prometheus`
//! is set, a task (off the request path, bounded by [`REBUILD_TIMEOUT`]) reads the last
//! `days_kept` days of nightshift's own measured-demand gauge for exactly that namespace and name,
//! and the service the trigger reads now (`TriggerConfig::service`: what another model or
//! Service measured before a change does not enter the shape):
//!
//! ```text
//! max(max_over_time(nightshift_scaler_measured_demand_replicas{namespace="NS",scaled_object="NAME",service="SERVICE"}[300s]))
//! ```
//!
//! with a step of one bucket (each point is the peak of the bucket that ends there; `max` across
//! scaler replicas). Only the ScaledObject's own namespace and name enter the query, quoted,
//! beside the service's fingerprint (hex digits); no author-supplied PromQL or address is used.
//! A failed rebuild is logged, counted
//! (`nightshift_scaler_forecast_rebuilds_total{outcome="failed"}`) and shown in the explanation;
//! the shape then learns from live evaluations only. Evaluations never wait for it.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use jiff::Timestamp;
use tokio_util::sync::CancellationToken;

use super::{
    explain::ForecastView,
    metrics::{MEASURED_DEMAND, ScalerMetrics, service_label},
};
use crate::{
    core::forecast::{DailyShape, ForecastConfig, with_forecast},
    runtime::admin::METRICS_PREFIX,
    sources::history::{HistoryError, HistoryReader},
};

/// Bound on one rebuild: a healthy Prometheus answers a 14-day range query of one series at
/// 5-minute steps (4,032 points) well within a second; a hung one must not hold a task for long.
pub const REBUILD_TIMEOUT: Duration = Duration::from_secs(30);

/// The wall clock the forecasts read (Unix time). The system clock in production; tests set
/// their own to replay days of history in moments.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> Timestamp + Send + Sync>);

impl Clock {
    /// The system's clock.
    pub fn system() -> Clock {
        Clock(Arc::new(Timestamp::now))
    }

    /// A clock reading `now`.
    pub fn from_fn(now: impl Fn() -> Timestamp + Send + Sync + 'static) -> Clock {
        Clock(Arc::new(now))
    }

    /// The time now.
    pub fn now(&self) -> Timestamp {
        (self.0)()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the time: a test's clock may be mid-update while options are printed.
        f.write_str("Clock")
    }
}

/// How the scaler runs forecasts.
#[derive(Clone, Debug)]
pub struct ForecastOptions {
    /// Prometheus that scrapes nightshift, to rebuild shapes from after a start; `None`: shapes
    /// learn from live evaluations only.
    pub prometheus: Option<String>,
    /// Bound on one rebuild.
    pub rebuild_timeout: Duration,
    /// The model's tunables.
    pub config: ForecastConfig,
    /// The wall clock.
    pub clock: Clock,
}

impl Default for ForecastOptions {
    fn default() -> Self {
        ForecastOptions {
            prometheus: None,
            rebuild_timeout: REBUILD_TIMEOUT,
            config: ForecastConfig::default(),
            clock: Clock::system(),
        }
    }
}

/// Why a rebuild failed.
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error("the scaler is shutting down")]
    ShuttingDown,
}

/// Where a shape's history comes from.
#[derive(Clone, Debug, PartialEq)]
enum History {
    /// No Prometheus configured: learned from live evaluations since the scaler started.
    Live,
    /// The rebuild from Prometheus is running.
    Rebuilding,
    /// Rebuilt from Prometheus with this many points, then live.
    Rebuilt(usize),
    /// The rebuild failed (why); live evaluations only.
    Failed(String),
    /// The trigger was changed to read another service: learned from live evaluations since
    /// (the history in Prometheus is the old service's).
    Changed,
}

impl fmt::Display for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            History::Live => f.write_str("live evaluations since the scaler started"),
            History::Rebuilding => f.write_str("rebuilding from Prometheus; live evaluations"),
            History::Rebuilt(points) => write!(
                f,
                "rebuilt from Prometheus ({points} points), then live evaluations"
            ),
            History::Changed => {
                f.write_str("live evaluations since the trigger started reading this service")
            }
            History::Failed(why) => write!(
                f,
                "live evaluations since the scaler started (rebuild from Prometheus failed: {why})"
            ),
        }
    }
}

struct Entry {
    /// The service of the trigger the shape learned from (`TriggerConfig::service`).
    service: u64,
    shape: DailyShape,
    history: History,
}

/// (namespace, name) of a ScaledObject.
type Key = (String, String);

/// The shapes of the forecast-enabled ScaledObjects; cheap to share.
pub struct Forecasts {
    options: ForecastOptions,
    entries: Arc<Mutex<HashMap<Key, Entry>>>,
    metrics: ScalerMetrics,
    shutdown: CancellationToken,
}

impl Forecasts {
    pub fn new(
        options: ForecastOptions,
        metrics: ScalerMetrics,
        shutdown: CancellationToken,
    ) -> Self {
        Forecasts {
            options,
            entries: Arc::new(Mutex::new(HashMap::new())),
            metrics,
            shutdown,
        }
    }

    /// Records `measured` demand for the ScaledObject, whose trigger reads `service`
    /// (`TriggerConfig::service`), now and answers what to report: max(measured, demand
    /// expected within `lead`), with the explanation. The first call for a ScaledObject starts
    /// its shape (and its rebuild); a trigger changed to read another service starts a new shape,
    /// from live evaluations only.
    pub fn apply(
        &self,
        namespace: &str,
        name: &str,
        service: u64,
        lead: Duration,
        measured: f64,
    ) -> (f64, ForecastView) {
        let now = seconds(self.options.clock.now());
        let key = (namespace.to_string(), name.to_string());
        let mut entries = self.lock();
        let fresh = |history| Entry {
            service,
            shape: DailyShape::new(self.options.config),
            history,
        };
        let entry = match entries.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let entry = e.into_mut();
                if entry.service != service {
                    *entry = fresh(History::Changed);
                }
                entry
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(fresh(self.start_rebuild(namespace, name, service)))
            }
        };
        entry.shape.observe(now, measured);
        let expected = entry.shape.expected(now, lead.as_secs_f64());
        let (reported, decided) = with_forecast(measured, expected);
        let view = ForecastView {
            measured: Some(measured),
            expected,
            lead_seconds: lead.as_secs_f64(),
            days_learned: entry.shape.days_learned(),
            decided,
            history: entry.history.to_string(),
        };
        (reported, view)
    }

    /// The explanation when the source read failed: the error is answered, the forecast neither
    /// learns nor answers (see `docs/scaler.md`, Forecast).
    pub fn unavailable(&self, namespace: &str, name: &str, lead: Duration) -> ForecastView {
        let entries = self.lock();
        let entry = entries.get(&(namespace.to_string(), name.to_string()));
        ForecastView {
            measured: None,
            expected: None,
            lead_seconds: lead.as_secs_f64(),
            days_learned: entry.map_or(0, |e| e.shape.days_learned()),
            decided: false,
            history: entry.map_or_else(|| "none yet".to_string(), |e| e.history.to_string()),
        }
    }

    /// Drops the shape of a ScaledObject that is no longer evaluated (or no longer forecasts).
    pub fn forget(&self, namespace: &str, name: &str) {
        let mut entries = self.lock();
        if !entries.is_empty() {
            entries.remove(&(namespace.to_string(), name.to_string()));
        }
    }

    /// ScaledObjects with a shape.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Spawns the rebuild of a new shape when a Prometheus is configured; its history's origin.
    fn start_rebuild(&self, namespace: &str, name: &str, service: u64) -> History {
        let Some(address) = self.options.prometheus.clone() else {
            return History::Live;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return History::Failed("no async runtime to query Prometheus from".into());
        };
        let key = (namespace.to_string(), name.to_string());
        let entries = self.entries.clone();
        let metrics = self.metrics.clone();
        let shutdown = self.shutdown.clone();
        let (config, timeout) = (self.options.config, self.options.rebuild_timeout);
        let now = self.options.clock.now();
        runtime.spawn(async move {
            let read = tokio::select! {
                read = read_history(&address, &key, service, config, now, timeout) => read,
                () = shutdown.cancelled() => Err(RebuildError::ShuttingDown),
            };
            metrics.rebuild(read.is_ok());
            let mut entries = entries.lock().unwrap_or_else(|p| p.into_inner());
            // Forgotten, or changed to another service, meanwhile: nothing to fill.
            let Some(entry) = entries.get_mut(&key).filter(|e| e.service == service) else {
                return;
            };
            match read {
                Ok(points) => {
                    for &(t, replicas) in &points {
                        entry.shape.observe(t, replicas);
                    }
                    tracing::info!(namespace = %key.0, scaled_object = %key.1, points = points.len(), "forecast rebuilt from Prometheus");
                    entry.history = History::Rebuilt(points.len());
                }
                Err(e) => {
                    tracing::warn!(namespace = %key.0, scaled_object = %key.1, error = %e, "could not rebuild the forecast from Prometheus; it learns from live evaluations");
                    entry.history = History::Failed(e.to_string());
                }
            }
        });
        History::Rebuilding
    }
}

/// Unix seconds of `t`, with milliseconds.
fn seconds(t: Timestamp) -> f64 {
    t.as_millisecond() as f64 / 1000.0
}

/// The PromQL of a ScaledObject's measured demand of `service`, one point per bucket holding the
/// bucket's peak (the latest `scaler_measured_demand_replicas` of every scaler replica, the
/// highest).
pub fn history_query(namespace: &str, name: &str, service: u64, bucket_s: f64) -> String {
    format!(
        "max(max_over_time({METRICS_PREFIX}_{MEASURED_DEMAND}{{namespace=\"{}\",scaled_object=\"{}\",service=\"{}\"}}[{}s]))",
        quote(namespace),
        quote(name),
        service_label(service),
        bucket_s.round().max(1.0)
    )
}

/// `s` escaped for a PromQL double-quoted string.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Reads the last `days_kept` days before `now` of the ScaledObject's measured demand: (time in
/// the bucket, replicas) pairs. An unusable value fails the rebuild, as for the view's.
async fn read_history(
    address: &str,
    (namespace, name): &Key,
    service: u64,
    config: ForecastConfig,
    now: Timestamp,
    timeout: Duration,
) -> Result<Vec<(f64, f64)>, RebuildError> {
    let config = config.sanitized();
    let reader = HistoryReader::new(address, timeout)?;
    let query = history_query(namespace, name, service, config.bucket_s);
    let step = config.bucket_s.round().max(1.0) as i64;
    // Each point at t covers (t - step, t]: aligned on buckets, the bucket that ends at t.
    let end = now.as_second().div_euclid(step) * step;
    let start = end - config.days_kept as i64 * 86_400 + step;
    let series = tokio::time::timeout(timeout, reader.range(&query, start, end, step))
        .await
        .map_err(|_| HistoryError::Timeout {
            address: address.to_string(),
            after: timeout,
        })??;
    let half = step as f64 / 2.0;
    Ok(series
        .into_iter()
        .flat_map(|(_, values)| values)
        .map(|(t, v)| (t as f64 - half, v))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_query_names_only_the_scaled_object() {
        assert_eq!(
            history_query("team-a", "llama", 0x1f, 300.0),
            "max(max_over_time(nightshift_scaler_measured_demand_replicas{namespace=\"team-a\",\
             scaled_object=\"llama\",service=\"000000000000001f\"}[300s]))"
        );
        // Whatever a name holds stays inside its quoted label value.
        let q = history_query("a\"} or vector(1) #", "b\\", u64::MAX, 300.0);
        assert!(q.contains("namespace=\"a\\\"} or vector(1) #\""), "{q}");
        assert!(q.contains("scaled_object=\"b\\\\\""), "{q}");
    }

    #[tokio::test]
    async fn a_shape_learns_reports_and_is_forgotten() {
        let t0 = Timestamp::from_second(1_800_000_000).expect("timestamp");
        let at = Arc::new(Mutex::new(t0));
        let clock = {
            let at = at.clone();
            Clock::from_fn(move || *at.lock().unwrap_or_else(|p| p.into_inner()))
        };
        let forecasts = Forecasts::new(
            ForecastOptions {
                clock,
                ..ForecastOptions::default()
            },
            ScalerMetrics::default(),
            CancellationToken::new(),
        );
        let lead = Duration::from_secs(180);
        let (reported, view) = forecasts.apply("ns", "so", 1, lead, 4.0);
        assert_eq!(reported, 4.0);
        assert!(!view.decided && view.expected.is_none());
        assert_eq!(view.history, History::Live.to_string());
        // A day later at the same time, demand is lower: the forecast answers yesterday's.
        *at.lock().unwrap_or_else(|p| p.into_inner()) = t0 + jiff::SignedDuration::from_hours(24);
        let (reported, view) = forecasts.apply("ns", "so", 1, lead, 1.0);
        assert_eq!((reported, view.decided, view.days_learned), (4.0, true, 2));
        assert_eq!(view.measured, Some(1.0));
        assert_eq!(forecasts.unavailable("ns", "so", lead).days_learned, 2);
        // The trigger now reads another service: yesterday's shape is not its shape.
        let (reported, view) = forecasts.apply("ns", "so", 2, lead, 1.0);
        assert_eq!((reported, view.decided, view.days_learned), (1.0, false, 1));
        assert_eq!(view.history, History::Changed.to_string());
        forecasts.forget("ns", "so");
        assert!(forecasts.is_empty());
    }
}
