//! Reads vLLM metrics straight from the pods' `/metrics`: no Prometheus scrape interval in the
//! way, so this is the low-latency path and the default when no Prometheus exists.
//!
//! One scrape pass (every pod once, concurrently, each bounded by the timeout) serves every
//! family and every ScaledObject that points at the same pods, shared through the coalescing
//! cache. A pod that cannot be scraped fails the whole pass: reporting the other pods alone would
//! under-report demand exactly when pods are too loaded to answer.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::{
    FamilyIndex, ModelKey, SourceError,
    cache::Coalescer,
    discovery::{Discovery, Endpoint},
    exposition::{self, PodReadings},
    idle::{IDLE, IdleMap},
    metrics::SourceMetrics,
    policy::{self, Denied, SourcePolicy},
    rates::CounterRates,
    target::{Pods, Target},
};
use crate::core::demand::PerSignal;

/// The outcome of one scrape pass over a target's pods.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Per signal, per-model totals over the pods.
    pub families: PerSignal<FamilyIndex>,
    /// Pods scraped.
    pub pods: usize,
    /// Token counters were found but no pod has two samples yet, so no rate is known.
    pub rates_warming_up: bool,
}

/// The token counters a pod exposes, each rated on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Counter {
    /// `vllm:generation_tokens_total`.
    Generated,
    /// `vllm:prompt_tokens_total`.
    Prompt,
}

/// One counter series: (pod address, model, which counter). The counter is part of the id so
/// that the two counters of one pod never share a history.
type CounterId = (String, String, Counter);

/// Token-counter histories per target, keyed by [`CounterId`]; a target no ScaledObject has
/// read for [`IDLE`] is forgotten.
type RateBook = Mutex<IdleMap<Target, CounterRates<CounterId>>>;

/// Scrapes pods and remembers counter histories per target.
pub struct ScrapeSource {
    http: reqwest::Client,
    discovery: Arc<Discovery>,
    cache: Coalescer<Target, Snapshot>,
    rates: Arc<RateBook>,
    epoch: Instant,
    metrics: SourceMetrics,
    policy: Arc<SourcePolicy>,
}

/// Gap between the two scrapes of a target seen for the first time, so token rates exist
/// from the first answer. Long enough for a counter to move, short against KEDA's 30 s poll.
const WARMUP_GAP: Duration = Duration::from_millis(1000);

impl ScrapeSource {
    /// Scrape passes are reused for `ttl`. Addresses a Service's EndpointSlices name are
    /// checked against `policy` before they are scraped.
    pub fn new(
        ttl: Duration,
        discovery: Arc<Discovery>,
        metrics: SourceMetrics,
        policy: Arc<SourcePolicy>,
    ) -> Result<Self, SourceError> {
        let http = reqwest::Client::builder()
            // A pod answering with a redirect could send the scrape anywhere.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| SourceError::NotConfigured(format!("cannot build HTTP client: {e}")))?;
        Ok(Self {
            http,
            discovery,
            cache: Coalescer::new(ttl),
            rates: Arc::new(Mutex::new(IdleMap::new(IDLE))),
            epoch: Instant::now(),
            metrics,
            policy,
        })
    }

    /// The latest snapshot of `target`, shared with every concurrent and recent caller.
    pub async fn snapshot(&self, target: &Target) -> Result<Arc<Snapshot>, SourceError> {
        // The copies the scrape's task owns are made when the cache has no fresh snapshot, not
        // on every call it answers.
        self.cache
            .get_or_fetch(target, || {
                let (http, discovery, rates) = (
                    self.http.clone(),
                    self.discovery.clone(),
                    self.rates.clone(),
                );
                let (metrics, policy) = (self.metrics.clone(), self.policy.clone());
                let (window, epoch) = (target.rate_window.as_secs_f64(), self.epoch);
                let target_c = target.clone();
                async move {
                    let first_time = !rates
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .is_live(&target_c, Instant::now());
                    let pass = Pass {
                        http: &http,
                        discovery: &discovery,
                        policy: &policy,
                        rates: &rates,
                        metrics: &metrics,
                        window,
                        epoch,
                    };
                    let mut snapshot = pass.run(&target_c).await?;
                    if first_time && snapshot.rates_warming_up {
                        tokio::time::sleep(WARMUP_GAP).await;
                        snapshot = pass.run(&target_c).await?;
                    }
                    Ok(snapshot)
                }
            })
            .await
    }
}

/// What one scrape pass needs.
struct Pass<'a> {
    http: &'a reqwest::Client,
    discovery: &'a Discovery,
    policy: &'a SourcePolicy,
    rates: &'a RateBook,
    metrics: &'a SourceMetrics,
    window: f64,
    epoch: Instant,
}

impl Pass<'_> {
    async fn run(&self, target: &Target) -> Result<Snapshot, SourceError> {
        let endpoints = match &target.pods {
            Pods::Static(list) => list
                .iter()
                .map(|a| Endpoint {
                    address: a.clone(),
                    name: a.clone(),
                })
                .collect(),
            Pods::Service {
                namespace,
                name,
                port,
            } => {
                let found = self
                    .discovery
                    .endpoints(namespace, name, port.as_deref(), target.timeout)
                    .await?;
                for ep in &found {
                    discovered_allowed(self.policy, namespace, name, ep)?;
                }
                found
            }
        };
        let scrapes = futures::future::join_all(
            endpoints
                .iter()
                .map(|ep| scrape_pod(self.http, target, ep, self.metrics)),
        )
        .await;
        let mut pods: Vec<(&Endpoint, f64, PodReadings)> = Vec::with_capacity(scrapes.len());
        for (ep, result) in endpoints.iter().zip(scrapes) {
            let (answered, readings) = result?;
            let at = answered.saturating_duration_since(self.epoch).as_secs_f64();
            pods.push((ep, at, readings));
        }
        Ok(summarise(target, &pods, self.rates, self.window))
    }
}

/// Whether an address a Service's EndpointSlice names may be scraped: whoever can write the
/// slices of a selector-less Service chooses these addresses, so they get the address rules a
/// static list gets.
fn discovered_allowed(
    policy: &SourcePolicy,
    namespace: &str,
    service: &str,
    ep: &Endpoint,
) -> Result<(), Denied> {
    let Some(ip) = policy::endpoint_ip(&ep.address) else {
        return Err(Denied {
            rule: "EndpointSlice address is not an IP",
            detail: format!("service {namespace}/{service}: {}", ep.address),
            flag: "an IPv4 or IPv6 EndpointSlice",
        });
    };
    policy.check_ip(ip).map_err(|d| Denied {
        detail: format!("service {namespace}/{service}: endpoint {}", d.detail),
        ..d
    })
}

/// One pass's readings, each pod's with the time (seconds since the scraper started) its
/// answer arrived.
fn summarise(
    target: &Target,
    pods: &[(&Endpoint, f64, PodReadings)],
    rates: &RateBook,
    window: f64,
) -> Snapshot {
    let ns = target.namespace();
    let key = |model: &str| ModelKey {
        namespace: ns.to_string(),
        model: model.to_string(),
    };
    let mut waiting = Vec::new();
    let mut running = Vec::new();
    let mut kv = Vec::new();
    let mut counters = Vec::new();
    for (ep, at, readings) in pods {
        for (model, r) in readings {
            if let Some(v) = r.waiting {
                waiting.push((key(model), v));
            }
            if let Some(v) = r.running {
                running.push((key(model), v));
            }
            if let Some(v) = r.kv_cache {
                kv.push((key(model), v));
            }
            if let Some(v) = r.generation_tokens_total {
                counters.push((
                    (ep.address.clone(), model.clone(), Counter::Generated),
                    *at,
                    v,
                ));
            }
            if let Some(v) = r.prompt_tokens_total {
                counters.push(((ep.address.clone(), model.clone(), Counter::Prompt), *at, v));
            }
        }
    }
    let mut all_rates = rates.lock().unwrap_or_else(|p| p.into_inner());
    let tracker =
        all_rates.use_or_insert_with(target.clone(), Instant::now(), || CounterRates::new(window));
    tracker.observe(counters.iter().cloned());
    let rates_of = |counter: Counter| -> Vec<(ModelKey, f64)> {
        counters
            .iter()
            .filter(|(id, ..)| id.2 == counter)
            .filter_map(|(id, ..)| tracker.rate(id).map(|r| (key(&id.1), r)))
            .collect()
    };
    let generated = rates_of(Counter::Generated);
    let prompt = rates_of(Counter::Prompt);
    // Both counters of a pod are first seen in the same pass, so they warm up together.
    let rates_warming_up = !counters.is_empty() && generated.is_empty() && prompt.is_empty();
    Snapshot {
        families: PerSignal {
            waiting: FamilyIndex::from_pod_values(waiting),
            running: FamilyIndex::from_pod_values(running),
            kv_cache: FamilyIndex::from_pod_values(kv),
            generation_tokens: FamilyIndex::from_pod_values(generated),
            prompt_tokens: FamilyIndex::from_pod_values(prompt),
        },
        pods: pods.len(),
        rates_warming_up,
    }
}

/// Response bodies larger than this are refused: a vLLM exposition is tens of KiB, so anything
/// this large is not one (and must not exhaust memory).
const MAX_BODY_BYTES: usize = 8 << 20;

/// One pod's readings and when its answer arrived: a pod renders its counters as it answers,
/// so the arrival of the response head times them better than the start or end of the pass.
async fn scrape_pod(
    http: &reqwest::Client,
    target: &Target,
    ep: &Endpoint,
    metrics: &SourceMetrics,
) -> Result<(Instant, PodReadings), SourceError> {
    let started = Instant::now();
    let result = scrape_pod_inner(http, target, ep).await;
    metrics.observe("scrape", "all", result.as_ref().err(), started.elapsed());
    result
}

async fn scrape_pod_inner(
    http: &reqwest::Client,
    target: &Target,
    ep: &Endpoint,
) -> Result<(Instant, PodReadings), SourceError> {
    let url = format!("{}://{}{}", target.scheme, ep.address, target.path);
    let upstream = format!("pod {} ({url})", ep.name);
    let fetch = async {
        let response = http
            .get(&url)
            .send()
            .await
            .map_err(|e| SourceError::Unavailable {
                upstream: upstream.clone(),
                detail: e.to_string(),
            })?;
        let answered = Instant::now();
        let status = response.status();
        if !status.is_success() {
            return Err(SourceError::Unavailable {
                upstream: upstream.clone(),
                detail: format!("HTTP {status}"),
            });
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_BODY_BYTES as u64)
        {
            return Err(SourceError::Garbage {
                upstream: upstream.clone(),
                detail: "response too large".into(),
            });
        }
        let body = response
            .text()
            .await
            .map_err(|e| SourceError::Unavailable {
                upstream: upstream.clone(),
                detail: e.to_string(),
            })?;
        Ok((answered, body))
    };
    let (answered, body) = tokio::time::timeout(target.timeout, fetch)
        .await
        .map_err(|_| SourceError::Timeout {
            upstream: upstream.clone(),
            after: target.timeout,
        })??;
    if body.len() > MAX_BODY_BYTES {
        return Err(SourceError::Garbage {
            upstream,
            detail: "response too large".into(),
        });
    }
    // The pod's own words are not echoed: errors reach the ScaledObject's author (KEDA events,
    // the explanations), who must not read through the scaler what they could not read.
    let readings =
        exposition::parse(&body, &target.matchers).map_err(|e| SourceError::Garbage {
            upstream,
            detail: e.summary(),
        })?;
    Ok((answered, readings))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::{Selection, exposition::ModelReadings};

    fn readings(model: &str, waiting: f64, kv: f64, tokens: f64) -> PodReadings {
        let mut r = PodReadings::new();
        r.insert(
            model.into(),
            ModelReadings {
                waiting: Some(waiting),
                running: Some(1.0),
                kv_cache: Some(kv),
                generation_tokens_total: Some(tokens),
                prompt_tokens_total: None,
            },
        );
        r
    }

    fn with_prompt(mut pod: PodReadings, model: &str, prompt: f64) -> PodReadings {
        if let Some(r) = pod.get_mut(model) {
            r.prompt_tokens_total = Some(prompt);
        }
        pod
    }

    fn target() -> Target {
        Target {
            pods: Pods::Static(vec!["a:1".into(), "b:1".into()]),
            scheme: "http".into(),
            path: "/metrics".into(),
            timeout: Duration::from_secs(1),
            matchers: vec![],
            rate_window: Duration::from_secs(30),
        }
    }

    fn all() -> Selection {
        Selection {
            namespace: None,
            model: Some("m".into()),
        }
    }

    #[test]
    fn pods_are_summed_and_token_rates_need_two_passes() {
        let rates = Mutex::new(IdleMap::new(IDLE));
        let (a, b) = (
            Endpoint {
                address: "a:1".into(),
                name: "a".into(),
            },
            Endpoint {
                address: "b:1".into(),
                name: "b".into(),
            },
        );
        let t = target();
        let first = summarise(
            &t,
            &[
                (&a, 0.0, readings("m", 2.0, 0.5, 100.0)),
                (&b, 0.0, readings("m", 3.0, 0.25, 0.0)),
            ],
            &rates,
            30.0,
        );
        assert!(first.rates_warming_up);
        let w = first.families.waiting.select(&all()).expect("some");
        assert_eq!((w.total, w.pods), (5.0, 2));
        assert_eq!(
            first.families.kv_cache.select(&all()).map(|a| a.total),
            Some(0.75)
        );
        assert_eq!(first.families.generation_tokens.select(&all()), None);

        // 10 s later: a restarted (counter reset to 40), b produced 200 tokens.
        let second = summarise(
            &t,
            &[
                (&a, 10.0, readings("m", 0.0, 0.5, 40.0)),
                (&b, 10.0, readings("m", 0.0, 0.25, 200.0)),
            ],
            &rates,
            30.0,
        );
        assert!(!second.rates_warming_up);
        let g = second
            .families
            .generation_tokens
            .select(&all())
            .expect("rates");
        assert_eq!(g.total, 4.0 + 20.0);
    }

    #[test]
    fn prompt_tokens_are_rated_on_their_own_counter() {
        let rates = Mutex::new(IdleMap::new(IDLE));
        let a = Endpoint {
            address: "a:1".into(),
            name: "a".into(),
        };
        let t = target();
        let first = summarise(
            &t,
            &[(
                &a,
                0.0,
                with_prompt(readings("m", 0.0, 0.1, 100.0), "m", 5000.0),
            )],
            &rates,
            30.0,
        );
        assert!(first.rates_warming_up);
        assert_eq!(first.families.prompt_tokens.select(&all()), None);
        let second = summarise(
            &t,
            &[(
                &a,
                10.0,
                with_prompt(readings("m", 0.0, 0.1, 300.0), "m", 9000.0),
            )],
            &rates,
            30.0,
        );
        assert!(!second.rates_warming_up);
        let p = second.families.prompt_tokens.select(&all()).expect("rate");
        let g = second
            .families
            .generation_tokens
            .select(&all())
            .expect("rate");
        assert_eq!((p.total, p.pods), (400.0, 1));
        assert_eq!((g.total, g.pods), (20.0, 1));
    }

    #[test]
    fn prompt_tokens_alone_warm_up_and_rate() {
        let rates = Mutex::new(IdleMap::new(IDLE));
        let a = Endpoint {
            address: "a:1".into(),
            name: "a".into(),
        };
        let only_prompt = |v: f64| {
            let mut r = PodReadings::new();
            r.insert(
                "m".into(),
                ModelReadings {
                    waiting: Some(0.0),
                    prompt_tokens_total: Some(v),
                    ..ModelReadings::default()
                },
            );
            r
        };
        let t = target();
        let first = summarise(&t, &[(&a, 0.0, only_prompt(100.0))], &rates, 30.0);
        assert!(first.rates_warming_up);
        let second = summarise(&t, &[(&a, 5.0, only_prompt(50.0))], &rates, 30.0);
        assert!(!second.rates_warming_up);
        // A reset counts from zero, as for generated tokens.
        let p = second.families.prompt_tokens.select(&all()).expect("rate");
        assert_eq!(p.total, 10.0);
        assert_eq!(second.families.generation_tokens.select(&all()), None);
    }
}
