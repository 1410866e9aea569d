//! Turns a trigger's `metadata` map (KEDA's `scalerMetadata`) into a typed [`TriggerConfig`].
//!
//! Every key is in one table ([`keys::KEYS`]): an unknown key, or a key set for a source it does
//! not apply to, is rejected from the table; a malformed value is rejected by the sub-parser of
//! its source, with a message naming the key and what is wrong, all problems at once. Keys KEDA
//! itself reads for the connection to this scaler are tolerated and ignored. A key `xFromEnv`
//! (resolved by KEDA from the workload's environment) stands for `x`.

pub mod keys;

use std::{
    collections::{BTreeMap, HashMap},
    hash::{Hash, Hasher},
    sync::Arc,
    time::Duration,
};

use keys::SourceKind;

use crate::{
    core::demand::{DEFAULT_UTILIZATION, Signal, Targets},
    sources::{
        Selection,
        prometheus::{Auth, Labels, Server, ServerQuery},
        target::{Pods, Target},
    },
};

// The defaults a trigger shares with the simulator live in `core`, which both build on.
pub use crate::core::{
    demand::{DEFAULT_RATE_WINDOW, LEARNED_WAITING_TARGET},
    forecast::DEFAULT_FORECAST_LEAD,
};

/// Default bound on one upstream request: well inside KEDA's polling interval, and long enough
/// for a loaded Prometheus answering a grouped query.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
/// Upper bound accepted for `timeout`: KEDA has no per-call deadline, so an upstream slower than
/// this would stall scaling decisions; failing (and letting `fallback` apply) is better.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// Upper bound accepted for `rateWindow`: an hour-long rate no longer follows load at all.
const MAX_RATE_WINDOW: Duration = Duration::from_secs(3600);
/// Upper bound accepted for `forecastLead`: looking further ahead holds replicas for a ramp an
/// hour away, which is lending capacity to nobody; no replica starts that slowly.
const MAX_FORECAST_LEAD: Duration = Duration::from_secs(3600);

/// Keys KEDA reads for its own connection to the scaler; they reach us too and are ignored.
const KEDA_KEYS: &[&str] = &[
    "scalerAddress",
    "enableTLS",
    "unsafeSsl",
    "caCert",
    "tlsClientCert",
    "tlsClientKey",
    "tlsCertFile",
    "metricType",
];

/// What an empty result (no series for the model) means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmptyResult {
    /// An error: KEDA's `fallback` applies. The safe default.
    Error,
    /// No demand: for models that are scaled to zero and so expose no metrics.
    Zero,
}

/// Where a trigger's metrics come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    Prometheus { server: Server, labels: Labels },
    Scrape(Target),
}

/// A raw PromQL query and its per-replica target.
#[derive(Clone, Debug, PartialEq)]
pub struct RawQuery {
    pub query: String,
    pub target: f64,
}

/// A trigger's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct TriggerConfig {
    pub source: Source,
    pub selection: Selection,
    /// Per-replica targets for the vLLM signals (empty when `query` is used).
    pub targets: Targets,
    pub query: Option<RawQuery>,
    pub activation_threshold: f64,
    pub empty_result: EmptyResult,
    pub rate_window: Duration,
    /// The daily forecast, when `forecast: daily`.
    pub forecast: Option<Forecast>,
    /// Token targets learned from the service's own metrics, when `capacity: learned` (the
    /// default of a trigger without targets and `query`).
    pub capacity: Option<LearnedCapacity>,
    /// [`Self::service`], computed once when the metadata is read (a trigger is admitted once
    /// and evaluated at every poll).
    service: u64,
    /// [`Self::reads`], worked out once when the metadata is read, as `service` is.
    reads: Reads,
}

/// What every evaluation of a trigger reads, and the words its decision names the source with.
#[derive(Clone, Debug, PartialEq)]
pub struct Reads {
    /// The signals read, in [`Signal::ALL`]'s order: those with a target and, with learned
    /// capacity, the queue and both token rates the learner reads (none with a raw `query`).
    pub signals: Vec<Signal>,
    /// For a Prometheus source, each of `signals`' family query, in the same order.
    pub families: Vec<ServerQuery>,
    /// For a Prometheus source, the raw `query`, if one is set.
    pub raw: Option<ServerQuery>,
    /// The source in words, as decisions and errors name it.
    pub source_name: Arc<str>,
}

impl Reads {
    fn of(
        source: &Source,
        targets: &Targets,
        capacity: Option<LearnedCapacity>,
        query: Option<&RawQuery>,
        rate_window: Duration,
    ) -> Self {
        let mut signals: Vec<Signal> = targets.configured().collect();
        if capacity.is_some() {
            signals.extend([
                Signal::Waiting,
                Signal::GenerationTokens,
                Signal::PromptTokens,
            ]);
            signals.sort();
            signals.dedup();
        }
        let (families, raw, source_name) = match source {
            Source::Prometheus { server, labels } => (
                signals
                    .iter()
                    .map(|&signal| ServerQuery::family(server, labels, signal, rate_window))
                    .collect(),
                query.map(|q| ServerQuery::new(server.clone(), q.query.clone())),
                format!("Prometheus {}", server.address),
            ),
            Source::Scrape(target) => (Vec::new(), None, target.describe()),
        };
        Self {
            signals,
            families,
            raw,
            source_name: source_name.into(),
        }
    }
}

impl TriggerConfig {
    /// Which service the trigger reads, as a fingerprint: its model selection, its label
    /// matchers and, for a Service's pods, that Service. What the scaler learns of a service
    /// (its capacity, its daily shape) depends on the model and the traffic behind these, not on
    /// where the metrics are read: a new Prometheus address or a longer static list of pods is
    /// the same service, another model or Service is not.
    ///
    /// FNV-1a of those fields, the same in every process and release built for the same
    /// platform (std's default hasher may change between Rust releases): the measured demand is
    /// exported with it, and a forecast's rebuild after a restart selects it.
    pub fn service(&self) -> u64 {
        self.service
    }

    /// What every evaluation reads: the signals, their queries, the source in words.
    pub fn reads(&self) -> &Reads {
        &self.reads
    }
}

/// [`TriggerConfig::service`] of a trigger with this model selection and source.
fn fingerprint(selection: &Selection, source: &Source) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    selection.hash(&mut hasher);
    match source {
        Source::Prometheus { labels, .. } => labels.matchers.hash(&mut hasher),
        Source::Scrape(target) => {
            target.matchers.hash(&mut hasher);
            if let Pods::Service {
                namespace, name, ..
            } = &target.pods
            {
                (namespace, name).hash(&mut hasher);
            }
        }
    }
    hasher.finish()
}

/// A trigger's learned capacity: its token-rate targets are `utilization ×` the per-replica
/// capacity the scaler learns (see [`crate::core::capacity`]); targets set by hand win.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LearnedCapacity {
    /// `capacityUtilization`, in (0, 1].
    pub utilization: f64,
}

/// The `forecast` signal of a trigger: report max(measured, the demand the service's daily
/// shape expects within `lead`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forecast {
    /// How far ahead the forecast looks (`forecastLead`).
    pub lead: Duration,
}

/// A trigger's metadata table as KEDA sends it (`scalerMetadata`), ordered by key: an
/// evaluation compares the table of each request with the one its trigger was admitted from,
/// which an ordered map does in one pass, without hashing.
pub type Table = BTreeMap<String, String>;

/// Invalid metadata: every problem, each naming its key.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("invalid scaler metadata: {}", .problems.join("; "))]
pub struct MetadataError {
    pub problems: Vec<String>,
}

/// Parses the metadata of a trigger of the ScaledObject in `scaled_object_namespace`.
pub fn parse(raw: &Table, scaled_object_namespace: &str) -> Result<TriggerConfig, MetadataError> {
    let mut r = Reader::new(raw);
    let common = common(&mut r, scaled_object_namespace);
    let source = source_kind(&mut r).map(|kind| {
        r.check_placement(kind);
        match kind {
            SourceKind::Prometheus => prometheus(&mut r, &common),
            SourceKind::Service => {
                let pods = service_pods(&mut r, &common.namespace);
                scrape(&mut r, pods, &common)
            }
            SourceKind::Endpoints => {
                let pods = endpoint_pods(&mut r);
                scrape(&mut r, pods, &common)
            }
        }
    });
    let demand = demand(&mut r);
    let forecast = forecast(&mut r);
    match source {
        Some(source) if r.problems.is_empty() => {
            let rate_window = common.rate_window;
            let selection = common.selection(&source);
            Ok(TriggerConfig {
                rate_window,
                service: fingerprint(&selection, &source),
                reads: Reads::of(
                    &source,
                    &demand.targets,
                    demand.capacity,
                    demand.query.as_ref(),
                    rate_window,
                ),
                selection,
                source,
                targets: demand.targets,
                query: demand.query,
                activation_threshold: demand.activation_threshold,
                empty_result: demand.empty_result,
                forecast,
                capacity: demand.capacity,
            })
        }
        _ => Err(r.into_error()),
    }
}

/// The keys every source reads.
struct Common {
    timeout: Duration,
    rate_window: Duration,
    matchers: Vec<(String, String)>,
    namespace: String,
    model: Option<String>,
}

impl Common {
    /// The series to read from what `source` returns.
    fn selection(self, source: &Source) -> Selection {
        match source {
            // Direct scrapes already target the right pods.
            Source::Scrape(_) => Selection {
                namespace: None,
                model: self.model,
            },
            Source::Prometheus { .. } => Selection {
                namespace: Some(self.namespace),
                model: self.model,
            },
        }
    }
}

fn common(r: &mut Reader<'_>, scaled_object_namespace: &str) -> Common {
    Common {
        timeout: r.duration("timeout", DEFAULT_TIMEOUT, MAX_TIMEOUT),
        rate_window: r.duration("rateWindow", DEFAULT_RATE_WINDOW, MAX_RATE_WINDOW),
        matchers: r.pairs("metricLabels", is_label_name),
        namespace: r
            .text("namespace")
            .unwrap_or(scaled_object_namespace)
            .to_string(),
        model: r.text("model").map(str::to_string),
    }
}

/// The source the trigger reads: the one source key that is set. Several, or none, is a problem;
/// with several, the first in [`SourceKind::ALL`] is still parsed so its problems show too.
fn source_kind(r: &mut Reader<'_>) -> Option<SourceKind> {
    let chosen: Vec<SourceKind> = SourceKind::ALL
        .into_iter()
        .filter(|s| r.text(s.key()).is_some())
        .collect();
    if chosen.len() > 1 {
        let keys: Vec<&str> = chosen.iter().map(|s| s.key()).collect();
        r.bad(
            &keys.join(", "),
            "set only one source: serverAddress (Prometheus), service or endpoints (direct scrape)",
        );
    }
    if chosen.is_empty() {
        r.bad(
            "serverAddress, service or endpoints",
            "one is required (where to read vLLM metrics)",
        );
    }
    chosen.first().copied()
}

/// The Prometheus source: the server, how to authenticate and which labels to group by.
fn prometheus(r: &mut Reader<'_>, common: &Common) -> Source {
    let address = r.text("serverAddress").unwrap_or_default();
    if !(address.starts_with("http://") || address.starts_with("https://")) {
        r.bad(
            "serverAddress",
            format!("{address:?} must be an http:// or https:// URL"),
        );
    }
    let auth = prometheus_auth(r);
    let headers = r.pairs("customHeaders", is_header_name);
    let ca_cert = r.text("prometheusCaCert").map(str::to_string);
    if let Some(pem) = &ca_cert
        && !pem.contains("-----BEGIN CERTIFICATE-----")
    {
        r.bad(
            "prometheusCaCert",
            "is not a PEM certificate (-----BEGIN CERTIFICATE-----)",
        );
    }
    let unsafe_ssl = r.boolean("prometheusUnsafeSsl");
    Source::Prometheus {
        server: Server {
            address: address.trim_end_matches('/').to_string(),
            auth,
            headers,
            ca_cert,
            unsafe_ssl,
            timeout: common.timeout,
        },
        labels: Labels {
            namespace_label: r.label_name("namespaceLabel", "namespace"),
            pod_label: r.label_name("podLabel", "pod"),
            matchers: common.matchers.clone(),
        },
    }
}

/// Prometheus authentication: a bearer token, basic credentials, or none.
fn prometheus_auth(r: &mut Reader<'_>) -> Auth {
    match (
        r.text("bearerToken"),
        r.text("username"),
        r.text("password"),
    ) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            r.bad(
                "bearerToken",
                "use either bearerToken or username/password, not both",
            );
            Auth::None
        }
        (Some(token), None, None) => Auth::Bearer(token.to_string()),
        (None, Some(u), Some(p)) => Auth::Basic {
            username: u.to_string(),
            password: p.to_string(),
        },
        (None, Some(_), None) => {
            r.bad("password", "required with username");
            Auth::None
        }
        (None, None, Some(_)) => {
            r.bad("username", "required with password");
            Auth::None
        }
        (None, None, None) => Auth::None,
    }
}

/// A direct scrape of `pods` (those of a `service` or a static `endpoints` list).
fn scrape(r: &mut Reader<'_>, pods: Pods, common: &Common) -> Source {
    let scheme = r.text("scheme").unwrap_or("http").to_string();
    if scheme != "http" && scheme != "https" {
        r.bad("scheme", format!("{scheme:?} must be http or https"));
    }
    let path = r.text("metricsPath").unwrap_or("/metrics").to_string();
    if !path.starts_with('/') {
        r.bad("metricsPath", format!("{path:?} must start with /"));
    }
    Source::Scrape(Target {
        pods,
        scheme,
        path,
        timeout: common.timeout,
        matchers: common.matchers.clone(),
        rate_window: common.rate_window,
    })
}

/// The pods behind `service` in `namespace`.
fn service_pods(r: &mut Reader<'_>, namespace: &str) -> Pods {
    let service = r.text("service").unwrap_or_default();
    let valid = !service.is_empty()
        && service.len() <= 63
        && service
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid {
        r.bad("service", format!("{service:?} is not a Service name"));
    }
    Pods::Service {
        namespace: namespace.to_string(),
        name: service.to_string(),
        port: r.text("port").map(str::to_string),
    }
}

/// The `endpoints` list, sorted and without duplicates.
fn endpoint_pods(r: &mut Reader<'_>) -> Pods {
    let mut list: Vec<String> = r
        .text("endpoints")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    for e in &list {
        if !is_endpoint(e) {
            r.bad("endpoints", format!("{e:?} is not host:port"));
        }
    }
    list.sort();
    list.dedup();
    Pods::Static(list)
}

/// What the trigger asks for: per-replica targets or a raw query, and how to read the outcome.
struct Demand {
    targets: Targets,
    query: Option<RawQuery>,
    activation_threshold: f64,
    empty_result: EmptyResult,
    capacity: Option<LearnedCapacity>,
}

fn demand(r: &mut Reader<'_>) -> Demand {
    let mut targets = Targets::default();
    for signal in Signal::ALL {
        *targets.get_mut(signal) = r.positive(signal.target_key());
    }
    if let Some(kv) = targets.kv_cache
        && kv > 1.0
    {
        r.bad(
            Signal::KvCache.target_key(),
            format!("{kv} is a fraction of the cache and must be ≤ 1"),
        );
    }
    let any_target = targets.configured().next().is_some();
    let query = raw_query(r);
    if r.text("query").is_some() && any_target {
        r.bad(
            "query",
            "replaces the signal targets; remove waitingTarget/runningTarget/kvCacheTarget/generationTokensTarget/promptTokensTarget",
        );
    }
    // A target key that already has a problem (malformed, misspelled, misplaced) says what is
    // wrong; asking for a target on top of it would only repeat it.
    let target_problem = r.problems.iter().any(|(key, _)| key.ends_with("Target"));
    let capacity = capacity(r, any_target || target_problem);
    if r.text("query").is_none() && !any_target && !target_problem && capacity.is_none() {
        let keys: Vec<&str> = Signal::ALL.map(Signal::target_key).to_vec();
        r.bad(
            &keys.join(", "),
            "set at least one per-replica target, capacity: learned, or query with queryTarget",
        );
    }
    if capacity.is_some() && targets.waiting.is_none() {
        targets.waiting = Some(LEARNED_WAITING_TARGET);
    }
    Demand {
        targets,
        query,
        activation_threshold: r.non_negative("activationThreshold", 0.0),
        empty_result: empty_result(r),
        capacity,
    }
}

/// `capacity` and its `capacityUtilization`. Unset, capacity is learned when the trigger sets
/// no target (`has_targets` false) and no `query`: the default trigger needs no per-model
/// numbers.
fn capacity(r: &mut Reader<'_>, has_targets: bool) -> Option<LearnedCapacity> {
    let query = r.text("query").is_some();
    let learned = match r.text("capacity") {
        None => !has_targets && !query,
        Some(v) if v.eq_ignore_ascii_case("learned") => {
            if query {
                r.bad(
                    "capacity",
                    "learned does not apply with query (a raw query has no token rates)",
                );
            }
            !query
        }
        Some(v) if v.eq_ignore_ascii_case("off") => false,
        Some(v) => {
            r.bad("capacity", format!("{v:?} must be learned or off"));
            // Its problem is the one to report, not a missing target.
            return None;
        }
    };
    let utilization = match r.text("capacityUtilization") {
        None => DEFAULT_UTILIZATION,
        Some(raw) => match raw.parse::<f64>() {
            Ok(u) if u.is_finite() && u > 0.0 && u <= 1.0 => u,
            _ => {
                r.bad(
                    "capacityUtilization",
                    format!("{raw:?} must be a fraction above 0 and at most 1"),
                );
                DEFAULT_UTILIZATION
            }
        },
    };
    if !learned && r.text("capacityUtilization").is_some() {
        r.bad(
            "capacityUtilization",
            "only applies with capacity: learned (the default without targets or query)",
        );
    }
    learned.then_some(LearnedCapacity { utilization })
}

/// `query` with its `queryTarget`; each is a problem without the other.
fn raw_query(r: &mut Reader<'_>) -> Option<RawQuery> {
    match (r.text("query"), r.positive("queryTarget")) {
        (Some(q), Some(t)) => Some(RawQuery {
            query: q.to_string(),
            target: t,
        }),
        (Some(_), None) => {
            if r.text("queryTarget").is_none() {
                r.bad("queryTarget", "required with query");
            }
            None
        }
        (None, Some(_)) => {
            r.bad("queryTarget", "only applies with query");
            None
        }
        (None, None) => None,
    }
}

/// `forecast` and its `forecastLead`; a lead without a forecast is a problem.
fn forecast(r: &mut Reader<'_>) -> Option<Forecast> {
    let enabled = match r.text("forecast") {
        None => Some(false),
        Some(v) if v.eq_ignore_ascii_case("off") => Some(false),
        Some(v) if v.eq_ignore_ascii_case("daily") => Some(true),
        Some(v) => {
            r.bad("forecast", format!("{v:?} must be daily or off"));
            None
        }
    };
    let lead = r.duration("forecastLead", DEFAULT_FORECAST_LEAD, MAX_FORECAST_LEAD);
    if enabled == Some(false) && r.text("forecastLead").is_some() {
        r.bad("forecastLead", "only applies with forecast: daily");
    }
    (enabled == Some(true)).then_some(Forecast { lead })
}

fn empty_result(r: &mut Reader<'_>) -> EmptyResult {
    match r.text("emptyResult") {
        None => EmptyResult::Error,
        Some(v) if v.eq_ignore_ascii_case("error") => EmptyResult::Error,
        Some(v) if v.eq_ignore_ascii_case("zero") => EmptyResult::Zero,
        Some(v) => {
            r.bad("emptyResult", format!("{v:?} must be error or zero"));
            EmptyResult::Error
        }
    }
}

/// The metadata map with `FromEnv` keys resolved, and the problems found so far, each with the
/// key it is about.
struct Reader<'a> {
    map: HashMap<&'a str, &'a str>,
    problems: Vec<(String, String)>,
}

impl<'a> Reader<'a> {
    /// Keeps the keys of the table, ignores KEDA's own and reports every other.
    fn new(raw: &'a Table) -> Self {
        let mut reader = Self {
            map: HashMap::new(),
            problems: Vec::new(),
        };
        for (k, v) in raw {
            let base = k.strip_suffix("FromEnv").unwrap_or(k);
            if KEDA_KEYS.contains(&base) {
                continue;
            }
            if keys::find(base).is_none() {
                let hint = keys::KEYS
                    .iter()
                    .find(|key| key.name.eq_ignore_ascii_case(base))
                    .map(|key| format!(" (did you mean {}?)", key.name))
                    .unwrap_or_default();
                reader.bad(k, format!("unknown key{hint}"));
                continue;
            }
            // The plain key wins over its FromEnv form.
            if k.as_str() == base || !raw.contains_key(base) {
                reader.map.insert(base, v.as_str());
            }
        }
        reader
    }

    /// Reports every key that is set but does not apply to `source`. The source keys themselves
    /// are left to [`source_kind`].
    fn check_placement(&mut self, source: SourceKind) {
        for key in keys::KEYS {
            let selects_source = SourceKind::ALL.iter().any(|s| s.key() == key.name);
            if !selects_source && !key.applies.includes(source) && self.text(key.name).is_some() {
                self.bad(key.name, key.applies.misplaced(source));
            }
        }
    }

    fn into_error(self) -> MetadataError {
        let mut problems: Vec<String> = self
            .problems
            .into_iter()
            .map(|(key, msg)| format!("{key}: {msg}"))
            .collect();
        problems.sort();
        MetadataError { problems }
    }

    fn text(&self, key: &str) -> Option<&'a str> {
        self.map
            .get(key)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    fn bad(&mut self, key: &str, msg: impl std::fmt::Display) {
        self.problems.push((key.to_string(), msg.to_string()));
    }

    fn positive(&mut self, key: &str) -> Option<f64> {
        let raw = self.text(key)?;
        match raw.parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 => Some(v),
            _ => {
                self.bad(key, format!("{raw:?} is not a positive number"));
                None
            }
        }
    }

    fn non_negative(&mut self, key: &str, default: f64) -> f64 {
        let Some(raw) = self.text(key) else {
            return default;
        };
        match raw.parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => v,
            _ => {
                self.bad(key, format!("{raw:?} is not a number ≥ 0"));
                default
            }
        }
    }

    fn boolean(&mut self, key: &str) -> bool {
        match self.text(key) {
            None => false,
            Some(v) if v.eq_ignore_ascii_case("true") => true,
            Some(v) if v.eq_ignore_ascii_case("false") => false,
            Some(v) => {
                self.bad(key, format!("{v:?} is not true or false"));
                false
            }
        }
    }

    fn duration(&mut self, key: &str, default: Duration, max: Duration) -> Duration {
        let Some(raw) = self.text(key) else {
            return default;
        };
        match crate::core::duration::parse_duration(raw) {
            Ok(d) if d.is_zero() => {
                self.bad(key, "must be longer than zero");
                default
            }
            Ok(d) if d > max => {
                self.bad(key, format!("{raw} is longer than the allowed {max:?}"));
                default
            }
            Ok(d) => d,
            Err(e) => {
                self.bad(key, e);
                default
            }
        }
    }

    fn pairs(&mut self, key: &str, validate_key: fn(&str) -> bool) -> Vec<(String, String)> {
        let Some(raw) = self.text(key) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for item in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((k, v)) = item.split_once('=') else {
                self.bad(key, format!("{item:?} is not key=value"));
                continue;
            };
            let (k, v) = (k.trim(), v.trim().trim_matches('"'));
            if !validate_key(k) {
                self.bad(key, format!("{k:?} is not a valid name"));
                continue;
            }
            out.push((k.to_string(), v.to_string()));
        }
        out.sort();
        out
    }

    /// A Prometheus label name, `default` when unset.
    fn label_name(&mut self, key: &str, default: &str) -> String {
        let v = self.text(key).unwrap_or(default).to_string();
        if !is_label_name(&v) {
            self.bad(key, format!("{v:?} is not a valid Prometheus label name"));
        }
        v
    }
}

/// A Prometheus label name: `[a-zA-Z_][a-zA-Z0-9_]*`.
fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// An HTTP header name (RFC 9110 token).
fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
}

/// A `host:port` endpoint.
fn is_endpoint(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok()
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> Table {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ok(pairs: &[(&str, &str)]) -> TriggerConfig {
        parse(&meta(pairs), "team-a").expect("valid metadata")
    }

    #[test]
    fn the_service_is_the_model_and_service_read_not_the_address() {
        let prometheus = |address: &str, model: &str| {
            ok(&[("serverAddress", address), ("model", model)]).service()
        };
        let p = prometheus("http://prometheus:9090", "llama");
        assert_eq!(p, prometheus("http://thanos:9090", "llama"));
        assert_ne!(p, prometheus("http://prometheus:9090", "mistral"));
        let pods = |endpoints: &str| ok(&[("endpoints", endpoints), ("model", "llama")]).service();
        assert_eq!(pods("10.0.0.1:8000"), pods("10.0.0.1:8000,10.0.0.2:8000"));
        let service = |name: &str| ok(&[("service", name), ("model", "llama")]).service();
        assert_ne!(service("vllm-a"), service("vllm-b"));
    }

    #[test]
    fn the_service_fingerprint_does_not_change_between_builds() {
        // Exported as a label and selected by a forecast's rebuild after a restart, possibly by
        // a newer nightshift: a change here loses every forecast's history at the upgrade.
        let p = ok(&[
            ("serverAddress", "http://prometheus:9090"),
            ("model", "llama"),
        ]);
        assert_eq!(format!("{:016x}", p.service()), "b88dcfa634c87c73");
    }

    fn err(pairs: &[(&str, &str)]) -> String {
        parse(&meta(pairs), "team-a")
            .expect_err("invalid metadata")
            .to_string()
    }

    #[test]
    fn prometheus_trigger_with_defaults() {
        let c = ok(&[
            ("serverAddress", "http://prom:9090/"),
            ("model", "llama"),
            ("waitingTarget", "5"),
            ("kvCacheTarget", "0.8"),
        ]);
        let Source::Prometheus { server, labels } = &c.source else {
            panic!("expected Prometheus, got {:?}", c.source);
        };
        assert_eq!(server.address, "http://prom:9090");
        assert_eq!(server.timeout, DEFAULT_TIMEOUT);
        assert_eq!(server.auth, Auth::None);
        assert_eq!(labels.namespace_label, "namespace");
        assert_eq!(labels.pod_label, "pod");
        assert_eq!(c.selection.namespace.as_deref(), Some("team-a"));
        assert_eq!(c.selection.model.as_deref(), Some("llama"));
        assert_eq!(c.targets.waiting, Some(5.0));
        assert_eq!(c.targets.kv_cache, Some(0.8));
        assert_eq!(c.targets.running, None);
        assert_eq!(c.empty_result, EmptyResult::Error);
        assert_eq!(c.activation_threshold, 0.0);
        assert_eq!(c.rate_window, DEFAULT_RATE_WINDOW);
    }

    #[test]
    fn forecast_is_off_unless_daily_and_its_lead_is_checked() {
        let base = [
            ("serverAddress", "http://prom:9090"),
            ("waitingTarget", "5"),
        ];
        assert_eq!(ok(&base).forecast, None);
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut pairs = base.to_vec();
            pairs.extend_from_slice(extra);
            pairs
        };
        assert_eq!(ok(&with(&[("forecast", "off")])).forecast, None);
        assert_eq!(
            ok(&with(&[("forecast", "daily")])).forecast,
            Some(Forecast {
                lead: DEFAULT_FORECAST_LEAD
            })
        );
        assert_eq!(
            ok(&with(&[("forecast", "Daily"), ("forecastLead", "90s")])).forecast,
            Some(Forecast {
                lead: Duration::from_secs(90)
            })
        );
        for (pairs, problem) in [
            (
                with(&[("forecast", "weekly")]),
                "forecast: \"weekly\" must be daily or off",
            ),
            (
                with(&[("forecastLead", "3m")]),
                "forecastLead: only applies with forecast",
            ),
            (
                with(&[("forecast", "off"), ("forecastLead", "3m")]),
                "forecastLead: only applies with forecast",
            ),
            (
                with(&[("forecast", "daily"), ("forecastLead", "0s")]),
                "forecastLead: must be longer than zero",
            ),
            (
                with(&[("forecast", "daily"), ("forecastLead", "2h")]),
                "forecastLead: 2h is longer than the allowed",
            ),
            (
                with(&[("forecast", "daily"), ("forecastLead", "soon")]),
                "forecastLead: ",
            ),
        ] {
            let e = err(&pairs);
            assert!(e.contains(problem), "{pairs:?}: {e}");
        }
    }

    #[test]
    fn what_each_evaluation_reads_is_worked_out_once() {
        let c = ok(&[
            ("serverAddress", "http://prom:9090"),
            ("model", "llama"),
            ("kvCacheTarget", "0.8"),
            ("waitingTarget", "5"),
        ]);
        let reads = c.reads();
        assert_eq!(reads.signals, vec![Signal::Waiting, Signal::KvCache]);
        let Source::Prometheus { server, labels } = &c.source else {
            panic!("expected Prometheus");
        };
        let queries: Vec<&str> = reads.families.iter().map(ServerQuery::query).collect();
        assert_eq!(
            queries,
            [Signal::Waiting, Signal::KvCache]
                .map(|s| crate::sources::prometheus::family_query(s, labels, "60s"))
        );
        assert!(reads.families.iter().all(|q| q.server() == server));
        assert_eq!(reads.raw, None);
        assert_eq!(&*reads.source_name, "Prometheus http://prom:9090");

        // Learned capacity reads the queue and both token rates, each once, in order.
        let c = ok(&[
            ("serverAddress", "http://prom:9090"),
            ("waitingTarget", "5"),
            ("capacity", "learned"),
            ("rateWindow", "2m"),
        ]);
        assert_eq!(
            c.reads().signals,
            vec![
                Signal::Waiting,
                Signal::GenerationTokens,
                Signal::PromptTokens
            ]
        );
        assert!(c.reads().families[1].query().contains("[120s]"));

        // A raw query reads no family.
        let c = ok(&[
            ("serverAddress", "http://prom:9090"),
            ("query", "sum(x)"),
            ("queryTarget", "10"),
        ]);
        assert!(c.reads().signals.is_empty() && c.reads().families.is_empty());
        assert_eq!(
            c.reads().raw.as_ref().map(ServerQuery::query),
            Some("sum(x)")
        );

        // A scrape has no query at all.
        let c = ok(&[("endpoints", "10.0.0.1:8000"), ("runningTarget", "16")]);
        assert_eq!(c.reads().signals, vec![Signal::Running]);
        assert!(c.reads().families.is_empty() && c.reads().raw.is_none());
        assert_eq!(&*c.reads().source_name, "endpoints 10.0.0.1:8000");
    }

    #[test]
    fn scrape_trigger_from_service_or_endpoints() {
        let c = ok(&[
            ("service", "llama-vllm"),
            ("port", "http"),
            ("namespace", "inference"),
            ("runningTarget", "16"),
            ("timeout", "500ms"),
        ]);
        let Source::Scrape(t) = &c.source else {
            panic!("expected scrape");
        };
        assert_eq!(
            t.pods,
            Pods::Service {
                namespace: "inference".into(),
                name: "llama-vllm".into(),
                port: Some("http".into())
            }
        );
        assert_eq!(t.timeout, Duration::from_millis(500));
        assert_eq!(t.path, "/metrics");
        let c = ok(&[
            ("endpoints", "10.0.0.2:8000, 10.0.0.1:8000"),
            ("generationTokensTarget", "1500"),
        ]);
        let Source::Scrape(t) = &c.source else {
            panic!("expected scrape");
        };
        assert_eq!(
            t.pods,
            Pods::Static(vec!["10.0.0.1:8000".into(), "10.0.0.2:8000".into()])
        );
    }

    #[test]
    fn auth_headers_and_keda_keys() {
        let c = ok(&[
            ("serverAddress", "https://prom"),
            ("waitingTarget", "1"),
            ("bearerTokenFromEnv", "s3cret"),
            ("customHeaders", "X-Scope-OrgID=tenant-1, X-Extra=\"a b\""),
            ("prometheusUnsafeSsl", "true"),
            ("scalerAddress", "nightshift:6000"),
            ("unsafeSsl", "false"),
        ]);
        let Source::Prometheus { server, .. } = &c.source else {
            panic!("expected Prometheus");
        };
        assert_eq!(server.auth, Auth::Bearer("s3cret".into()));
        assert!(server.unsafe_ssl);
        assert_eq!(
            server.headers,
            vec![
                ("X-Extra".to_string(), "a b".to_string()),
                ("X-Scope-OrgID".to_string(), "tenant-1".to_string())
            ]
        );
        let c = ok(&[
            ("serverAddress", "https://prom"),
            ("query", "sum(x)"),
            ("queryTarget", "10"),
            ("username", "u"),
            ("password", "p"),
        ]);
        assert_eq!(
            c.query,
            Some(RawQuery {
                query: "sum(x)".into(),
                target: 10.0
            })
        );
    }

    /// Each malformed input names its key.
    #[test]
    fn every_malformed_key_is_named() {
        let base = [
            ("serverAddress", "http://prom:9090"),
            ("waitingTarget", "5"),
        ];
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("waitingTarget", "-1")], "waitingTarget"),
            (&[("waitingTarget", "0")], "waitingTarget"),
            (&[("waitingTarget", "NaN")], "waitingTarget"),
            (&[("runningTarget", "lots")], "runningTarget"),
            (&[("kvCacheTarget", "80")], "kvCacheTarget"),
            (
                &[("generationTokensTarget", "inf")],
                "generationTokensTarget",
            ),
            (&[("activationThreshold", "-2")], "activationThreshold"),
            (&[("emptyResult", "ignore")], "emptyResult"),
            (&[("timeout", "soon")], "timeout"),
            (&[("timeout", "0s")], "timeout"),
            (&[("timeout", "10m")], "timeout"),
            (&[("rateWindow", "x")], "rateWindow"),
            (&[("metricLabels", "job")], "metricLabels"),
            (&[("metricLabels", "bad-label=x")], "metricLabels"),
            (
                &[("namespaceLabel", "kubernetes.namespace")],
                "namespaceLabel",
            ),
            (&[("podLabel", "")], "waitingTarget"), // empty value = unset: still valid
            (&[("customHeaders", "Bad Header=1")], "customHeaders"),
            (&[("prometheusCaCert", "not a pem")], "prometheusCaCert"),
            (&[("prometheusUnsafeSsl", "yes")], "prometheusUnsafeSsl"),
            (&[("serverAddress", "prom:9090")], "serverAddress"),
            (&[("bearerToken", "t"), ("username", "u")], "bearerToken"),
            (&[("username", "u")], "password"),
            (&[("password", "p")], "username"),
            (&[("query", "sum(x)")], "queryTarget"),
            (&[("queryTarget", "3")], "queryTarget"),
            (&[("query", "sum(x)"), ("queryTarget", "3")], "query"),
            (&[("port", "8000")], "port"),
            (&[("waitngTarget", "5")], "waitngTarget: unknown key"),
            (&[("WaitingTarget", "5")], "did you mean waitingTarget?"),
            (&[("service", "svc")], "serverAddress, service"),
            (
                &[("capacity", "sometimes")],
                "capacity: \"sometimes\" must be learned or off",
            ),
            (
                &[("capacityUtilization", "0.5")],
                "capacityUtilization: only applies",
            ),
            (
                &[("capacity", "learned"), ("capacityUtilization", "0")],
                "capacityUtilization",
            ),
            (
                &[("capacity", "learned"), ("capacityUtilization", "1.5")],
                "capacityUtilization",
            ),
            (
                &[("capacity", "learned"), ("capacityUtilization", "most")],
                "capacityUtilization",
            ),
            (
                &[
                    ("waitingTarget", ""),
                    ("query", "sum(x)"),
                    ("queryTarget", "3"),
                    ("capacity", "learned"),
                ],
                "capacity: learned does not apply with query",
            ),
        ];
        for (overrides, expected) in cases {
            let mut m = meta(&base);
            for (k, v) in *overrides {
                m.insert(k.to_string(), v.to_string());
            }
            match parse(&m, "ns") {
                Err(e) => assert!(
                    e.to_string().contains(expected),
                    "{overrides:?}: {e} should mention {expected}"
                ),
                Ok(_) if *expected == "waitingTarget" => {}
                Ok(c) => panic!("{overrides:?} was accepted: {c:?}"),
            }
        }
    }

    #[test]
    fn scrape_keys_are_validated() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("service", "Bad_Name"), ("waitingTarget", "1")],
                "service",
            ),
            (
                &[("endpoints", "10.0.0.1"), ("waitingTarget", "1")],
                "endpoints",
            ),
            (
                &[("endpoints", "a:1"), ("port", "80"), ("waitingTarget", "1")],
                "port",
            ),
            (
                &[
                    ("endpoints", "a:1"),
                    ("scheme", "ftp"),
                    ("waitingTarget", "1"),
                ],
                "scheme",
            ),
            (
                &[
                    ("endpoints", "a:1"),
                    ("metricsPath", "metrics"),
                    ("waitingTarget", "1"),
                ],
                "metricsPath",
            ),
            (
                &[
                    ("endpoints", "a:1"),
                    ("bearerToken", "t"),
                    ("waitingTarget", "1"),
                ],
                "bearerToken",
            ),
            (
                &[("endpoints", "a:1"), ("query", "up"), ("queryTarget", "1")],
                "query",
            ),
            (
                &[("endpoints", "a:1"), ("capacity", "off")],
                "at least one per-replica target",
            ),
            (&[("waitingTarget", "1")], "one is required"),
        ];
        for (pairs, expected) in cases {
            let e = err(pairs);
            assert!(
                e.contains(expected),
                "{pairs:?}: {e} should mention {expected}"
            );
        }
    }

    /// A default the key table documents as a value is what leaving the key out means.
    #[test]
    fn documented_defaults_are_the_parsers() {
        let prometheus = [
            ("serverAddress", "http://prom:9090"),
            ("waitingTarget", "5"),
        ];
        let service = [("service", "llama-vllm"), ("waitingTarget", "5")];
        for key in keys::KEYS {
            let keys::KeyDefault::Literal(value) = key.default else {
                continue;
            };
            let bases: &[&[(&str, &str)]] = match key.applies {
                keys::Applies::All => &[&prometheus, &service],
                keys::Applies::Prometheus => &[&prometheus],
                keys::Applies::Scrape | keys::Applies::Service => &[&service],
            };
            for base in bases {
                let mut explicit = meta(base);
                explicit.insert(key.name.to_string(), value.to_string());
                assert_eq!(
                    parse(&explicit, "team-a"),
                    Ok(ok(base)),
                    "{}: {value}",
                    key.name
                );
            }
        }
    }

    #[test]
    fn all_problems_are_reported_at_once() {
        let e = err(&[
            ("serverAddress", "http://p"),
            ("waitingTarget", "x"),
            ("timeout", "y"),
            ("foo", "1"),
        ]);
        assert!(
            e.contains("waitingTarget") && e.contains("timeout") && e.contains("foo"),
            "{e}"
        );
    }

    #[test]
    fn capacity_is_learned_by_default_without_targets() {
        let c = ok(&[("service", "llama-vllm")]);
        assert_eq!(
            c.capacity,
            Some(LearnedCapacity {
                utilization: DEFAULT_UTILIZATION
            })
        );
        assert_eq!(c.targets.waiting, Some(LEARNED_WAITING_TARGET));
        assert_eq!(c.targets.generation_tokens, None);
        assert_eq!(c.targets.prompt_tokens, None);

        // Targets set by hand: nothing learned unless asked for.
        let hand = ok(&[("service", "llama-vllm"), ("waitingTarget", "3")]);
        assert_eq!(hand.capacity, None);

        // Asked for beside other targets, with its own utilization and waiting target.
        let both = ok(&[
            ("service", "llama-vllm"),
            ("capacity", "Learned"),
            ("capacityUtilization", "0.8"),
            ("waitingTarget", "2"),
            ("promptTokensTarget", "9000"),
        ]);
        assert_eq!(both.capacity, Some(LearnedCapacity { utilization: 0.8 }));
        assert_eq!(both.targets.waiting, Some(2.0));
        assert_eq!(both.targets.prompt_tokens, Some(9000.0));

        // A raw query learns nothing; `capacity: off` with no target is a missing target.
        let query = ok(&[
            ("serverAddress", "http://prom:9090"),
            ("query", "sum(x)"),
            ("queryTarget", "2"),
        ]);
        assert_eq!(query.capacity, None);
        assert_eq!(query.targets.waiting, None);
        let e = err(&[("service", "llama-vllm"), ("capacity", "off")]);
        assert!(e.contains("capacity: learned, or query"), "{e}");
    }
}
