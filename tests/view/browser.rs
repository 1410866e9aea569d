//! The page in a real headless Chromium, driven by chromedriver's WebDriver HTTP API: the
//! figures a person reads, no console errors, the namespace link followed, and a screenshot.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/test` installs them). Paths come from
//! `NIGHTSHIFT_CHROMEDRIVER` / `NIGHTSHIFT_CHROMIUM`, else PATH; without them the test says so
//! and passes, unless `NIGHTSHIFT_REQUIRE_BROWSER=1` (set by `.ci/test`).

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// WebDriver's key for an element reference in its answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long chromedriver and Chromium get to start; they take about a second.
const START: Duration = Duration::from_secs(30);

fn find(env: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .find(|p| p.is_file())
}

/// chromedriver on a loopback port, killed on drop.
struct Driver {
    child: Child,
    url: String,
    _profile: tempfile::TempDir,
    chromium: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    async fn start(driver: PathBuf, chromium: PathBuf) -> Driver {
        // chromedriver takes a port number; the OS picks a free one for a moment.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let child = Command::new(&driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let d = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _profile: tempfile::tempdir().expect("profile dir"),
            chromium,
        };
        let http = reqwest::Client::new();
        let deadline = Instant::now() + START;
        loop {
            let ready = http
                .get(format!("{}/status", d.url))
                .send()
                .await
                .ok()
                .map(|r| r.status().is_success())
                .unwrap_or(false);
            if ready {
                return d;
            }
            assert!(Instant::now() < deadline, "chromedriver did not answer");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One browser session.
struct Session {
    http: reqwest::Client,
    base: String,
}

impl Session {
    async fn new(driver: &Driver) -> Session {
        let http = reqwest::Client::new();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": driver.chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", "--hide-scrollbars",
                    format!("--user-data-dir={}", driver._profile.path().display()),
                ],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let answer: Value = http
            .post(format!("{}/session", driver.url))
            .json(&caps)
            .timeout(START)
            .send()
            .await
            .expect("new session")
            .json()
            .await
            .expect("session JSON");
        let id = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_string();
        Session {
            http,
            base: format!("{}/session/{id}", driver.url),
        }
    }

    /// A WebDriver call's whole answer, a WebDriver error included.
    async fn answer(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(START);
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send()
            .await
            .expect("WebDriver call")
            .json()
            .await
            .expect("WebDriver JSON")
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let answer = self.answer(method, path, body).await;
        assert!(
            answer["value"].get("error").is_none(),
            "WebDriver {path}: {answer}"
        );
        answer["value"].clone()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> Value {
        self.call(reqwest::Method::GET, path, None).await
    }

    async fn element(&self, css: &str) -> String {
        let e = self
            .post("/element", json!({"using": "css selector", "value": css}))
            .await;
        e[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {e}"))
            .to_string()
    }

    /// The text a person sees in the element `css`.
    async fn text(&self, css: &str) -> String {
        let id = self.element(css).await;
        self.get(&format!("/element/{id}/text"))
            .await
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// The text of `css` once it reads `want`, read again until a deadline: after a click the
    /// browser may still be leaving the page, whose elements then go stale.
    async fn text_once(&self, css: &str, want: &str) -> String {
        let deadline = Instant::now() + START;
        loop {
            let found = self
                .answer(
                    reqwest::Method::POST,
                    "/element",
                    Some(json!({"using": "css selector", "value": css})),
                )
                .await;
            let mut text = None;
            if let Some(id) = found["value"][ELEMENT].as_str() {
                let read = self
                    .answer(reqwest::Method::GET, &format!("/element/{id}/text"), None)
                    .await;
                text = read["value"].as_str().map(str::to_string);
            }
            if text.as_deref() == Some(want) || Instant::now() >= deadline {
                return text.unwrap_or_default();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Console messages of level SEVERE (errors) since the last call.
    async fn console_errors(&self) -> Vec<String> {
        let logs = self.post("/se/log", json!({"type": "browser"})).await;
        logs.as_array()
            .into_iter()
            .flatten()
            .filter(|l| l["level"] == "SEVERE")
            .map(|l| l["message"].to_string())
            .collect()
    }

    async fn close(&self) {
        let _ = self.http.delete(&self.base).send().await;
    }
}

#[tokio::test]
async fn a_person_reads_the_page_in_chromium_and_follows_a_namespace() {
    let (Some(driver), Some(chromium)) = (
        find("NIGHTSHIFT_CHROMEDRIVER", &["chromedriver"]),
        find("NIGHTSHIFT_CHROMIUM", &["chromium", "chromium-browser"]),
    ) else {
        assert!(
            std::env::var("NIGHTSHIFT_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "chromium and chromedriver are required but not found"
        );
        eprintln!(
            "skipped: chromium/chromedriver not installed (apt-get install chromium chromium-driver)"
        );
        return;
    };
    // The view router over the fixture pool, served on loopback.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let page = format!("http://{}/", listener.local_addr().expect("addr"));
    let stop = CancellationToken::new();
    tokio::spawn(nightshift::view::serve(
        listener,
        nightshift::view::router(super::state()),
        stop.clone(),
    ));
    let _stop = stop.drop_guard();

    let driver = Driver::start(driver, chromium).await;
    let s = Session::new(&driver).await;
    s.post("/window/rect", json!({"width": 1200, "height": 2300}))
        .await;
    s.post("/url", json!({"url": page})).await;
    assert_eq!(s.text("h1").await, "nightshift: GPU pool");
    assert_eq!(s.text("#gpus-inference b").await, "12");
    assert_eq!(s.text("#gpus-research b").await, "10");
    assert_eq!(s.text("#gpus-headroom b").await, "8");
    assert_eq!(s.text("#gpus-free b").await, "2");
    let preemptions = s.text("#preemptions").await;
    assert!(
        preemptions.contains("team-b") && preemptions.contains("rl-run-2"),
        "{preemptions}"
    );
    let namespaces = s.text("#namespaces").await;
    assert!(
        namespaces.contains("team-b 8 0 16.0 1 4.0"),
        "team-b's row as shown: {namespaces}"
    );
    let llama = "figure.service[data-service='inference/llama']";
    assert_eq!(
        s.text(&format!("{llama} figcaption")).await,
        "inference/llama: demand 2.5, replicas 3.0 (last 5 minutes)"
    );
    let lines = s
        .post(
            "/elements",
            json!({"using": "css selector", "value": format!("{llama} polyline")}),
        )
        .await;
    assert_eq!(
        lines.as_array().map(Vec::len),
        Some(2),
        "demand and replicas: {lines}"
    );
    let chart = s.element(&format!("{llama} svg")).await;
    let rect = s.get(&format!("/element/{chart}/rect")).await;
    assert!(
        rect["width"].as_f64().unwrap_or(0.0) > 500.0
            && rect["height"].as_f64().unwrap_or(0.0) > 20.0,
        "the chart is drawn at a readable size: {rect}"
    );
    let shown = s.get(&format!("/element/{chart}/displayed")).await;
    assert_eq!(shown, json!(true), "the chart is visible");
    let errors = s.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:?}");

    let shot = s.get("/screenshot").await;
    let png = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        shot.as_str().expect("screenshot"),
    )
    .expect("PNG");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let artifact = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("view.png");
    std::fs::write(&artifact, &png).expect("screenshot written");
    eprintln!("screenshot: {}", artifact.display());
    if std::env::var("NIGHTSHIFT_BLESS").as_deref() == Ok("1") {
        let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/view.png");
        std::fs::write(&docs, &png).expect("docs/view.png written");
    }

    // Follow team-a's link in the namespace table.
    let link = s.element("#namespaces a[href='?namespace=team-a']").await;
    s.post(&format!("/element/{link}/click"), json!({})).await;
    let url = s.get("/url").await;
    assert!(
        url.as_str()
            .is_some_and(|u| u.ends_with("/?namespace=team-a")),
        "{url}"
    );
    assert_eq!(
        s.text_once("h1", "nightshift: GPU pool: research of team-a")
            .await,
        "nightshift: GPU pool: research of team-a"
    );
    let namespaces = s.text("#namespaces").await;
    assert!(
        namespaces.contains("team-a") && !namespaces.contains("team-b"),
        "{namespaces}"
    );
    assert!(
        s.text("body")
            .await
            .contains("None since nightshift started.")
    );
    // Back to every namespace through the form: an empty filter.
    let input = s.element("input[name=namespace]").await;
    s.post(&format!("/element/{input}/clear"), json!({})).await;
    let button = s.element("form button").await;
    s.post(&format!("/element/{button}/click"), json!({})).await;
    assert_eq!(
        s.text_once("h1", "nightshift: GPU pool").await,
        "nightshift: GPU pool"
    );
    let errors = s.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:?}");
    s.close().await;
}
