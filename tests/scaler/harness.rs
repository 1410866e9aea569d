//! Starts the scaler's real gRPC server on 127.0.0.1:0 and talks to it with the client generated
//! from the same proto.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use nightshift::{
    runtime::tls::ServerTls,
    scaler::{
        Options, Scaler,
        forecasts::ForecastOptions,
        metrics::ScalerMetrics,
        service::{
            self,
            proto::{
                GetMetricsRequest, MetricValue, ScaledObjectRef,
                external_scaler_client::ExternalScalerClient,
            },
        },
    },
    sources::{metrics::SourceMetrics, policy::SourcePolicy},
};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tonic::{Status, transport::Channel};

/// Namespace of the test ScaledObjects.
pub const NAMESPACE: &str = "team-a";

/// A running scaler; stops when dropped.
pub struct ScalerUnderTest {
    pub addr: SocketAddr,
    pub scaler: Arc<Scaler>,
    pub registry: Arc<Registry>,
    stop: CancellationToken,
}

impl Drop for ScalerUnderTest {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ScalerUnderTest {
    /// Plaintext scaler with the given cache TTL, allowed to reach the emulators and servers the
    /// tests run on loopback (what a development setup allows with the policy flags).
    pub async fn start(cache_ttl: Duration) -> Self {
        Self::start_with(cache_ttl, Duration::from_millis(50), None).await
    }

    pub async fn start_with(
        cache_ttl: Duration,
        stream_interval: Duration,
        tls: Option<Arc<ServerTls>>,
    ) -> Self {
        Self::start_with_policy(cache_ttl, stream_interval, tls, SourcePolicy::permissive()).await
    }

    /// A plaintext scaler under `policy`.
    pub async fn start_with_policy(
        cache_ttl: Duration,
        stream_interval: Duration,
        tls: Option<Arc<ServerTls>>,
        policy: SourcePolicy,
    ) -> Self {
        Self::start_full(
            cache_ttl,
            stream_interval,
            tls,
            policy,
            service::Limits::default(),
        )
        .await
    }

    /// A scaler under `policy` and listener `limits`.
    pub async fn start_full(
        cache_ttl: Duration,
        stream_interval: Duration,
        tls: Option<Arc<ServerTls>>,
        policy: SourcePolicy,
        limits: service::Limits,
    ) -> Self {
        Self::start_options(
            Options {
                cache_ttl,
                stream_interval,
                policy,
                forecast: ForecastOptions::default(),
            },
            tls,
            limits,
        )
        .await
    }

    /// A plaintext, permissive scaler whose forecasts run under `forecast` (its clock, its
    /// Prometheus).
    pub async fn start_with_forecast(cache_ttl: Duration, forecast: ForecastOptions) -> Self {
        Self::start_options(
            Options {
                cache_ttl,
                stream_interval: Duration::from_millis(50),
                policy: SourcePolicy::permissive(),
                forecast,
            },
            None,
            service::Limits::default(),
        )
        .await
    }

    /// A scaler with `options`, serving `tls` (or plaintext) under listener `limits`.
    pub async fn start_options(
        options: Options,
        tls: Option<Arc<ServerTls>>,
        limits: service::Limits,
    ) -> Self {
        nightshift::install_crypto_provider();
        let stop = CancellationToken::new();
        let mut registry = Registry::with_prefix("nightshift");
        let source_metrics = SourceMetrics::default();
        source_metrics.register(&mut registry);
        let scaler_metrics = ScalerMetrics::default();
        scaler_metrics.register(&mut registry);
        let scaler = Arc::new(
            Scaler::new(options, None, source_metrics, scaler_metrics, stop.clone())
                .expect("scaler"),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (s, t) = (scaler.clone(), stop.clone());
        tokio::spawn(async move {
            if let Err(e) = service::serve(listener, s, tls, limits, t).await {
                eprintln!("scaler server failed: {e}");
            }
        });
        Self {
            addr,
            scaler,
            registry: Arc::new(registry),
            stop,
        }
    }

    /// A plaintext client.
    pub async fn client(&self) -> ExternalScalerClient<Channel> {
        ExternalScalerClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect")
    }

    /// The Prometheus text of the scaler's metrics.
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("encode");
        out
    }
}

/// A ScaledObject reference in [`NAMESPACE`].
pub fn scaled_object(name: &str, metadata: &[(&str, &str)]) -> ScaledObjectRef {
    ScaledObjectRef {
        name: name.to_string(),
        namespace: NAMESPACE.to_string(),
        scaler_metadata: metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// Calls GetMetrics and returns the single value.
pub async fn get_metrics(
    client: &mut ExternalScalerClient<Channel>,
    so: &ScaledObjectRef,
) -> Result<MetricValue, Status> {
    let response = client
        .get_metrics(GetMetricsRequest {
            scaled_object_ref: Some(so.clone()),
            metric_name: "vllm-demand".into(),
        })
        .await?
        .into_inner();
    assert_eq!(response.metric_values.len(), 1, "{response:?}");
    Ok(response.metric_values[0].clone())
}

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// GETs `path` from a server of `router` over real HTTP, as JSON.
pub async fn get_json(router: axum::Router, path: &str) -> serde_json::Value {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let answer = reqwest::get(format!("http://{addr}{path}"))
        .await
        .expect("GET")
        .json()
        .await
        .expect("JSON");
    server.abort();
    answer
}
