//! The gRPC adapter: KEDA's `ExternalScaler` service over [`Scaler`], the standard
//! `grpc.health.v1` service beside it, optional TLS/mTLS. Thin on purpose: every RPC parses the
//! request, calls the scaler, and maps errors once through [`Error`]'s `Status` conversion.

use std::{
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, transport::Server};

use super::{Evaluation, METRIC_NAME, Scaler, StartError, error::Error, metadata};
use crate::{
    core::demand::METRIC_TARGET,
    runtime::listen,
    runtime::tls::{AcceptLimits, ServerTls},
};

/// The gRPC server's limits (docs/security.md, "Listener limits").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once (TLS: handshaking included); more wait in the kernel backlog.
    pub max_connections: usize,
    /// TLS handshakes in flight and how long one may take.
    pub max_handshakes: usize,
    pub handshake_timeout: Duration,
    /// Largest request message accepted; larger ones are refused with `OUT_OF_RANGE`.
    pub max_message_bytes: usize,
    /// HTTP/2 streams one connection may have open at once (each `StreamIsActive` holds one).
    pub max_streams: u32,
    /// Requests one connection may have in evaluation at once; more wait.
    pub concurrency_per_connection: usize,
    /// Bound on one RPC until its answer (a stream: until it starts).
    pub rpc_timeout: Duration,
    /// HTTP/2 ping interval on idle connections, and how long an answer may take.
    pub keep_alive_interval: Duration,
    pub keep_alive_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            // KEDA's operator keeps one connection per scaler address (and the metrics server
            // one more); kubelet gRPC probes open one each. 256 is far above that and bounds
            // file descriptors and memory against a client that opens connections in a loop.
            max_connections: 256,
            // As the webhook: a handshake costs a signature; a burst must not starve RPCs.
            max_handshakes: 32,
            // KEDA completes a handshake in milliseconds.
            handshake_timeout: Duration::from_secs(10),
            // A ScaledObjectRef is a name and its trigger metadata: a few KiB, a CA bundle in
            // `prometheusCaCert` at most a few hundred. 1 MiB (tonic's default is 4 MiB) leaves
            // room for that and refuses anything built to exhaust memory.
            max_message_bytes: 1 << 20,
            // One StreamIsActive per push-type ScaledObject rides KEDA's single connection; a
            // thousand is beyond the ScaledObjects one operator serves. grpc-go clients queue
            // streams above the server's limit instead of failing them.
            max_streams: 1024,
            // Unary RPCs of one connection evaluated at once; KEDA polls each ScaledObject every
            // 30 s by default, so 256 in flight is thousands of ScaledObjects, and a client
            // flooding RPCs queues behind its own connection's limit.
            concurrency_per_connection: 256,
            // An evaluation is at most two scrape passes (the warm-up of token rates), each
            // bounded by the trigger's timeout (at most 60 s), plus the 1 s gap between them.
            rpc_timeout: 2 * metadata::MAX_TIMEOUT + Duration::from_secs(5),
            // As the webhook's HTTP/2: dead peers are found within a minute.
            keep_alive_interval: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(20),
        }
    }
}

/// Code generated from `proto/externalscaler.proto`.
pub mod proto {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("externalscaler");
}

use proto::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
    external_scaler_server::{ExternalScaler, ExternalScalerServer},
};

/// The gRPC service.
#[derive(Clone)]
pub struct ScalerService {
    scaler: Arc<Scaler>,
}

impl ScalerService {
    pub fn new(scaler: Arc<Scaler>) -> Self {
        Self { scaler }
    }

    async fn evaluate(
        &self,
        rpc: &'static str,
        so: &ScaledObjectRef,
    ) -> Result<Evaluation, Status> {
        let started = Instant::now();
        let result = self
            .scaler
            .evaluate(&so.namespace, &so.name, &so.scaler_metadata)
            .await;
        let code = result
            .as_ref()
            .map_or_else(Error::code, |_| tonic::Code::Ok);
        self.scaler
            .metrics()
            .request(rpc, code, started.elapsed().as_secs_f64());
        result.map_err(Status::from)
    }
}

type StreamOf<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

// The per-call spans are at debug level: at the default `info` filter a span on every call was
// a formatted string and registry bookkeeping per call, several microseconds of the call's cost,
// while the warnings logged inside name the ScaledObject themselves.
#[tonic::async_trait]
impl ExternalScaler for ScalerService {
    #[tracing::instrument(level = "debug", skip_all, fields(namespace = %request.get_ref().namespace, scaled_object = %request.get_ref().name))]
    async fn is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        let ev = self.evaluate("IsActive", request.get_ref()).await?;
        Ok(Response::new(IsActiveResponse { result: ev.active }))
    }

    type StreamIsActiveStream = StreamOf<IsActiveResponse>;

    #[tracing::instrument(level = "debug", skip_all, fields(namespace = %request.get_ref().namespace, scaled_object = %request.get_ref().name))]
    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let so = request.into_inner();
        // Reject bad metadata and refused sources up front rather than on the stream.
        self.scaler
            .check(&so.namespace, &so.name, &so.scaler_metadata)?;
        // One message in flight is enough: only transitions are sent.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let this = self.clone();
        let shutdown = self.scaler.shutdown_token().clone();
        let interval = self.scaler.stream_interval();
        tokio::spawn(async move {
            let mut last: Option<bool> = None;
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tx.closed() => break,
                    _ = ticker.tick() => {}
                }
                match this.evaluate("StreamIsActive", &so).await {
                    Ok(ev) if last != Some(ev.active) => {
                        last = Some(ev.active);
                        if tx
                            .send(Ok(IsActiveResponse { result: ev.active }))
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(status) => {
                        // Ending the stream with the error makes KEDA see it (and reconnect)
                        // instead of trusting a stale state.
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(namespace = %request.get_ref().namespace, scaled_object = %request.get_ref().name))]
    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let started = Instant::now();
        let so = request.get_ref();
        let parsed = self
            .scaler
            .check(&so.namespace, &so.name, &so.scaler_metadata);
        let code = parsed
            .as_ref()
            .map_or_else(Error::code, |_| tonic::Code::Ok);
        self.scaler
            .metrics()
            .request("GetMetricSpec", code, started.elapsed().as_secs_f64());
        parsed?;
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![MetricSpec {
                metric_name: METRIC_NAME.to_string(),
                target_size: METRIC_TARGET as i64,
                target_size_float: METRIC_TARGET,
            }],
        }))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(metric = %request.get_ref().metric_name))]
    async fn get_metrics(
        &self,
        request: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        let req = request.into_inner();
        let so = req
            .scaled_object_ref
            .ok_or_else(|| Status::invalid_argument("scaledObjectRef is required"))?;
        let ev = self.evaluate("GetMetrics", &so).await?;
        let metric_name = if req.metric_name.is_empty() {
            METRIC_NAME.to_string()
        } else {
            req.metric_name
        };
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![MetricValue {
                metric_name,
                metric_value: ev.metric_value_int,
                metric_value_float: ev.metric_value,
            }],
        }))
    }

    type StreamMetricSpecStream = StreamOf<GetMetricSpecResponse>;

    async fn stream_metric_spec(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamMetricSpecStream>, Status> {
        // Targets are static; KEDA falls back to GetMetricSpec on UNIMPLEMENTED.
        Err(Status::unimplemented(
            "StreamMetricSpec is not supported: the metric spec is static, use GetMetricSpec",
        ))
    }
}

/// Serves the scaler and the health service on `listener` within `limits` until `shutdown` is
/// cancelled; over TLS (reloaded from disk, see [`ServerTls`]) when `tls` is given: tonic serves
/// the stream of connections that [`crate::runtime::tls::incoming`] has handshaken.
pub async fn serve(
    listener: tokio::net::TcpListener,
    scaler: Arc<Scaler>,
    tls: Option<Arc<ServerTls>>,
    limits: Limits,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    let addr = listener.local_addr().ok();
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<ExternalScalerServer<ScalerService>>()
        .await;
    let mode = tls.as_ref().map_or("plaintext", |t| t.mode());
    tracing::info!(addr = ?addr, mode, "scaler gRPC server listening");
    let router = Server::builder()
        .max_concurrent_streams(Some(limits.max_streams))
        .concurrency_limit_per_connection(limits.concurrency_per_connection)
        .timeout(limits.rpc_timeout)
        .http2_keepalive_interval(Some(limits.keep_alive_interval))
        .http2_keepalive_timeout(Some(limits.keep_alive_timeout))
        .add_service(health_service)
        .add_service(
            ExternalScalerServer::new(ScalerService::new(scaler))
                .max_decoding_message_size(limits.max_message_bytes),
        );
    let served = match tls {
        Some(tls) => {
            let accept = AcceptLimits {
                max_connections: limits.max_connections,
                max_handshakes: limits.max_handshakes,
                handshake_timeout: limits.handshake_timeout,
            };
            let connections =
                crate::runtime::tls::incoming(tls, listener, accept, shutdown.clone());
            router
                .serve_with_incoming_shutdown(connections, shutdown.cancelled())
                .await
        }
        None => {
            let connections =
                listen::accept(listener, limits.max_connections, shutdown.clone(), "scaler");
            router
                .serve_with_incoming_shutdown(connections, shutdown.cancelled())
                .await
        }
    };
    served.map_err(StartError::Serve)
}
