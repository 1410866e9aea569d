//! Turns a trigger's `metadata` map (KEDA's `scalerMetadata`) into a typed [`TriggerConfig`].
//!
//! Every key is known: an unknown or malformed key is rejected with a message naming the key
//! and what is wrong, all problems at once. Keys KEDA itself reads for the connection to this
//! scaler are tolerated and ignored. A key `xFromEnv` (resolved by KEDA from the workload's
//! environment) stands for `x`.

use std::{collections::HashMap, time::Duration};

use crate::demand::Targets;
use crate::sources::{
    Selection,
    prometheus::{Auth, Labels, Server},
    scrape::{Pods, Target},
};

/// Default bound on one upstream request: well inside KEDA's polling interval, and long enough
/// for a loaded Prometheus answering a grouped query.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
/// Upper bound accepted for `timeout`: KEDA has no per-call deadline, so an upstream slower than
/// this would stall scaling decisions; failing (and letting `fallback` apply) is better.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// Default window for token rates: four Prometheus scrapes at the usual 15 s interval, the
/// minimum for a stable `rate()`.
pub const DEFAULT_RATE_WINDOW: Duration = Duration::from_secs(60);

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

/// Every key this scaler reads, with a one-line description (used in the "unknown key" error).
pub const KEYS: &[(&str, &str)] = &[
    ("serverAddress", "Prometheus base URL"),
    (
        "service",
        "Service in front of the vLLM pods to scrape directly",
    ),
    (
        "endpoints",
        "comma-separated host:port list of vLLM pods to scrape",
    ),
    ("port", "Service port name or number to scrape"),
    ("scheme", "http or https for direct scrapes"),
    (
        "metricsPath",
        "path of the metrics endpoint for direct scrapes",
    ),
    ("namespace", "namespace of the vLLM pods"),
    ("model", "vLLM model_name to read"),
    ("metricLabels", "extra label matchers k=v,k2=v2"),
    ("namespaceLabel", "Prometheus label holding the namespace"),
    ("podLabel", "Prometheus label holding the pod name"),
    ("waitingTarget", "waiting requests per replica"),
    ("runningTarget", "running requests per replica"),
    ("kvCacheTarget", "KV-cache fraction per replica"),
    ("generationTokensTarget", "generated tokens/s per replica"),
    ("query", "raw PromQL returning one element"),
    ("queryTarget", "per-replica target for query"),
    (
        "activationThreshold",
        "demand (replicas) above which the workload is active",
    ),
    ("emptyResult", "error or zero"),
    ("rateWindow", "window for token rates"),
    ("timeout", "bound on each upstream request"),
    ("bearerToken", "Prometheus bearer token"),
    ("username", "Prometheus basic-auth user"),
    ("password", "Prometheus basic-auth password"),
    (
        "customHeaders",
        "extra HTTP headers k=v,k2=v2 for Prometheus",
    ),
    ("prometheusCaCert", "PEM CA bundle for Prometheus"),
    ("prometheusUnsafeSsl", "skip Prometheus certificate checks"),
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
}

/// Invalid metadata: every problem, each naming its key.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("invalid scaler metadata: {}", .problems.join("; "))]
pub struct MetadataError {
    pub problems: Vec<String>,
}

struct Reader<'a> {
    map: HashMap<&'a str, &'a str>,
    problems: Vec<String>,
}

impl<'a> Reader<'a> {
    fn new(raw: &'a HashMap<String, String>) -> Self {
        let mut map = HashMap::new();
        let mut problems = Vec::new();
        for (k, v) in raw {
            let base = k.strip_suffix("FromEnv").unwrap_or(k);
            if KEDA_KEYS.contains(&base) {
                continue;
            }
            if !KEYS.iter().any(|(name, _)| *name == base) {
                let hint = KEYS
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case(base))
                    .map(|(name, _)| format!(" (did you mean {name}?)"))
                    .unwrap_or_default();
                problems.push(format!("{k}: unknown key{hint}"));
                continue;
            }
            // The plain key wins over its FromEnv form.
            if k.as_str() == base || !raw.contains_key(base) {
                map.insert(base, v.as_str());
            }
        }
        Self { map, problems }
    }

    fn text(&self, key: &str) -> Option<&'a str> {
        self.map
            .get(key)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    fn bad(&mut self, key: &str, msg: impl std::fmt::Display) {
        self.problems.push(format!("{key}: {msg}"));
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
        match crate::duration::parse_duration(raw) {
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

/// Parses the metadata of a trigger of the ScaledObject in `scaled_object_namespace`.
pub fn parse(
    raw: &HashMap<String, String>,
    scaled_object_namespace: &str,
) -> Result<TriggerConfig, MetadataError> {
    let mut r = Reader::new(raw);

    let timeout = r.duration("timeout", DEFAULT_TIMEOUT, MAX_TIMEOUT);
    let rate_window = r.duration("rateWindow", DEFAULT_RATE_WINDOW, Duration::from_secs(3600));
    let matchers = r.pairs("metricLabels", is_label_name);
    let namespace = r
        .text("namespace")
        .unwrap_or(scaled_object_namespace)
        .to_string();
    let model = r.text("model").map(str::to_string);

    let chosen: Vec<&str> = ["serverAddress", "service", "endpoints"]
        .into_iter()
        .filter(|k| r.text(k).is_some())
        .collect();
    if chosen.len() > 1 {
        let keys = chosen.join(", ");
        r.bad(
            &keys,
            "set only one source: serverAddress (Prometheus), service or endpoints (direct scrape)",
        );
    }
    let prometheus_only = [
        "namespaceLabel",
        "podLabel",
        "query",
        "queryTarget",
        "bearerToken",
        "username",
        "password",
        "customHeaders",
        "prometheusCaCert",
        "prometheusUnsafeSsl",
    ];
    let scrape_only = ["port", "scheme", "metricsPath"];

    let source = if let Some(address) = r.text("serverAddress") {
        for k in scrape_only {
            if r.text(k).is_some() {
                r.bad(k, "only applies to direct scrapes (service or endpoints)");
            }
        }
        if !(address.starts_with("http://") || address.starts_with("https://")) {
            r.bad(
                "serverAddress",
                format!("{address:?} must be an http:// or https:// URL"),
            );
        }
        let auth = match (
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
        };
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
        let mut label = |key: &str, default: &str| {
            let v = r.text(key).unwrap_or(default).to_string();
            if !is_label_name(&v) {
                r.bad(key, format!("{v:?} is not a valid Prometheus label name"));
            }
            v
        };
        let namespace_label = label("namespaceLabel", "namespace");
        let pod_label = label("podLabel", "pod");
        Some(Source::Prometheus {
            server: Server {
                address: address.trim_end_matches('/').to_string(),
                auth,
                headers,
                ca_cert,
                unsafe_ssl,
                timeout,
            },
            labels: Labels {
                namespace_label,
                pod_label,
                matchers: matchers.clone(),
            },
        })
    } else if r.text("service").is_some() || r.text("endpoints").is_some() {
        for k in prometheus_only {
            if r.text(k).is_some() {
                r.bad(k, "only applies with serverAddress (Prometheus)");
            }
        }
        let pods = if let Some(service) = r.text("service") {
            let valid = !service.is_empty()
                && service.len() <= 63
                && service
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !valid {
                r.bad("service", format!("{service:?} is not a Service name"));
            }
            Pods::Service {
                namespace: namespace.clone(),
                name: service.to_string(),
                port: r.text("port").map(str::to_string),
            }
        } else {
            if r.text("port").is_some() {
                r.bad("port", "only applies with service; put ports in endpoints");
            }
            let list: Vec<String> = r
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
            let mut list = list;
            list.sort();
            list.dedup();
            Pods::Static(list)
        };
        let scheme = r.text("scheme").unwrap_or("http").to_string();
        if scheme != "http" && scheme != "https" {
            r.bad("scheme", format!("{scheme:?} must be http or https"));
        }
        let path = r.text("metricsPath").unwrap_or("/metrics").to_string();
        if !path.starts_with('/') {
            r.bad("metricsPath", format!("{path:?} must start with /"));
        }
        Some(Source::Scrape(Target {
            pods,
            scheme,
            path,
            timeout,
            matchers: matchers.clone(),
            rate_window,
        }))
    } else {
        r.problems.push(
            "serverAddress, service or endpoints: one is required (where to read vLLM metrics)"
                .into(),
        );
        None
    };

    let targets = Targets {
        waiting: r.positive("waitingTarget"),
        running: r.positive("runningTarget"),
        kv_cache: r.positive("kvCacheTarget"),
        generation_tokens: r.positive("generationTokensTarget"),
    };
    if let Some(kv) = targets.kv_cache
        && kv > 1.0
    {
        r.bad(
            "kvCacheTarget",
            format!("{kv} is a fraction of the cache and must be ≤ 1"),
        );
    }
    let any_target = targets.waiting.is_some()
        || targets.running.is_some()
        || targets.kv_cache.is_some()
        || targets.generation_tokens.is_some();
    let query = match (r.text("query"), r.positive("queryTarget")) {
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
    };
    if r.text("query").is_some() && any_target {
        r.bad(
            "query",
            "replaces the signal targets; remove waitingTarget/runningTarget/kvCacheTarget/generationTokensTarget",
        );
    }
    if r.text("query").is_none() && !any_target && !r.problems.iter().any(|p| p.contains("Target:"))
    {
        r.problems.push(
            "waitingTarget, runningTarget, kvCacheTarget, generationTokensTarget: set at least one per-replica target (or query with queryTarget)".into(),
        );
    }
    let activation_threshold = r.non_negative("activationThreshold", 0.0);
    let empty_result = match r.text("emptyResult") {
        None => EmptyResult::Error,
        Some(v) if v.eq_ignore_ascii_case("error") => EmptyResult::Error,
        Some(v) if v.eq_ignore_ascii_case("zero") => EmptyResult::Zero,
        Some(v) => {
            r.bad("emptyResult", format!("{v:?} must be error or zero"));
            EmptyResult::Error
        }
    };

    let selection = Selection {
        namespace: Some(namespace),
        model,
    };
    match source {
        Some(source) if r.problems.is_empty() => Ok(TriggerConfig {
            selection: match &source {
                // Direct scrapes already target the right pods.
                Source::Scrape(_) => Selection {
                    namespace: None,
                    model: selection.model,
                },
                Source::Prometheus { .. } => selection,
            },
            source,
            targets,
            query,
            activation_threshold,
            empty_result,
            rate_window,
        }),
        _ => {
            let mut problems = r.problems;
            problems.sort();
            Err(MetadataError { problems })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ok(pairs: &[(&str, &str)]) -> TriggerConfig {
        parse(&meta(pairs), "team-a").expect("valid metadata")
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
            (&[("endpoints", "a:1")], "at least one per-replica target"),
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
}
