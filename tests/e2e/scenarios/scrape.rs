//! Direct scraping finds its pods on a real API server: `nightshift scaler` (with a kubeconfig)
//! watches the EndpointSlices of a selector-less Service whose endpoints point at vLLM-metrics
//! emulators. The API server refuses loopback (and link-local) endpoint addresses, and FQDN
//! endpoints need a dotted name, so the emulators listen on this machine's own non-loopback IPv4
//! address (found from the routing table; nothing leaves the machine), and GetMetrics with
//! `service` metadata answers the sum over the ready endpoints. Adding an endpoint, marking one not
//! ready and removing one make the demand follow; once no ready endpoint is left the answer is an
//! error, never zero.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, ensure};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use nightshift::scaler::service::proto::{
    GetMetricsRequest, ScaledObjectRef, external_scaler_client::ExternalScalerClient,
};
use serde_json::json;
use tonic::transport::Channel;

use crate::harness::cluster::Cluster;
use crate::harness::process::{Process, free_port, tail};
use crate::harness::source::emulator;
use crate::harness::wait::{self, Check};

const NS: &str = "e2e-scrape";
const SERVICE: &str = "llama-vllm";
const MODEL: &str = "llama";
/// Waiting requests per emulated pod; distinct so that every sum names its endpoints.
const WAITING: [f64; 3] = [3.0, 5.0, 11.0];
/// Deadline of each step; the scaler sees a change within its 1 s cache TTL plus the watch delay.
const STEP: Duration = Duration::from_secs(60);
/// Each gRPC call is bounded so that a hang fails the step instead of the scenario timeout.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn run(cluster: std::sync::Arc<Cluster>) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("nightshift-e2e-scrape-")
        .tempdir()?;
    let result = scenario(&cluster, dir.path()).await;
    let cleanup = cluster.delete_namespace(NS).await;
    match result {
        Ok(()) => cleanup,
        Err(e) => {
            let kept = dir.keep();
            let log = kept.join("nightshift-scaler.log");
            Err(anyhow!(
                "{e:#}\nscaler log kept in {}\n----- nightshift-scaler -----\n{}",
                log.display(),
                tail(&log, 30)
            ))
        }
    }
}

async fn scenario(cluster: &Cluster, dir: &Path) -> Result<()> {
    let client = cluster.client.clone();
    cluster.create_namespace(NS, json!({})).await?;
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": SERVICE},
                // No selector: the endpoints are ours to write, as for pods outside the cluster.
                "spec": {"ports": [{"name": "http", "port": 8000}]},
            }))?,
        )
        .await?;

    let ip = host_ipv4()?;
    let mut emus = Vec::new();
    for waiting in WAITING {
        let e = emulator::Emulator::start_on(IpAddr::V4(ip), MODEL, 1, false).await;
        e.set(0, |engine| engine.waiting = waiting);
        emus.push(e);
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    // One slice per emulator: each listens on its own port, and a slice has one port list.
    for (i, emu) in emus.iter().enumerate().take(2) {
        slices
            .create(
                &PostParams::default(),
                &slice(ip, i, emu.addr.port(), true)?,
            )
            .await?;
    }

    let scaler = ScalerProcess::start(dir, &cluster.kubeconfig)?;
    scaler.wait_ready().await?;
    let mut grpc = scaler.connect().await?;
    let so = ScaledObjectRef {
        name: "llama".into(),
        namespace: NS.into(),
        scaler_metadata: BTreeMap::from([
            ("service".to_string(), SERVICE.to_string()),
            ("port".to_string(), "http".to_string()),
            ("model".to_string(), MODEL.to_string()),
            ("waitingTarget".to_string(), "1".to_string()),
        ]),
    };

    // Two ready endpoints: 3 + 5 waiting → 8 replicas → metric value 800.
    let t = Instant::now();
    expect_value(&mut grpc, &so, 800.0, "two endpoints").await?;
    println!(
        "    scrape: first answer over two EndpointSlices in {:.2} s",
        t.elapsed().as_secs_f64()
    );

    // A third endpoint appears.
    let t = Instant::now();
    slices
        .create(
            &PostParams::default(),
            &slice(ip, 2, emus[2].addr.port(), true)?,
        )
        .await?;
    expect_value(&mut grpc, &so, 1900.0, "a third endpoint added").await?;
    println!(
        "    scrape: endpoint added → demand followed in {:.2} s",
        t.elapsed().as_secs_f64()
    );

    // The second one is marked not ready: its load no longer counts.
    let t = Instant::now();
    slices
        .replace(
            &slice_name(1),
            &PostParams::default(),
            &with_version(
                slice(ip, 1, emus[1].addr.port(), false)?,
                &slices.get(&slice_name(1)).await?,
            ),
        )
        .await?;
    expect_value(&mut grpc, &so, 1400.0, "the second endpoint not ready").await?;
    println!(
        "    scrape: endpoint not ready → demand followed in {:.2} s",
        t.elapsed().as_secs_f64()
    );

    // The first one is removed.
    let t = Instant::now();
    slices
        .delete(&slice_name(0), &DeleteParams::default())
        .await?;
    expect_value(&mut grpc, &so, 1100.0, "the first endpoint removed").await?;
    println!(
        "    scrape: endpoint removed → demand followed in {:.2} s",
        t.elapsed().as_secs_f64()
    );

    // Ready again, via a patch of the condition alone.
    slices
        .patch(
            &slice_name(1),
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": [endpoint_json(ip, true)]})),
        )
        .await?;
    expect_value(&mut grpc, &so, 1600.0, "the second endpoint ready again").await?;

    // No ready endpoint left (one removed, the other not ready): an error, never zero.
    let t = Instant::now();
    slices
        .delete(&slice_name(2), &DeleteParams::default())
        .await?;
    slices
        .patch(
            &slice_name(1),
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": [endpoint_json(ip, false)]})),
        )
        .await?;
    let status = wait::until("GetMetrics to fail with no ready endpoint", STEP, || {
        let mut grpc = grpc.clone();
        let so = so.clone();
        async move {
            Ok(match get_metrics(&mut grpc, &so).await {
                Ok(v) => Check::Pending(format!("answered {v}")),
                Err(status) => Check::Done(status),
            })
        }
    })
    .await?;
    println!(
        "    scrape: no ready endpoint → {:?} in {:.2} s: {}",
        status.code(),
        t.elapsed().as_secs_f64(),
        status.message()
    );
    ensure!(
        status.code() == tonic::Code::Unavailable,
        "no ready endpoint should be UNAVAILABLE, got {status:?}"
    );
    ensure!(
        status.message().contains(SERVICE) && status.message().contains("no ready endpoint"),
        "the error should name the service and say why: {status:?}"
    );
    // It stays an error (not a zero once cached answers expire).
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Ok(v) = get_metrics(&mut grpc, &so).await {
            return Err(anyhow!("answered {v} with no ready endpoint"));
        }
    }
    // Even when no data at all is declared to mean no demand.
    let mut zero = so.clone();
    zero.scaler_metadata
        .insert("emptyResult".into(), "zero".into());
    if let Ok(v) = get_metrics(&mut grpc, &zero).await {
        return Err(anyhow!(
            "answered {v} with no ready endpoint and emptyResult: zero"
        ));
    }
    scaler.check_running()?;
    Ok(())
}

/// This machine's IPv4 address on its default route: a UDP "connect" only consults the routing
/// table, no packet is sent. The address is a TEST-NET-3 one (RFC 5737), never routed.
fn host_ipv4() -> Result<Ipv4Addr> {
    let socket = UdpSocket::bind("0.0.0.0:0")?;
    socket
        .connect("203.0.113.1:9")
        .map_err(|e| anyhow!("this scenario needs a non-loopback IPv4 address: {e}"))?;
    match socket.local_addr()?.ip() {
        IpAddr::V4(ip) if !ip.is_loopback() && !ip.is_unspecified() && !ip.is_link_local() => {
            Ok(ip)
        }
        other => Err(anyhow!(
            "this scenario needs a non-loopback IPv4 address; the default route uses {other}"
        )),
    }
}

fn slice_name(i: usize) -> String {
    format!("{SERVICE}-{i}")
}

fn endpoint_json(ip: Ipv4Addr, ready: bool) -> serde_json::Value {
    json!({"addresses": [ip.to_string()], "conditions": {"ready": ready}})
}

fn slice(ip: Ipv4Addr, i: usize, port: u16, ready: bool) -> Result<EndpointSlice> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name(i),
            "labels": {"kubernetes.io/service-name": SERVICE},
        },
        "addressType": "IPv4",
        "endpoints": [endpoint_json(ip, ready)],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    }))?)
}

fn with_version(mut new: EndpointSlice, old: &EndpointSlice) -> EndpointSlice {
    new.metadata.resource_version = old.metadata.resource_version.clone();
    new
}

async fn get_metrics(
    grpc: &mut ExternalScalerClient<Channel>,
    so: &ScaledObjectRef,
) -> Result<f64, tonic::Status> {
    let mut request = tonic::Request::new(GetMetricsRequest {
        scaled_object_ref: Some(so.clone()),
        metric_name: "vllm-demand".into(),
    });
    request.set_timeout(CALL_TIMEOUT);
    let response = grpc.get_metrics(request).await?.into_inner();
    response
        .metric_values
        .first()
        .map(|v| v.metric_value_float)
        .ok_or_else(|| tonic::Status::internal("no metric value in the answer"))
}

/// Polls GetMetrics until it answers `want`.
async fn expect_value(
    grpc: &mut ExternalScalerClient<Channel>,
    so: &ScaledObjectRef,
    want: f64,
    what: &str,
) -> Result<()> {
    wait::until(&format!("GetMetrics = {want} ({what})"), STEP, || {
        let mut grpc = grpc.clone();
        let so = so.clone();
        async move {
            Ok(match get_metrics(&mut grpc, &so).await {
                Ok(v) if (v - want).abs() < 1e-9 => Check::Done(()),
                Ok(v) => Check::Pending(format!("answered {v}")),
                Err(s) => Check::Pending(format!("{:?}: {}", s.code(), s.message())),
            })
        }
    })
    .await
}

/// The scaler binary, with a kubeconfig for the test API server.
struct ScalerProcess {
    process: Mutex<Process>,
    grpc_addr: String,
    admin_addr: String,
}

impl ScalerProcess {
    fn start(dir: &Path, kubeconfig: &Path) -> Result<Self> {
        let grpc_addr = format!("127.0.0.1:{}", free_port()?);
        let admin_addr = format!("127.0.0.1:{}", free_port()?);
        let args = vec![
            "scaler".to_string(),
            format!("--scaler-addr={grpc_addr}"),
            format!("--admin-addr={admin_addr}"),
        ];
        let process = Process::spawn_with_env(
            "nightshift-scaler",
            Path::new(env!("CARGO_BIN_EXE_nightshift")),
            &args,
            &[
                ("KUBECONFIG", kubeconfig.display().to_string()),
                ("NIGHTSHIFT_LOG", "info".to_string()),
            ],
            dir,
        )?;
        Ok(Self {
            process: Mutex::new(process),
            grpc_addr,
            admin_addr,
        })
    }

    fn check_running(&self) -> Result<()> {
        self.process
            .lock()
            .map_err(|_| anyhow!("poisoned"))?
            .check_running()
    }

    async fn wait_ready(&self) -> Result<()> {
        let url = format!("http://{}/readyz", self.admin_addr);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()?;
        wait::http_ok("nightshift scaler /readyz", &http, &url, STEP, || {
            self.check_running()
        })
        .await
    }

    async fn connect(&self) -> Result<ExternalScalerClient<Channel>> {
        let channel = Channel::from_shared(format!("http://{}", self.grpc_addr))?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await?;
        Ok(ExternalScalerClient::new(channel))
    }
}
