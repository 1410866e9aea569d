//! The scaler load the scaler benchmarks share: the `nightshift scaler` process they measure,
//! and one ScaledObject per model, reading a Prometheus stand-in that answers every query with
//! two pods per model.

use std::{
    net::SocketAddr,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use nightshift::scaler::service::proto::{GetMetricsRequest, ScaledObjectRef};
use tonic::transport::Channel;

/// A `nightshift scaler` child process; killed on drop.
pub struct ScalerProcess(Child);

impl ScalerProcess {
    /// The process id, for its `/proc` files.
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for ScalerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `nightshift scaler` on a free loopback port, reading the Prometheus stand-in at `prom`
/// (allowed exactly, with loopback, as a dev setup would), with `extra` options; returns it with
/// a gRPC channel once it answers (30 s at most). With `cores`, the process runs on those cores
/// only (`taskset -c`, see `pinning.rs`).
pub async fn start_scaler(
    prom: SocketAddr,
    extra: &[&str],
    cores: Option<&str>,
) -> (ScalerProcess, Channel) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    let mut command = match cores {
        Some(cores) => {
            let mut c = Command::new("taskset");
            c.args(["-c", cores, env!("CARGO_BIN_EXE_nightshift")]);
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_nightshift")),
    };
    let child = command
        .args([
            "scaler",
            "--scaler-addr",
            &format!("127.0.0.1:{port}"),
            "--admin-addr",
            "127.0.0.1:0",
            "--scaler-allowed-prometheus",
            &format!("http://{prom}"),
            "--scaler-allow-loopback",
            "--log",
            "error",
        ])
        .args(extra)
        .env("KUBECONFIG", "/nonexistent")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nightshift scaler");
    let server = ScalerProcess(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let endpoint = Channel::from_shared(format!("http://127.0.0.1:{port}")).expect("uri");
        if let Ok(channel) = endpoint.connect().await {
            return (server, channel);
        }
        assert!(Instant::now() < deadline, "the scaler did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The Prometheus answer for `models` models, two pods each, every series at 0.5.
pub fn prometheus_answer(models: usize) -> String {
    let items: Vec<String> = (0..models)
        .flat_map(|m| {
            (0..2).map(move |p| {
                format!(
                    r#"{{"metric":{{"namespace":"bench","model_name":"model-{m}","pod":"pod-{m}-{p}"}},"value":[1700000000.0,"0.5"]}}"#
                )
            })
        })
        .collect();
    format!(
        r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
        items.join(",")
    )
}

/// KEDA's `GetMetrics` for ScaledObject `i`, reading model `i` from the Prometheus at `prom`.
pub fn request(prom: SocketAddr, i: usize) -> GetMetricsRequest {
    let meta: nightshift::scaler::metadata::Table = [
        ("serverAddress", format!("http://{prom}")),
        ("model", format!("model-{i}")),
        ("waitingTarget", "2".into()),
        ("kvCacheTarget", "0.8".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    GetMetricsRequest {
        scaled_object_ref: Some(ScaledObjectRef {
            name: format!("so-{i}"),
            namespace: "bench".into(),
            scaler_metadata: meta,
        }),
        metric_name: "vllm-demand".into(),
    }
}
