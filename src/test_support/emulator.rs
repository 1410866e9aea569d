//! A vLLM metrics emulator: serves vLLM's Prometheus exposition (on 127.0.0.1 unless told
//! otherwise) with values the test changes while it runs, under the new (≥ 0.9.2) or old KV-cache metric name, with any
//! number of data-parallel engines, with token counters the test sets or that advance at a steady
//! rate between scrapes, and can misbehave (slow, garbage, HTTP 500). The scaler, view and
//! end-to-end suites use it.

use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use tokio_util::sync::CancellationToken;

/// One engine's readings.
#[derive(Clone, Debug, Default)]
pub struct Engine {
    pub waiting: f64,
    pub running: f64,
    pub kv_cache: f64,
    pub generation_tokens_total: f64,
    pub prompt_tokens_total: f64,
    /// Generated tokens per second added to `generation_tokens_total` as time passes.
    pub generation_tokens_per_second: f64,
    /// Prompt tokens per second added to `prompt_tokens_total` as time passes.
    pub prompt_tokens_per_second: f64,
}

impl Engine {
    /// Advances the counters by `seconds` at their rates.
    fn advance(&mut self, seconds: f64) {
        self.generation_tokens_total += self.generation_tokens_per_second * seconds;
        self.prompt_tokens_total += self.prompt_tokens_per_second * seconds;
    }
}

/// How the emulator answers.
#[derive(Clone, Debug, Default)]
pub enum Behaviour {
    #[default]
    Normal,
    Slow(Duration),
    Garbage,
    ServerError,
}

#[derive(Debug)]
struct EmuState {
    model: String,
    old_names: bool,
    engines: Vec<Engine>,
    behaviour: Behaviour,
    /// When the counters were last advanced.
    advanced: Instant,
}

impl EmuState {
    /// Brings the counters up to now at their rates.
    fn advance(&mut self) {
        let now = Instant::now();
        let seconds = now.duration_since(self.advanced).as_secs_f64();
        self.advanced = now;
        for e in &mut self.engines {
            e.advance(seconds);
        }
    }
}

/// A running emulator; stops when dropped.
pub struct Emulator {
    pub addr: SocketAddr,
    state: Arc<Mutex<EmuState>>,
    stop: CancellationToken,
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Emulator {
    /// Starts an emulator for `model` with `engines` engines, all idle, on 127.0.0.1.
    pub async fn start(model: &str, engines: usize, old_names: bool) -> Self {
        Self::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST), model, engines, old_names).await
    }

    /// Like [`Emulator::start`], listening on `ip` (a port from the OS).
    pub async fn start_on(ip: IpAddr, model: &str, engines: usize, old_names: bool) -> Self {
        let state = Arc::new(Mutex::new(EmuState {
            model: model.to_string(),
            old_names,
            engines: vec![Engine::default(); engines],
            behaviour: Behaviour::Normal,
            advanced: Instant::now(),
        }));
        let app = Router::new()
            .route("/metrics", get(metrics))
            .with_state(state.clone());
        let (addr, stop) = serve_on(ip, app).await;
        Self { addr, state, stop }
    }

    /// `host:port` for an `endpoints` list.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// Changes one engine's readings (counters first advanced to now at the old rates).
    pub fn set(&self, engine: usize, f: impl FnOnce(&mut Engine)) {
        let mut s = self.state.lock().expect("lock");
        s.advance();
        f(&mut s.engines[engine]);
    }

    /// Changes how the emulator answers.
    pub fn behave(&self, b: Behaviour) {
        self.state.lock().expect("lock").behaviour = b;
    }
}

async fn metrics(State(state): State<Arc<Mutex<EmuState>>>) -> impl IntoResponse {
    let (behaviour, body) = {
        let mut s = state.lock().expect("lock");
        s.advance();
        (s.behaviour.clone(), render(&s))
    };
    match behaviour {
        Behaviour::Normal => (StatusCode::OK, body).into_response(),
        Behaviour::Slow(d) => {
            tokio::time::sleep(d).await;
            (StatusCode::OK, body).into_response()
        }
        Behaviour::Garbage => (
            StatusCode::OK,
            "<html><body>502 Bad Gateway</body></html>\n",
        )
            .into_response(),
        Behaviour::ServerError => {
            (StatusCode::INTERNAL_SERVER_ERROR, "engine dead\n").into_response()
        }
    }
}

/// Reads one value from an engine.
type Reading = fn(&Engine) -> f64;

fn render(s: &EmuState) -> String {
    let mut out = String::new();
    let kv_name = if s.old_names {
        "vllm:gpu_cache_usage_perc"
    } else {
        "vllm:kv_cache_usage_perc"
    };
    let families: [(&str, &str, Reading); 5] = [
        ("vllm:num_requests_running", "gauge", |e| e.running),
        ("vllm:num_requests_waiting", "gauge", |e| e.waiting),
        (kv_name, "gauge", |e| e.kv_cache),
        ("vllm:generation_tokens_total", "counter", |e| {
            e.generation_tokens_total
        }),
        ("vllm:prompt_tokens_total", "counter", |e| {
            e.prompt_tokens_total
        }),
    ];
    for (name, kind, get) in families {
        let _ = writeln!(out, "# HELP {name} emulated");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (i, e) in s.engines.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}{{engine=\"{i}\",model_name=\"{}\"}} {:?}",
                s.model,
                get(e)
            );
        }
    }
    out.push_str("# HELP process_cpu_seconds_total CPU\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n");
    out
}

/// Serves `app` on `ip` at a port from the OS until the returned token is cancelled: the
/// launcher of every stand-in server of these tests.
pub async fn serve_on(ip: IpAddr, app: Router) -> (SocketAddr, CancellationToken) {
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(token.cancelled_owned())
            .await;
    });
    (addr, stop)
}
