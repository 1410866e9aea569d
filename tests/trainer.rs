//! The example research trainer (`manifests/examples/research/trainer.py`) as a real process: a
//! temp dir laid out like the Downward API volume the webhook adds (the kubelet's atomic writer:
//! a timestamped directory, `..data` swapped to it, `annotations` linking through `..data`), a
//! checkpoint directory, and the trainer's log read line by line. It must checkpoint once per
//! reclaim notice, on a request to its checkpoint port, and on SIGTERM before exiting 0.
//!
//! Needs `python3` (`NIGHTSHIFT_PYTHON`, else on `PATH`); without it the tests fail in CI and are
//! skipped elsewhere.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use nightshift::core::vocabulary::{NOTICE_FILE, NOTICE_FILE_ENV, RECLAIM_NOTICE_ANNOTATION};
use serde_json::Value;

/// How long the trainer may take to react. It polls the notice file once a second; the rest is
/// room for a loaded two-core CI machine.
const DEADLINE: Duration = Duration::from_secs(15);
/// How often a condition is re-checked while waiting for it.
const POLL: Duration = Duration::from_millis(20);

/// The Python interpreter: `NIGHTSHIFT_PYTHON`, else `python3` on `PATH`.
fn python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NIGHTSHIFT_PYTHON").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())
}

/// The interpreter, or `None` (after saying so) when the test is skipped. In CI a missing
/// interpreter fails the test.
fn python_or_skip() -> Option<PathBuf> {
    let found = python();
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 not found: run `bash .ci/test`, which installs it, or set NIGHTSHIFT_PYTHON"
        );
        eprintln!("SKIPPED: no python3 (install Debian's `python3` or set NIGHTSHIFT_PYTHON)");
    }
    found
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/examples/research/trainer.py")
}

/// Waits until `check` gives a value, polling; panics with `what` and the trainer's log after
/// [`DEADLINE`].
fn wait_for<T>(trainer: &Trainer, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < end,
            "timed out waiting for {what}; trainer log:\n{}",
            trainer.log().join("\n")
        );
        thread::sleep(POLL);
    }
}

/// Go's `strconv.Quote` for the plain strings these tests use: what the kubelet writes.
fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A running trainer in its own temp dir; killed when dropped.
struct Trainer {
    child: Child,
    dir: tempfile::TempDir,
    lines: Arc<Mutex<Vec<String>>>,
    /// Versions of the annotations published so far (names the timestamped directories).
    versions: u32,
}

impl Trainer {
    /// Starts the trainer with a notice file holding `annotations`; `port` serves the checkpoint
    /// endpoint on a port the system picks.
    fn start(python: &Path, annotations: &[(&str, &str)], port: bool) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("notice")).expect("notice dir");
        let mut command = Command::new(python);
        command
            .arg(script())
            .env("CHECKPOINT_DIR", dir.path().join("checkpoints"))
            .env(NOTICE_FILE_ENV, dir.path().join("notice").join(NOTICE_FILE))
            // No timer checkpoints during a test: every checkpoint seen has a cause the test gave.
            .env("CHECKPOINT_EVERY", "3600")
            .env("STEP_SECONDS", "0.05")
            .env("TOTAL_STEPS", "0")
            .env_remove("CHECKPOINT_PATH")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if port {
            command
                .env("CHECKPOINT_PORT", "0")
                .env("CHECKPOINT_HOST", "127.0.0.1");
        } else {
            command.env_remove("CHECKPOINT_PORT");
        }
        let mut trainer = Self {
            child: command.spawn().expect("trainer starts"),
            dir,
            lines: Arc::default(),
            versions: 0,
        };
        trainer.publish(annotations);
        let stdout = trainer
            .child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>);
        let stderr = trainer
            .child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>);
        for stream in [stdout, stderr].into_iter().flatten() {
            let lines = Arc::clone(&trainer.lines);
            thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    lines.lock().expect("log lock").push(line);
                }
            });
        }
        trainer
    }

    fn log(&self) -> Vec<String> {
        self.lines.lock().expect("log lock").clone()
    }

    /// Whether a log line contains every one of `parts`.
    fn logged(&self, parts: &[&str]) -> bool {
        self.log()
            .iter()
            .any(|l| parts.iter().all(|p| l.contains(p)))
    }

    /// Publishes `annotations` the way the kubelet's atomic writer does: a new timestamped
    /// directory, `..data` swapped to it by a rename, the file reached through `..data`.
    fn publish(&mut self, annotations: &[(&str, &str)]) {
        let volume = self.dir.path().join("notice");
        self.versions += 1;
        let version = format!("..2026_11_30_00_00_00.{}", self.versions);
        std::fs::create_dir(volume.join(&version)).expect("version dir");
        let mut sorted = annotations.to_vec();
        sorted.sort();
        let text: String = sorted
            .iter()
            .map(|(k, v)| format!("{k}={}\n", go_quote(v)))
            .collect();
        std::fs::write(volume.join(&version).join(NOTICE_FILE), text).expect("write annotations");
        std::os::unix::fs::symlink(&version, volume.join("..data_tmp")).expect("..data_tmp");
        std::fs::rename(volume.join("..data_tmp"), volume.join("..data")).expect("swap ..data");
        let file = volume.join(NOTICE_FILE);
        if std::fs::symlink_metadata(&file).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(NOTICE_FILE), file)
                .expect("annotations link");
        }
    }

    /// The last checkpoint written, if any.
    fn checkpoint(&self) -> Option<Value> {
        let text =
            std::fs::read_to_string(self.dir.path().join("checkpoints/checkpoint.json")).ok()?;
        Some(serde_json::from_str(&text).expect("checkpoints are written whole"))
    }

    /// Waits for a checkpoint written for `reason` (and, if given, this notice); returns its
    /// number.
    fn wait_checkpoint(&self, reason: &str, notice: Option<&str>) -> u64 {
        wait_for(self, &format!("a {reason} checkpoint ({notice:?})"), || {
            let c = self.checkpoint()?;
            (c["reason"] == reason && notice.is_none_or(|n| c["notice"] == n))
                .then(|| c["checkpoints"].as_u64().expect("checkpoint count"))
        })
    }

    /// Waits until the trainer has read annotations with `count` entries and this notice value
    /// (`-`: none), i.e. has handled that content of the file.
    fn wait_read(&self, count: usize, notice: &str) {
        let parts = [
            "annotations read".to_string(),
            format!("count={count} "),
            format!("notice={notice} "),
        ];
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        wait_for(self, &format!("annotations read: {parts:?}"), || {
            self.logged(&parts).then_some(())
        });
    }

    /// Waits for the process to exit.
    fn wait_exit(&mut self) -> ExitStatus {
        let end = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < end,
                "trainer did not exit; log:\n{}",
                self.log().join("\n")
            );
            thread::sleep(POLL);
        }
    }
}

impl Drop for Trainer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn each_reclaim_notice_gets_exactly_one_checkpoint() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let mut t = Trainer::start(&python, &[("team", "vision")], false);
    t.wait_read(1, "-");
    assert!(t.checkpoint().is_none(), "no checkpoint without a cause");

    let first = "2026-11-30T21:00:00Z";
    t.publish(&[("team", "vision"), (RECLAIM_NOTICE_ANNOTATION, first)]);
    let n = t.wait_checkpoint("notice", Some(first));
    let step = |t: &Trainer| t.checkpoint().and_then(|c| c["step"].as_u64());
    let first_step = step(&t);

    // The kubelet rewrites the file whenever any annotation changes: the same notice is not
    // checkpointed again.
    let extra = ["a", "b", "c"];
    for round in 1..=extra.len() {
        let mut annotations = vec![("team", "vision"), (RECLAIM_NOTICE_ANNOTATION, first)];
        annotations.extend(extra[..round].iter().map(|k| (*k, "x\"y\\z")));
        t.publish(&annotations);
        t.wait_read(2 + round, first);
    }
    let c = t.checkpoint().expect("checkpoint");
    assert_eq!(
        c["checkpoints"].as_u64(),
        Some(n),
        "one checkpoint per notice: {c}"
    );

    // Withdrawn, then a new notice: another checkpoint, one only.
    t.publish(&[("team", "vision"), ("phase", "withdrawn")]);
    t.wait_read(2, "-");
    let second = "2026-11-30T22:00:00Z";
    t.publish(&[("team", "vision"), (RECLAIM_NOTICE_ANNOTATION, second)]);
    assert_eq!(t.wait_checkpoint("notice", Some(second)), n + 1);
    // Other annotations with the same notice: three entries, so the read awaited is this one,
    // not the earlier read of two.
    t.publish(&[
        ("team", "ml"),
        ("queue", "night"),
        (RECLAIM_NOTICE_ANNOTATION, second),
    ]);
    t.wait_read(3, second);
    assert_eq!(
        t.checkpoint().and_then(|c| c["checkpoints"].as_u64()),
        Some(n + 1)
    );
    // Training went on after the first notice.
    assert!(step(&t) > first_step, "{:?} after {first_step:?}", step(&t));
}

#[test]
fn sigterm_writes_a_last_checkpoint_and_exits_0() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let mut t = Trainer::start(&python, &[], false);
    // The notice file is read inside the main loop, after the signal handlers are in place.
    t.wait_read(0, "-");
    let status = Command::new("kill")
        .args(["-TERM", &t.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let exit = t.wait_exit();
    assert!(exit.success(), "{exit}; log:\n{}", t.log().join("\n"));
    let c = t.checkpoint().expect("a last checkpoint");
    assert_eq!(c["reason"], "signal", "{c}");
}

#[test]
fn a_post_to_the_checkpoint_port_gets_a_checkpoint() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let t = Trainer::start(&python, &[], true);
    let port: u16 = wait_for(&t, "the checkpoint endpoint", || {
        t.log().iter().find_map(|l| {
            let rest = l.split("address=127.0.0.1:").nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        })
    });
    let body = r#"{"pod":"research/sft-0","noticeAt":"2026-11-30T21:30:00Z","reason":"inference scales up"}"#;
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(DEADLINE))
        .expect("read timeout");
    write!(
        stream,
        "POST /checkpoint HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("request sent");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answer");
    let status_line = answer.lines().next().unwrap_or_default();
    assert!(status_line.contains(" 202 "), "{answer}");
    t.wait_checkpoint("request", Some("2026-11-30T21:30:00Z"));
}
