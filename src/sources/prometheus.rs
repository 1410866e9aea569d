//! Reads vLLM metrics from a Prometheus server with `prometheus-http-query`.
//!
//! One instant query per metric family and server, grouped by (namespace, model, pod), serves
//! every ScaledObject that reads that server with the same label configuration. Outcomes are
//! cached for a short TTL and concurrent callers wait for the same request, so the number of
//! upstream queries per interval is the number of families in use, not the number of
//! ScaledObjects. Every request is bounded by a timeout.

use std::{
    fmt::Write as _,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use prometheus_http_query::{Client, response::Data};
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};

use super::{
    FamilyIndex, ModelKey, SourceError,
    cache::Coalescer,
    exposition::{
        GENERATION_TOKENS, KV_CACHE, KV_CACHE_OLD, MODEL_LABEL, PROMPT_TOKENS, RUNNING, WAITING,
    },
    idle::{IDLE, IdleMap},
};
use crate::{core::demand::Signal, sources::metrics::SourceMetrics};

/// How to authenticate to Prometheus.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Auth {
    None,
    Bearer(String),
    Basic { username: String, password: String },
}

/// A Prometheus server and how to talk to it. Equal values share one HTTP client and one cache.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Server {
    /// Base URL, e.g. `http://prometheus.monitoring:9090`.
    pub address: String,
    pub auth: Auth,
    /// Extra headers sent with every query (e.g. `X-Scope-OrgID` for multi-tenant backends).
    pub headers: Vec<(String, String)>,
    /// PEM CA bundle to trust in addition to the system roots.
    pub ca_cert: Option<String>,
    /// Skip certificate verification (testing only).
    pub unsafe_ssl: bool,
    /// Bound on one query, connection included.
    pub timeout: Duration,
}

/// Which labels carry the namespace and pod, and extra matchers applied to every series.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Labels {
    pub namespace_label: String,
    pub pod_label: String,
    pub matchers: Vec<(String, String)>,
}

/// A PromQL query on one server: what the query cache is keyed by. A trigger's are built once,
/// when its metadata is read ([`family_query`] for each signal, or its raw `query`), so that an
/// evaluation answered from the cache builds no text and copies no key. Its hash is taken once
/// too: the server's settings and the query's text are a few hundred bytes, hashed on every
/// lookup otherwise.
#[derive(Clone, Debug)]
pub struct ServerQuery {
    server: Server,
    query: String,
    /// The hash of (`server`, `query`) with this process's random keys ([`hash_keys`]), so that
    /// ScaledObject authors, who choose both, cannot aim collisions at the cache.
    hash: u64,
}

impl ServerQuery {
    /// `query` on `server`.
    pub fn new(server: Server, query: String) -> Self {
        let hash = std::hash::BuildHasher::hash_one(hash_keys(), (&server, &query));
        Self {
            server,
            query,
            hash,
        }
    }

    /// `signal`'s [`family_query`] on `server`, token rates taken over `rate_window`.
    pub fn family(server: &Server, labels: &Labels, signal: Signal, rate_window: Duration) -> Self {
        Self::new(
            server.clone(),
            family_query(signal, labels, &promql_duration(rate_window)),
        )
    }

    pub fn server(&self) -> &Server {
        &self.server
    }

    pub fn query(&self) -> &str {
        &self.query
    }
}

impl PartialEq for ServerQuery {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.query == other.query && self.server == other.server
    }
}

impl Eq for ServerQuery {}

impl std::hash::Hash for ServerQuery {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// The keys [`ServerQuery`]'s hash is taken with: random, drawn once per process.
fn hash_keys() -> &'static std::hash::RandomState {
    static KEYS: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    KEYS.get_or_init(std::hash::RandomState::new)
}

/// Builds the selector `metric{k="v",...}` with escaped values.
fn selector(metric: &str, matchers: &[(String, String)]) -> String {
    let mut s = metric.to_string();
    if !matchers.is_empty() {
        s.push('{');
        for (i, (k, v)) in matchers.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let escaped = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            let _ = write!(s, "{k}=\"{escaped}\"");
        }
        s.push('}');
    }
    s
}

/// The PromQL query for one signal's family: one value per (namespace, model, pod). Engines are
/// summed (counts, token rates) or averaged (KV-cache fraction) within a pod; both KV-cache names
/// are read, the new one winning where a pod exposes both (`or` keeps the left side's series).
pub fn family_query(signal: Signal, labels: &Labels, rate_window: &str) -> String {
    let by = format!(
        "{}, {MODEL_LABEL}, {}",
        labels.namespace_label, labels.pod_label
    );
    let m = &labels.matchers;
    match signal {
        Signal::Waiting => format!("sum by ({by}) ({})", selector(WAITING, m)),
        Signal::Running => format!("sum by ({by}) ({})", selector(RUNNING, m)),
        Signal::KvCache => format!(
            "avg by ({by}) ({} or {})",
            selector(KV_CACHE, m),
            selector(KV_CACHE_OLD, m)
        ),
        Signal::GenerationTokens => format!(
            "sum by ({by}) (rate({}[{rate_window}]))",
            selector(GENERATION_TOKENS, m)
        ),
        Signal::PromptTokens => format!(
            "sum by ({by}) (rate({}[{rate_window}]))",
            selector(PROMPT_TOKENS, m)
        ),
    }
}

/// Formats a duration as PromQL (`90s`, `1500ms`).
fn promql_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Prometheus servers in use, their HTTP clients and the shared query cache. A server no
/// ScaledObject has queried for [`IDLE`] has its client (and connection pool) dropped: with
/// `--scaler-allowed-prometheus=*` the servers named are not bounded by a list.
pub struct PrometheusSource {
    clients: Mutex<IdleMap<Server, Client>>,
    families: Coalescer<ServerQuery, FamilyIndex>,
    raw: Coalescer<ServerQuery, Option<f64>>,
    metrics: SourceMetrics,
}

impl PrometheusSource {
    /// A source whose answers are reused for `ttl`.
    pub fn new(ttl: Duration, metrics: SourceMetrics) -> Self {
        Self {
            clients: Mutex::new(IdleMap::new(IDLE)),
            families: Coalescer::new(ttl),
            raw: Coalescer::new(ttl),
            metrics,
        }
    }

    fn client(&self, server: &Server) -> Result<Client, SourceError> {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients
            .use_or_try_insert_with(server.clone(), Instant::now(), || build_client(server))
            .map(|client| client.clone())
    }

    /// One signal's family readings, `query` being its [`family_query`] with `labels`, shared
    /// with every concurrent and recent caller.
    pub async fn family(
        &self,
        query: &ServerQuery,
        labels: &Labels,
        signal: Signal,
    ) -> Result<Arc<FamilyIndex>, SourceError> {
        // What only a query needs (the client, the copies the query's task owns) is made when
        // the cache has no fresh answer, not on every call it answers.
        self.families
            .get_or_fetch(query, || {
                let client = self.client(query.server());
                let (metrics, query, labels) =
                    (self.metrics.clone(), query.clone(), labels.clone());
                async move {
                    let data = run_query(
                        &client?,
                        query.server(),
                        query.query(),
                        &metrics,
                        signal.family(),
                    )
                    .await?;
                    index_from(query.server(), &labels, data)
                }
            })
            .await
    }

    /// The family's index for `query` when the cache holds a finished answer that is still
    /// fresh; `None` when [`PrometheusSource::family`] would wait for a query or send one.
    pub fn fresh_family(
        &self,
        query: &ServerQuery,
    ) -> Option<Result<Arc<FamilyIndex>, SourceError>> {
        self.families.fresh(query)
    }

    /// A raw PromQL query that must return at most one element; `None` when it returned none.
    pub async fn raw_query(&self, query: &ServerQuery) -> Result<Arc<Option<f64>>, SourceError> {
        self.raw
            .get_or_fetch(query, || {
                let client = self.client(query.server());
                let (metrics, query) = (self.metrics.clone(), query.clone());
                async move {
                    let data =
                        run_query(&client?, query.server(), query.query(), &metrics, "query")
                            .await?;
                    single_value(query.server(), query.query(), data)
                }
            })
            .await
    }
}

pub(crate) fn build_client(server: &Server) -> Result<Client, SourceError> {
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        SourceError::NotConfigured(format!(
            "cannot build a client for Prometheus {}: {what}: {e}",
            server.address
        ))
    };
    let mut headers = HeaderMap::new();
    match &server.auth {
        Auth::None => {}
        Auth::Bearer(token) => {
            let mut v = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|e| bad("bearer token", &e))?;
            v.set_sensitive(true);
            headers.insert(AUTHORIZATION, v);
        }
        Auth::Basic { username, password } => {
            let encoded = base64_encode(format!("{username}:{password}").as_bytes());
            let mut v = HeaderValue::from_str(&format!("Basic {encoded}"))
                .map_err(|e| bad("basic credentials", &e))?;
            v.set_sensitive(true);
            headers.insert(AUTHORIZATION, v);
        }
    }
    for (k, v) in &server.headers {
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|e| bad("header name", &e))?;
        let value = HeaderValue::from_str(v).map_err(|e| bad("header value", &e))?;
        headers.insert(name, value);
    }
    let mut builder = reqwest::Client::builder()
        .default_headers(headers)
        .timeout(server.timeout)
        .connect_timeout(server.timeout)
        // A redirect would take the query, and its credentials, past the allow-list.
        .redirect(reqwest::redirect::Policy::none());
    if let Some(pem) = &server.ca_cert {
        let certs = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
            .map_err(|e| bad("CA certificate", &e))?;
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    if server.unsafe_ssl {
        builder = builder.danger_accept_invalid_certs(true);
    }
    let http = builder.build().map_err(|e| bad("HTTP client", &e))?;
    Client::from(http, &server.address).map_err(|e| bad("address", &e))
}

/// Standard base64 (RFC 4648) for HTTP basic credentials.
fn base64_encode(input: &[u8]) -> String {
    base64_simd::STANDARD.encode_to_string(input)
}

async fn run_query(
    client: &Client,
    server: &Server,
    query: &str,
    metrics: &SourceMetrics,
    family: &'static str,
) -> Result<Data, SourceError> {
    let started = Instant::now();
    let outcome = tokio::time::timeout(server.timeout, client.query(query).get()).await;
    let result = match outcome {
        Err(_) => Err(SourceError::Timeout {
            upstream: format!("Prometheus {}", server.address),
            after: server.timeout,
        }),
        Ok(Err(e)) => Err(classify(server, query, e)),
        Ok(Ok(r)) => Ok(r.into_inner().0),
    };
    metrics.observe(
        "prometheus",
        family,
        result.as_ref().err(),
        started.elapsed(),
    );
    result
}

fn classify(server: &Server, query: &str, e: prometheus_http_query::Error) -> SourceError {
    let upstream = format!("Prometheus {}", server.address);
    match e {
        prometheus_http_query::Error::Prometheus(p) if p.is_bad_data() => SourceError::Rejected {
            upstream,
            query: query.to_string(),
            detail: super::bounded(p.message()),
        },
        prometheus_http_query::Error::Prometheus(p) if p.is_timeout() => SourceError::Timeout {
            upstream,
            after: server.timeout,
        },
        prometheus_http_query::Error::Prometheus(p) => SourceError::Unavailable {
            upstream,
            detail: super::bounded(&p.to_string()),
        },
        prometheus_http_query::Error::Client(c) => {
            let inner = c.inner();
            if inner.is_none() {
                // The client's own checks failed: wrong media type, unreadable JSON, …
                SourceError::Garbage {
                    upstream,
                    detail: error_chain(&c),
                }
            } else if inner.is_some_and(|r| r.is_timeout()) {
                SourceError::Timeout {
                    upstream,
                    after: server.timeout,
                }
            } else if inner.is_some_and(|r| r.is_decode()) {
                SourceError::Garbage {
                    upstream,
                    detail: error_chain(&c),
                }
            } else if inner.is_some_and(|r| r.is_status())
                && inner
                    .and_then(|r| r.status())
                    .is_some_and(|s| s.is_client_error())
            {
                SourceError::Rejected {
                    upstream,
                    query: query.to_string(),
                    detail: error_chain(&c),
                }
            } else {
                SourceError::Unavailable {
                    upstream,
                    detail: error_chain(&c),
                }
            }
        }
        other => SourceError::Garbage {
            upstream,
            detail: super::bounded(&other.to_string()),
        },
    }
}

/// The error and its causes, bounded: a client error's cause can quote the body it failed on.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        let _ = write!(s, ": {inner}");
        cur = inner.source();
    }
    super::bounded(&s)
}

/// The per-pod readings of one family query's answer. Refuses anything but an instant vector and
/// any value that is not finite and non-negative.
pub fn index_from(
    server: &Server,
    labels: &Labels,
    data: Data,
) -> Result<FamilyIndex, SourceError> {
    let garbage = |detail: String| SourceError::Garbage {
        upstream: format!("Prometheus {}", server.address),
        detail,
    };
    let Data::Vector(vector) = data else {
        return Err(garbage("expected an instant vector".into()));
    };
    let mut values = Vec::with_capacity(vector.len());
    for v in vector {
        let value = v.sample().value();
        if !value.is_finite() || value < 0.0 {
            return Err(garbage(format!(
                "series {:?} has value {value}",
                v.metric()
            )));
        }
        let metric = v.metric();
        let get = |k: &str| metric.get(k).cloned().unwrap_or_default();
        values.push((
            ModelKey {
                namespace: get(&labels.namespace_label),
                model: get(MODEL_LABEL),
            },
            value,
        ));
    }
    Ok(FamilyIndex::from_pod_values(values))
}

/// The value of a raw query's answer: `None` for an empty vector, an error for several elements,
/// a range vector, or a value that is not finite and non-negative.
pub fn single_value(server: &Server, query: &str, data: Data) -> Result<Option<f64>, SourceError> {
    let garbage = |detail: String| SourceError::Garbage {
        upstream: format!("Prometheus {}", server.address),
        detail: format!("query {query:?}: {detail}"),
    };
    let value = match data {
        Data::Scalar(s) => Some(s.value()),
        Data::Vector(v) if v.is_empty() => None,
        Data::Vector(v) if v.len() == 1 => Some(v[0].sample().value()),
        Data::Vector(v) => {
            return Err(garbage(format!(
                "must return one element, returned {}",
                v.len()
            )));
        }
        Data::Matrix(_) => return Err(garbage("returned a range vector".into())),
    };
    match value {
        Some(x) if !x.is_finite() || x < 0.0 => Err(garbage(format!("returned {x}"))),
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> Labels {
        Labels {
            namespace_label: "namespace".into(),
            pod_label: "pod".into(),
            matchers: vec![("job".into(), "vllm \"x\"".into())],
        }
    }

    #[test]
    fn family_queries_group_per_pod_and_read_both_kv_cache_names() {
        let l = labels();
        assert_eq!(
            family_query(Signal::Waiting, &l, "1m"),
            r#"sum by (namespace, model_name, pod) (vllm:num_requests_waiting{job="vllm \"x\""})"#
        );
        assert_eq!(
            family_query(Signal::KvCache, &l, "1m"),
            r#"avg by (namespace, model_name, pod) (vllm:kv_cache_usage_perc{job="vllm \"x\""} or vllm:gpu_cache_usage_perc{job="vllm \"x\""})"#
        );
        assert_eq!(
            family_query(Signal::GenerationTokens, &l, "2m"),
            r#"sum by (namespace, model_name, pod) (rate(vllm:generation_tokens_total{job="vllm \"x\""}[2m]))"#
        );
        assert_eq!(
            family_query(Signal::PromptTokens, &l, "90s"),
            r#"sum by (namespace, model_name, pod) (rate(vllm:prompt_tokens_total{job="vllm \"x\""}[90s]))"#
        );
    }

    #[test]
    fn a_query_key_is_equal_to_the_same_query_on_the_same_server_only() {
        let server = |address: &str| Server {
            address: address.into(),
            auth: Auth::None,
            headers: Vec::new(),
            ca_cert: None,
            unsafe_ssl: false,
            timeout: Duration::from_secs(3),
        };
        let key = |address: &str, query: &str| ServerQuery::new(server(address), query.into());
        let a = key("http://prom:9090", "up");
        let mut cache = std::collections::HashMap::new();
        cache.insert(a.clone(), 1);
        assert_eq!(cache.get(&key("http://prom:9090", "up")), Some(&1));
        assert_eq!(cache.get(&key("http://prom:9090", "down")), None);
        assert_eq!(cache.get(&key("http://thanos:9090", "up")), None);
        let mut bearer = server("http://prom:9090");
        bearer.auth = Auth::Bearer("t".into());
        assert_ne!(ServerQuery::new(bearer, "up".into()), a);
    }

    #[test]
    fn promql_durations() {
        assert_eq!(promql_duration(Duration::from_secs(60)), "60s");
        assert_eq!(promql_duration(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn basic_credentials_are_base64_encoded() {
        assert_eq!(base64_encode(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(base64_encode(b"a"), "YQ==");
        assert_eq!(base64_encode(b"ab"), "YWI=");
        assert_eq!(base64_encode(b""), "");
    }
}
