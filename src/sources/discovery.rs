//! Finds the vLLM pods behind a Service from its EndpointSlices, with one `kube` reflector per
//! Service (started on first use, shared afterwards). Only endpoints that are not marked
//! not-ready are returned: a starting or terminating pod has no meaningful load. A Service with
//! no ready endpoint is an error, never an empty (zero-demand) list.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{
    SourceError,
    idle::{IDLE, IdleMap},
};

/// The label EndpointSlices carry naming their Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// One pod endpoint to scrape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    /// `host:port` (IPv6 hosts bracketed).
    pub address: String,
    /// Pod name when known (for explanations), else the address.
    pub name: String,
}

/// One Service's watch: its cache, and the guard that stops the watch when dropped.
struct Watched {
    store: Store<EndpointSlice>,
    _stop: DropGuard,
}

/// Watches EndpointSlices of the Services that ScaledObjects point at. A Service no
/// ScaledObject has asked about for [`IDLE`] has its watch stopped and its cache dropped.
pub struct Discovery {
    client: Option<kube::Client>,
    watched: Mutex<IdleMap<(String, String), Watched>>,
    shutdown: CancellationToken,
}

impl Discovery {
    /// `client` is `None` without a cluster: Service lookups then fail with a clear error.
    pub fn new(client: Option<kube::Client>, shutdown: CancellationToken) -> Self {
        Self::with_idle(client, shutdown, IDLE)
    }

    /// As [`Discovery::new`], stopping watches unused for `idle`.
    pub fn with_idle(
        client: Option<kube::Client>,
        shutdown: CancellationToken,
        idle: Duration,
    ) -> Self {
        Self {
            client,
            watched: Mutex::new(IdleMap::new(idle)),
            shutdown,
        }
    }

    /// Services watched now.
    pub fn watched(&self) -> usize {
        self.watched.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn store(&self, namespace: &str, service: &str) -> Result<Store<EndpointSlice>, SourceError> {
        let Some(client) = &self.client else {
            return Err(SourceError::NotConfigured(format!(
                "service {namespace}/{service}: discovering pods needs a Kubernetes connection and \
                 none was found; list the pods in `endpoints` or read from Prometheus with \
                 `serverAddress`"
            )));
        };
        let mut watched = self.watched.lock().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_string(), service.to_string());
        let entry = watched.use_or_insert_with(key, Instant::now(), || {
            self.watch(client, namespace, service)
        });
        Ok(entry.store.clone())
    }

    /// Starts the watch of `namespace/service`'s EndpointSlices; it runs until shutdown or
    /// until the returned entry is dropped.
    fn watch(&self, client: &kube::Client, namespace: &str, service: &str) -> Watched {
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
        let config = watcher::Config::default().labels(&format!("{SERVICE_NAME_LABEL}={service}"));
        let (store, writer) = reflector::store();
        let stream = reflector::reflector(writer, watcher(api, config))
            .default_backoff()
            .applied_objects();
        let stop = self.shutdown.child_token();
        let (ns, svc, cancelled) = (namespace.to_string(), service.to_string(), stop.clone());
        tokio::spawn(async move {
            tracing::info!(namespace = %ns, service = %svc, "watching EndpointSlices");
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    () = cancelled.cancelled() => break,
                    next = stream.next() => match next {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => tracing::warn!(namespace = %ns, service = %svc, error = %e, "EndpointSlice watch error; retrying"),
                        None => break,
                    }
                }
            }
            tracing::info!(namespace = %ns, service = %svc, "stopped watching EndpointSlices");
        });
        Watched {
            store,
            _stop: stop.drop_guard(),
        }
    }

    /// The ready endpoints of `namespace/service` on `port` (a port name or number; `None`
    /// takes each slice's first port). Waits up to `timeout` for the first list.
    pub async fn endpoints(
        &self,
        namespace: &str,
        service: &str,
        port: Option<&str>,
        timeout: Duration,
    ) -> Result<Vec<Endpoint>, SourceError> {
        let store = self.store(namespace, service)?;
        match tokio::time::timeout(timeout, store.wait_until_ready()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                return Err(SourceError::Unavailable {
                    upstream: format!("EndpointSlices of {namespace}/{service}"),
                    detail: "the watch stopped".into(),
                });
            }
            Err(_) => {
                return Err(SourceError::Timeout {
                    upstream: format!("Kubernetes API (EndpointSlices of {namespace}/{service})"),
                    after: timeout,
                });
            }
        }
        let slices: Vec<Arc<EndpointSlice>> = store.state();
        ready_endpoints(namespace, service, &slices, port)
    }
}

/// Pure: the ready endpoints of a Service's slices, or an error when there is none. No pod means
/// no queue to read, not an empty one: answering zero would scale inference down (or keep it at
/// zero) exactly when nothing can be measured, so the caller gets an error and KEDA's fallback.
pub fn ready_endpoints(
    namespace: &str,
    service: &str,
    slices: &[Arc<EndpointSlice>],
    port: Option<&str>,
) -> Result<Vec<Endpoint>, SourceError> {
    let endpoints = endpoints_of(slices.iter().map(|s| s.as_ref()), port);
    if endpoints.is_empty() {
        let on_port = port.map(|p| format!(" on port {p}")).unwrap_or_default();
        return Err(SourceError::Unavailable {
            upstream: format!("service {namespace}/{service}"),
            detail: format!(
                "no ready endpoint{on_port} in its {} EndpointSlice(s) (label {SERVICE_NAME_LABEL}={service}): \
                 no pod to read demand from",
                slices.len()
            ),
        });
    }
    Ok(endpoints)
}

/// Pure: ready endpoints of the given slices on the given port.
pub fn endpoints_of<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    port: Option<&str>,
) -> Vec<Endpoint> {
    let mut out = Vec::new();
    for slice in slices {
        let ports = slice.ports.as_deref().unwrap_or_default();
        let chosen = match port {
            None => ports.first(),
            Some(p) => ports.iter().find(|sp| {
                sp.name.as_deref() == Some(p)
                    || sp.port.map(|n| n.to_string()).as_deref() == Some(p)
            }),
        };
        let number = match (chosen.and_then(|p| p.port), port) {
            (Some(n), _) => n.to_string(),
            (None, Some(p)) if p.parse::<u16>().is_ok() => p.to_string(),
            _ => continue,
        };
        let ipv6 = slice.address_type == "IPv6";
        for ep in slice.endpoints.iter().flatten() {
            if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            let Some(addr) = ep.addresses.first() else {
                continue;
            };
            let host = if ipv6 {
                format!("[{addr}]")
            } else {
                addr.clone()
            };
            let address = format!("{host}:{number}");
            let name = ep
                .target_ref
                .as_ref()
                .and_then(|r| r.name.clone())
                .unwrap_or_else(|| address.clone());
            out.push(Endpoint { address, name });
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::{
        core::v1::ObjectReference,
        discovery::v1::{Endpoint as SliceEndpoint, EndpointConditions, EndpointPort},
    };

    /// A client for an API server that is not there: watches start and retry, never list.
    fn unreachable_client() -> kube::Client {
        let uri = "http://127.0.0.1:1".parse().expect("uri");
        kube::Client::try_from(kube::Config::new(uri)).expect("client")
    }

    /// A Service no lookup has named for the idle time has its watch stopped and dropped; the
    /// Services still asked about keep theirs.
    #[tokio::test]
    async fn watches_of_services_no_longer_asked_about_are_stopped() {
        // A second: a pause of the test shorter than most of it cannot make "kept" idle.
        let idle = Duration::from_secs(1);
        let shutdown = CancellationToken::new();
        let discovery = Discovery::with_idle(Some(unreachable_client()), shutdown.clone(), idle);
        let lookup = |service: &'static str| {
            let discovery = &discovery;
            async move {
                discovery
                    .endpoints("team-a", service, None, Duration::from_millis(1))
                    .await
            }
        };
        assert!(matches!(
            lookup("gone").await,
            Err(SourceError::Timeout { .. })
        ));
        assert!(lookup("kept").await.is_err());
        assert_eq!(discovery.watched(), 2);
        // "kept" is asked about more often than the idle time; "gone" never again.
        let started = Instant::now();
        while started.elapsed() <= 2 * idle {
            assert!(lookup("kept").await.is_err());
            tokio::time::sleep(idle / 4).await;
        }
        assert_eq!(discovery.watched(), 1, "the idle watch was dropped");
        // Asked about again, a dropped Service is watched afresh.
        assert!(lookup("gone").await.is_err());
        assert_eq!(discovery.watched(), 2);
        shutdown.cancel();
    }

    fn slice(address_type: &str, eps: &[(&str, Option<bool>, &str)]) -> EndpointSlice {
        EndpointSlice {
            address_type: address_type.into(),
            endpoints: Some(
                eps.iter()
                    .map(|(ip, ready, pod)| SliceEndpoint {
                        addresses: vec![ip.to_string()],
                        conditions: Some(EndpointConditions {
                            ready: *ready,
                            ..Default::default()
                        }),
                        target_ref: Some(ObjectReference {
                            name: Some(pod.to_string()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                port: Some(8000),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn not_ready_endpoints_are_skipped() {
        let s = slice(
            "IPv4",
            &[
                ("10.0.0.1", Some(true), "a"),
                ("10.0.0.2", Some(false), "b"),
                ("10.0.0.3", None, "c"),
            ],
        );
        let eps = endpoints_of([&s], Some("http"));
        let addrs: Vec<_> = eps.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(addrs, ["10.0.0.1:8000", "10.0.0.3:8000"]);
        assert_eq!(eps[0].name, "a");
    }

    #[test]
    fn no_ready_endpoint_is_an_unavailable_error_naming_the_service() {
        let none_ready = Arc::new(slice("IPv4", &[("10.0.0.2", Some(false), "b")]));
        let err = ready_endpoints("ns", "llama", &[none_ready], Some("http"))
            .expect_err("no ready endpoint must not be an empty list");
        assert!(matches!(err, SourceError::Unavailable { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("service ns/llama"), "{text}");
        assert!(text.contains("no ready endpoint on port http"), "{text}");
        let err = ready_endpoints("ns", "llama", &[], None).expect_err("no slice at all");
        assert!(err.to_string().contains("0 EndpointSlice"), "{err}");
        let one = Arc::new(slice("IPv4", &[("10.0.0.1", Some(true), "a")]));
        let err = ready_endpoints("ns", "llama", std::slice::from_ref(&one), Some("metrics"))
            .expect_err("no such port");
        assert!(err.to_string().contains("on port metrics"), "{err}");
        assert_eq!(
            ready_endpoints("ns", "llama", &[one], None).expect("ready")[0].address,
            "10.0.0.1:8000"
        );
    }

    #[test]
    fn ports_match_by_name_or_number_and_ipv6_is_bracketed() {
        let s = slice("IPv6", &[("fd00::1", Some(true), "a")]);
        assert_eq!(
            endpoints_of([&s], Some("8000"))[0].address,
            "[fd00::1]:8000"
        );
        assert_eq!(endpoints_of([&s], None)[0].address, "[fd00::1]:8000");
        assert!(endpoints_of([&s], Some("metrics")).is_empty());
    }
}
