//! The binary's plain logs carry no ANSI colour codes when stderr is not a terminal (a file, a
//! pipe, a log collector), even without `NO_COLOR`.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// Bound on the binary's start-and-fail; it takes milliseconds.
const DEADLINE: Duration = Duration::from_secs(30);

#[test]
fn plain_logs_to_a_pipe_have_no_colour_codes() {
    // A port in use makes the scaler log its start-up lines and exit with an error.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = busy.local_addr().expect("addr");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .args([
            "scaler",
            &format!("--scaler-addr={addr}"),
            "--admin-addr=127.0.0.1:0",
        ])
        .env_remove("NO_COLOR")
        .env("NIGHTSHIFT_LOG", "info")
        .env("NIGHTSHIFT_LOG_FORMAT", "plain")
        .env("KUBECONFIG", dir.path().join("absent"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start nightshift");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("nightshift did not exit within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the busy port must fail: {stderr}");
    assert!(stderr.contains("WARN"), "expected log lines: {stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "colour codes in logs: {stderr:?}"
    );
}
