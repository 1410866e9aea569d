//! Child processes of the test environment: each one logs to its own file and is killed (and
//! reaped) when its guard is dropped, whether the test passed, failed or panicked.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};

/// A running component. Dropping it kills the process and waits for it.
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
    /// How it was started, so that [`Process::restart`] starts it the same way.
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Process {
    /// Starts `program` with `args`, stdout and stderr appended to `<log_dir>/<name>.log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], log_dir: &Path) -> Result<Self> {
        Self::spawn_with_env(name, program, args, &[], log_dir)
    }

    /// Like [`Process::spawn`], with extra environment variables.
    pub fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
        log_dir: &Path,
    ) -> Result<Self> {
        let log = log_dir.join(format!("{name}.log"));
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_string(), v.clone()))
            .collect();
        let child = start(name, program, args, &env, &log)?;
        Ok(Self {
            name: name.to_string(),
            child,
            log,
            program: program.to_path_buf(),
            args: args.to_vec(),
            env,
        })
    }

    /// Kills the process if it still runs and starts it again with the same program, arguments
    /// and environment; its log continues in the same file.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.child = start(&self.name, &self.program, &self.args, &self.env, &self.log)?;
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The operating-system process id (for signals other than kill).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Fails with the end of the component's log if the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => bail!(
                "{} exited early ({status}); end of {}:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 40)
            ),
            Err(e) => bail!("cannot query {}: {e}", self.name),
        }
    }

    /// Kills the process now and waits for it (idempotent).
    pub fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `program`, stdout and stderr appended to `log`.
fn start(
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
) -> Result<Child> {
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("creating log file {}", log.display()))?;
    let err = out.try_clone().context("duplicating log file handle")?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn()
        .with_context(|| format!("starting {name} ({})", program.display()))
}

/// The last `lines` lines of a log file (reads at most the last 64 KiB).
pub fn tail(path: &Path, lines: usize) -> String {
    const MAX: u64 = 64 * 1024; // enough for the lines that explain a failure
    let Ok(mut f) = File::open(path) else {
        return format!("(cannot open {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(MAX)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A port that was free on 127.0.0.1 a moment ago, for components that cannot report the port
/// they bound.
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Overrides [`host_ip`] (a machine whose routing table has no default route).
pub const HOST_IP_ENV: &str = "NIGHTSHIFT_E2E_HOST_IP";

/// The machine's own non-loopback address, for servers the API server reaches through a
/// Service: it refuses loopback and link-local addresses in EndpointSlices. Found as the source
/// address the kernel picks towards a documentation address (a UDP `connect` sends nothing),
/// unless `NIGHTSHIFT_E2E_HOST_IP` names it.
pub fn host_ip() -> Result<std::net::IpAddr> {
    use std::net::{IpAddr, Ipv4Addr, UdpSocket};
    if let Some(v) = std::env::var_os(HOST_IP_ENV) {
        let text = v.to_string_lossy();
        return text
            .parse()
            .with_context(|| format!("{HOST_IP_ENV}={text} is not an IP address"));
    }
    // TEST-NET-3 (RFC 5737): routed like any remote address, never answered.
    const PROBE: (Ipv4Addr, u16) = (Ipv4Addr::new(203, 0, 113, 1), 9);
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).context("binding a UDP socket")?;
    socket
        .connect(PROBE)
        .with_context(|| format!("no route to find this machine's address; set {HOST_IP_ENV}"))?;
    let ip = socket.local_addr()?.ip();
    match ip {
        IpAddr::V4(v4) if !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified() => {
            Ok(ip)
        }
        other => bail!("this machine's address {other} cannot be an endpoint; set {HOST_IP_ENV}"),
    }
}

/// A port that was free on `ip` a moment ago (see [`free_port`]).
pub fn free_port_on(ip: std::net::IpAddr) -> Result<u16> {
    let l = std::net::TcpListener::bind((ip, 0)).with_context(|| format!("binding {ip}:0"))?;
    Ok(l.local_addr()?.port())
}
