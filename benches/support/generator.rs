//! The webhook load benchmark's own load generator: a process of its own (the bench executable
//! with `--generator`, started by [`Generator::spawn`] on the generator's cores) that loads one
//! HTTPS URL over `CONNECTIONS` keep-alive HTTP/1.1 connections (hyper's client over rustls), as
//! the API server calls a webhook, either at a fixed rate or keeping one request in flight on
//! each connection (saturation), and reports what it measured on one line.
//!
//! On cores of its own it never sleeps. Each of its threads runs a tokio runtime of its own beside
//! a task that always yields, so the runtime polls its sockets without ever waiting on them. On one
//! machine, an answer that finds the generator asleep must wake it: the kernel sends the
//! generator's core an interrupt, and the server's core that wrote the answer pays for sending it
//! (in a virtual machine, an exit to the hypervisor). A client on another machine, as the API
//! server is, costs the server nothing of the kind, and a generator that sleeps more the slower the
//! server answers charges a slow server more than a fast one. [`wakeups`](super::pinning::wakeups)
//! counts those interrupts, so that a run shows what a generator that sleeps (`wrk`, `h2load`)
//! costs the server.

use std::{
    sync::{Arc, Barrier, OnceLock},
    time::{Duration, Instant},
};

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;

use super::{CONNECTIONS, pinning::Awake, stats::percentile};

/// How the generator loads the server.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// Requests per second over all connections; `None` keeps one request in flight on each
    /// connection, sending the next as soon as the last is answered.
    pub rate: Option<f64>,
    pub secs: u64,
    /// Threads, each with its share of the connections: one per generator core.
    pub threads: usize,
}

/// What a generator run measured: requests answered (2xx), failures, the achieved rate, and the
/// latency percentiles of the answered requests.
#[derive(Clone, Copy, Debug)]
pub struct Report {
    pub requests: u64,
    pub errors: u64,
    pub rate: f64,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Report {
    /// The line the generator process prints: `requests errors rate p50 p90 p99 max`, latencies
    /// in µs.
    fn line(&self) -> String {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        format!(
            "{} {} {:.1} {:.1} {:.1} {:.1} {:.1}",
            self.requests,
            self.errors,
            self.rate,
            us(self.p50),
            us(self.p90),
            us(self.p99),
            us(self.max),
        )
    }

    fn parse(line: &str) -> Option<Self> {
        let f: Vec<f64> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let [requests, errors, rate, p50, p90, p99, max] = f[..] else {
            return None;
        };
        let us = |v: f64| Duration::from_secs_f64(v / 1e6);
        Some(Self {
            requests: requests as u64,
            errors: errors as u64,
            rate,
            p50: us(p50),
            p90: us(p90),
            p99: us(p99),
            max: us(max),
        })
    }
}

/// A generator process that has connected and waits to start.
pub struct Generator {
    child: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Generator {
    /// Starts the generator process for `load` on `url` (trusting the CA at `ca`, sending the
    /// body at `body`) on `cores`, and waits until it has made its connections: handshakes
    /// are not counted in what follows. Its threads stay awake (see the module doc) only on
    /// cores of its own: on the server's, a thread that never sleeps takes the server's time.
    pub fn spawn(
        cores: Option<&str>,
        url: &str,
        ca: &std::path::Path,
        body: &std::path::Path,
        load: Load,
    ) -> Self {
        use std::io::BufRead;
        let exe = std::env::current_exe().expect("own executable");
        let mut child = super::Pinning::command(cores, exe)
            .arg("--generator")
            .arg(url)
            .arg(ca)
            .arg(body)
            .arg(load.rate.map_or_else(|| "max".into(), |r| r.to_string()))
            .arg(load.secs.to_string())
            .arg(load.threads.max(1).to_string())
            .arg(if cores.is_some() { "awake" } else { "sleeps" })
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the load generator");
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let ready = lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(ready, "ready", "the generator did not start");
        Self { child, lines }
    }

    /// Starts the load and waits for its report.
    pub fn run(mut self) -> Report {
        use std::io::Write;
        let mut stdin = self.child.stdin.take().expect("stdin");
        writeln!(stdin, "go").expect("start the generator");
        let line = self.lines.next().and_then(Result::ok).unwrap_or_default();
        let _ = self.child.wait();
        Report::parse(&line).unwrap_or_else(|| panic!("unexpected generator output {line:?}"))
    }
}

/// The generator process: `--generator URL CA BODY RATE|max SECS THREADS awake|sleeps`.
/// Connects, prints `ready`, waits for a line on stdin, loads the server, then prints its
/// [`Report`] line.
pub fn main(args: &[String]) {
    let [url, ca, body, rate, secs, threads, awake] = args else {
        panic!("usage: --generator URL CA BODY RATE|max SECS THREADS awake|sleeps");
    };
    let uri: hyper::Uri = url.parse().expect("url");
    let ca = std::fs::read(ca).expect("ca");
    let body = Bytes::from(std::fs::read(body).expect("body"));
    let load = Load {
        rate: (rate != "max").then(|| rate.parse().expect("rate")),
        secs: secs.parse().expect("secs"),
        threads: threads.parse().expect("threads"),
    };
    let awake = awake == "awake";
    let threads = load.threads.clamp(1, CONNECTIONS);
    // Every thread has connected at the first barrier; the load starts at the second, after the
    // parent's `go`, with the start time set in between.
    let connected = Arc::new(Barrier::new(threads + 1));
    let start = Arc::new(OnceLock::<Instant>::new());
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let connections: Vec<usize> = (t..CONNECTIONS).step_by(threads).collect();
            let (uri, ca, body) = (uri.clone(), ca.clone(), body.clone());
            let (connected, start) = (connected.clone(), start.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("generator runtime");
                runtime.block_on(async move {
                    let mut senders = Vec::new();
                    for _ in &connections {
                        senders.push(http1_connection(&uri, &ca).await);
                    }
                    connected.wait();
                    connected.wait();
                    let started = *start.get().expect("start time");
                    drive(senders, &connections, &uri, &body, load, awake, started).await
                })
            })
        })
        .collect();
    connected.wait();
    println!("ready");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    let started = *start.get_or_init(Instant::now);
    connected.wait();
    let (mut all, mut errors) = (Vec::new(), 0);
    for w in workers {
        let (latencies, e) = w.join().expect("generator thread");
        all.extend(latencies);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    let report = Report {
        requests: all.len() as u64,
        errors,
        rate: all.len() as f64 / elapsed,
        p50: percentile(&all, 0.50),
        p90: percentile(&all, 0.90),
        p99: percentile(&all, 0.99),
        max: all.last().copied().unwrap_or_default(),
    };
    println!("{}", report.line());
}

/// Loads the server over `senders` (connections number `connections` of `CONNECTIONS`) from
/// `started` for `load.secs`, on this thread's runtime, kept `awake` if asked; the latencies of
/// the answered requests and the count of failed ones.
async fn drive(
    senders: Vec<SendRequest<Full<Bytes>>>,
    connections: &[usize],
    uri: &hyper::Uri,
    body: &Bytes,
    load: Load,
    awake: bool,
    started: Instant,
) -> (Vec<Duration>, u64) {
    let deadline = started + Duration::from_secs(load.secs);
    let awake = Awake::start(awake);
    // At a fixed rate each connection sends every `CONNECTIONS / rate`, the connections' ticks
    // spread over one period.
    let period = load
        .rate
        .map(|rate| Duration::from_secs_f64(CONNECTIONS as f64 / rate));
    let tasks: Vec<_> = senders
        .into_iter()
        .zip(connections)
        .map(|(sender, &i)| {
            let offset = period.map(|p| p.mul_f64(i as f64 / CONNECTIONS as f64));
            tokio::spawn(connection(
                sender,
                uri.clone(),
                body.clone(),
                period.zip(offset),
                started,
                deadline,
            ))
        })
        .collect();
    let (mut all, mut errors) = (Vec::new(), 0);
    for t in tasks {
        let (latencies, e) = t.await.expect("connection task");
        all.extend(latencies);
        errors += e;
    }
    drop(awake);
    (all, errors)
}

/// One connection's requests until `deadline`: every `period` from `started + offset` when
/// `ticks` is set, else each as soon as the last is answered. A connection that fails stops
/// (its failure counted), as a broken keep-alive connection would for any client.
async fn connection(
    mut sender: SendRequest<Full<Bytes>>,
    uri: hyper::Uri,
    body: Bytes,
    ticks: Option<(Duration, Duration)>,
    started: Instant,
    deadline: Instant,
) -> (Vec<Duration>, u64) {
    let mut ticker = ticks.map(|(period, offset)| {
        let mut t = tokio::time::interval_at((started + offset).into(), period);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        t
    });
    let (mut latencies, mut errors) = (Vec::new(), 0);
    while Instant::now() < deadline {
        if let Some(t) = ticker.as_mut() {
            t.tick().await;
        }
        let sent = Instant::now();
        match post(&mut sender, &uri, &body).await {
            Some((status, _)) if status.is_success() => latencies.push(sent.elapsed()),
            Some(_) => errors += 1,
            None => {
                errors += 1;
                break;
            }
        }
    }
    (latencies, errors)
}

/// POSTs `body` as JSON to `uri` over `sender`'s connection; the answer's status and its whole
/// body, or `None` when the connection failed.
pub async fn post(
    sender: &mut SendRequest<Full<Bytes>>,
    uri: &hyper::Uri,
    body: &Bytes,
) -> Option<(hyper::StatusCode, http_body_util::Collected<Bytes>)> {
    let request = hyper::Request::post(uri.clone())
        .header(hyper::header::HOST, "127.0.0.1")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body.clone()))
        .expect("request");
    sender.ready().await.ok()?;
    let answer = sender.send_request(request).await.ok()?;
    let status = answer.status();
    Some((status, answer.into_body().collect().await.ok()?))
}

/// One HTTP/1.1 connection over TLS to `uri`'s host and port, trusting `ca` (PEM); its driver
/// runs as a task of its own on the current runtime.
pub async fn http1_connection(uri: &hyper::Uri, ca: &[u8]) -> SendRequest<Full<Bytes>> {
    use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca).expect("ca der"))
        .expect("root");
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let host = uri.host().expect("host");
    let port = uri.port_u16().expect("port");
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .expect("connect");
    // As the API server's Go client sets it: an answer is not held back to fill a segment.
    tcp.set_nodelay(true).expect("nodelay");
    let name = ServerName::try_from(host.to_string()).expect("name");
    let tls = connector.connect(name, tcp).await.expect("handshake");
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("HTTP/1.1 handshake");
    tokio::spawn(connection);
    sender
}
