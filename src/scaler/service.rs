//! The gRPC adapter: KEDA's `ExternalScaler` service over [`Scaler`], the standard
//! `grpc.health.v1` service beside it, optional TLS/mTLS. Thin on purpose: every RPC parses the
//! request, calls the scaler, and maps errors once through [`Error`]'s `Status` conversion.

use std::{pin::Pin, sync::Arc, time::Instant};

use futures::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{
    Request, Response, Status,
    transport::{Server, server::TcpIncoming},
};

use super::{Error, Evaluation, METRIC_NAME, Scaler, StartError};
use crate::{demand::METRIC_TARGET, tls::ServerTls};

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

#[tonic::async_trait]
impl ExternalScaler for ScalerService {
    #[tracing::instrument(skip_all, fields(namespace = %request.get_ref().namespace, scaled_object = %request.get_ref().name))]
    async fn is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        let ev = self.evaluate("IsActive", request.get_ref()).await?;
        Ok(Response::new(IsActiveResponse { result: ev.active }))
    }

    type StreamIsActiveStream = StreamOf<IsActiveResponse>;

    #[tracing::instrument(skip_all, fields(namespace = %request.get_ref().namespace, scaled_object = %request.get_ref().name))]
    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let so = request.into_inner();
        // Reject bad metadata and refused sources up front rather than on the stream.
        self.scaler.admit(&so.namespace, &so.scaler_metadata)?;
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

    #[tracing::instrument(skip_all, fields(namespace = %request.get_ref().namespace, scaled_object = %request.get_ref().name))]
    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let started = Instant::now();
        let so = request.get_ref();
        let parsed = self.scaler.admit(&so.namespace, &so.scaler_metadata);
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

    #[tracing::instrument(skip_all, fields(metric = %request.get_ref().metric_name))]
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

/// Serves the scaler and the health service on `listener` until `shutdown` is cancelled; over
/// TLS (reloaded from disk, see [`ServerTls`]) when `tls` is given: tonic serves the stream of
/// connections that [`crate::tls::incoming`] has handshaken.
pub async fn serve(
    listener: tokio::net::TcpListener,
    scaler: Arc<Scaler>,
    tls: Option<Arc<ServerTls>>,
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
        .add_service(health_service)
        .add_service(ExternalScalerServer::new(ScalerService::new(scaler)));
    let served = match tls {
        Some(tls) => {
            let connections = crate::tls::incoming(tls, listener, shutdown.clone());
            router
                .serve_with_incoming_shutdown(connections, shutdown.cancelled())
                .await
        }
        None => {
            router
                .serve_with_incoming_shutdown(
                    TcpIncoming::from(listener).with_nodelay(Some(true)),
                    shutdown.cancelled(),
                )
                .await
        }
    };
    served.map_err(StartError::Serve)
}
