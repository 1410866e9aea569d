//! The daily forecast over real gRPC: a scaler whose clock is set to 09:59 rebuilds a
//! ScaledObject's daily shape from a Prometheus stand-in serving two days of its measured demand
//! (1 replica, 6 from 10:00 to 11:00), and answers 6 replicas ahead of the 10:00 ramp while the
//! emulator reports a load of 1 replica; without `forecast` the same load answers 1. Then the
//! same ramp fed through the emulator over two days of a clock the test moves: the live shape
//! learns it and answers it ahead of time on the third day.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    body::Bytes,
    extract::{RawQuery, State},
    http::header::CONTENT_TYPE,
    response::IntoResponse,
    routing::get,
};
use jiff::Timestamp;
use nightshift::scaler::forecasts::{Clock, ForecastOptions};
use tokio_util::sync::CancellationToken;

use crate::{
    emulator::Emulator,
    harness::{NAMESPACE, ScalerUnderTest, eventually, get_json, get_metrics, scaled_object},
};

const DAY: i64 = 86_400;
/// The test's "today", days since the epoch (any day works).
const TODAY: i64 = 20_000;
/// 09:59 today: a minute before the daily ramp.
const NOW: i64 = TODAY * DAY + 9 * 3600 + 59 * 60;
/// The daily ramp: from 10:00 to 11:00 the service runs at [`HIGH`] replicas, otherwise [`LOW`].
const RAMP: std::ops::Range<i64> = 10 * 3600..11 * 3600;
const HIGH: f64 = 6.0;
const LOW: f64 = 1.0;

/// A Prometheus stand-in answering range queries with two whole days (the two before today)
/// of the synthetic shape, and keeping the queries it was asked.
struct HistoryServer {
    addr: SocketAddr,
    queries: Arc<Mutex<Vec<String>>>,
    stop: CancellationToken,
}

impl Drop for HistoryServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl HistoryServer {
    async fn start() -> Self {
        let queries = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/api/v1/query_range", get(range).post(range))
            .with_state(queries.clone());
        let (addr, stop) = crate::fake_prometheus::serve(app).await;
        Self {
            addr,
            queries,
            stop,
        }
    }

    fn queries(&self) -> Vec<String> {
        self.queries.lock().expect("lock").clone()
    }
}

/// The parameters of a request, from its URL or its form body.
fn params(query: Option<String>, body: &[u8]) -> HashMap<String, String> {
    let mut out: HashMap<String, String> =
        url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    out.extend(url::form_urlencoded::parse(body).into_owned());
    out
}

async fn range(
    State(queries): State<Arc<Mutex<Vec<String>>>>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> impl IntoResponse {
    let p = params(query, &body);
    let number = |k: &str| p.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    queries
        .lock()
        .expect("lock")
        .push(p.get("query").cloned().unwrap_or_default());
    let (start, end, step) = (
        number("start") as i64,
        number("end") as i64,
        number("step") as i64,
    );
    let mut values = Vec::new();
    let mut ts = start;
    while step > 0 && ts <= end {
        // The point at ts is the peak of the bucket (ts - step, ts].
        let bucket = ts - step;
        if ((TODAY - 2) * DAY..TODAY * DAY).contains(&bucket) {
            let v = if RAMP.contains(&bucket.rem_euclid(DAY)) {
                HIGH
            } else {
                LOW
            };
            values.push(format!("[{ts},\"{v}\"]"));
        }
        ts += step;
    }
    let body = format!(
        r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{}},"values":[{}]}}]}}}}"#,
        values.join(",")
    );
    ([(CONTENT_TYPE, "application/json")], body)
}

#[tokio::test]
async fn forecast_answers_the_learned_ramp_ahead_of_it_and_measured_demand_without() {
    let history = HistoryServer::start().await;
    let now = Timestamp::from_second(NOW).expect("timestamp");
    let s = ScalerUnderTest::start_with_forecast(
        Duration::from_millis(50),
        ForecastOptions {
            prometheus: Some(format!("http://{}", history.addr)),
            clock: Clock::from_fn(move || now),
            ..ForecastOptions::default()
        },
    )
    .await;
    // Current load: 2 waiting requests against a target of 2 per replica, 1 replica.
    let vllm = Emulator::start("llama", 1, false).await;
    vllm.set(0, |e| e.waiting = 2.0);
    let endpoint = vllm.endpoint();
    let trigger = |forecast: bool| {
        let mut meta = vec![
            ("endpoints", endpoint.as_str()),
            ("model", "llama"),
            ("waitingTarget", "2"),
        ];
        if forecast {
            meta.extend([("forecast", "daily"), ("forecastLead", "3m")]);
        }
        meta
    };
    let on = scaled_object("forecast-on", &trigger(true));
    let off = scaled_object("forecast-off", &trigger(false));
    let mut c = s.client().await;

    // Without forecast: the measured demand.
    let v = get_metrics(&mut c, &off).await.expect("metrics");
    assert_eq!(v.metric_value, 100, "{v:?}");

    // With forecast: the first evaluation starts the rebuild; once it is in, the answer is the
    // ramp's 6 replicas, a minute before the ramp and while 1 replica is measured.
    let first = get_metrics(&mut c, &on).await.expect("metrics");
    assert!(
        first.metric_value == 100 || first.metric_value == 600,
        "{first:?}"
    );
    let v = eventually(Duration::from_secs(10), "the forecast's demand", || {
        let (mut c, on) = (c.clone(), on.clone());
        async move {
            let v = get_metrics(&mut c, &on).await.ok()?;
            (v.metric_value == 600).then_some(v)
        }
    })
    .await;
    assert!((v.metric_value_float - HIGH * 100.0).abs() < 1e-6, "{v:?}");
    // Still measured demand for the other one.
    let v = get_metrics(&mut c, &off).await.expect("metrics");
    assert_eq!(v.metric_value, 100, "{v:?}");

    // The rebuild asked, once, for exactly this ScaledObject's own measured demand, of the
    // service its trigger reads: the series the scaler exports.
    let text = s.metrics_text();
    let exported = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!(
                "nightshift_scaler_measured_demand_replicas{{namespace=\"{NAMESPACE}\",scaled_object=\"forecast-on\","
            ))
        })
        .and_then(|rest| rest.split_once('}'))
        .map(|(service, _)| service.to_string())
        .unwrap_or_else(|| panic!("no measured demand of forecast-on in\n{text}"));
    assert!(
        exported.len() == "service=\"\"".len() + 16 && exported.starts_with("service=\""),
        "{exported}"
    );
    let queries = history.queries();
    assert_eq!(
        queries,
        vec![format!(
            "max(max_over_time(nightshift_scaler_measured_demand_replicas{{namespace=\"{NAMESPACE}\",\
             scaled_object=\"forecast-on\",{exported}}}[300s]))"
        )]
    );

    // /scaler/decisions says the forecast decided, and on what.
    let routes = s.scaler.decisions().routes();
    let on_json = get_json(
        routes.clone(),
        &format!("/scaler/decisions/{NAMESPACE}/forecast-on"),
    )
    .await;
    let f = &on_json["forecast"];
    assert_eq!(f["decided"], true, "{on_json}");
    assert_eq!(f["measured"], 1.0, "{on_json}");
    assert!(
        (f["expected"].as_f64().unwrap_or(0.0) - HIGH).abs() < 1e-9,
        "{on_json}"
    );
    assert_eq!(f["leadSeconds"], 180.0, "{on_json}");
    // The two days rebuilt, and today's live evaluations.
    assert_eq!(f["daysLearned"], 3, "{on_json}");
    assert!(
        f["history"]
            .as_str()
            .unwrap_or("")
            .starts_with("rebuilt from Prometheus"),
        "{on_json}"
    );
    assert!((on_json["replicas"].as_f64().unwrap_or(0.0) - HIGH).abs() < 1e-9);
    let off_json = get_json(
        routes,
        &format!("/scaler/decisions/{NAMESPACE}/forecast-off"),
    )
    .await;
    assert!(off_json.get("forecast").is_none(), "{off_json}");
    assert_eq!(off_json["replicas"], 1.0, "{off_json}");

    // The measured demand is exported apart from the reported one (what a rebuild reads).
    let text = s.metrics_text();
    let measured = format!(
        "nightshift_scaler_measured_demand_replicas{{namespace=\"team-a\",scaled_object=\"forecast-on\",{exported}}} 1.0"
    );
    for line in [
        measured.as_str(),
        "nightshift_scaler_demand_replicas{namespace=\"team-a\",scaled_object=\"forecast-on\"} 6.0",
        "nightshift_scaler_forecast_rebuilds_total{outcome=\"ok\"} 1",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
}

#[tokio::test]
async fn a_failed_read_stays_an_error_with_forecast() {
    let now = Timestamp::from_second(NOW).expect("timestamp");
    let s = ScalerUnderTest::start_with_forecast(
        Duration::from_millis(50),
        ForecastOptions {
            clock: Clock::from_fn(move || now),
            ..ForecastOptions::default()
        },
    )
    .await;
    let mut c = s.client().await;
    // Nothing listens on port 1.
    let so = scaled_object(
        "broken",
        &[
            ("endpoints", "127.0.0.1:1"),
            ("waitingTarget", "2"),
            ("forecast", "daily"),
        ],
    );
    assert!(get_metrics(&mut c, &so).await.is_err());
    let explained = s
        .scaler
        .decisions()
        .get(NAMESPACE, "broken")
        .expect("explained");
    let forecast = explained.forecast.expect("forecast explained");
    assert_eq!((forecast.measured, forecast.decided), (None, false));
    assert!(explained.error.is_some() && explained.replicas.is_none());
}

/// The synthetic day in replicas: [`HIGH`] during the ramp's hour, [`LOW`] otherwise.
fn synthetic(t: i64) -> f64 {
    if RAMP.contains(&t.rem_euclid(DAY)) {
        HIGH
    } else {
        LOW
    }
}

#[tokio::test]
async fn forecast_learns_a_ramp_fed_through_the_emulator_and_answers_ahead_of_it() {
    // A clock the test moves; no Prometheus: the shape learns from live evaluations only.
    let at = Arc::new(Mutex::new((TODAY - 2) * DAY));
    let clock = {
        let at = at.clone();
        Clock::from_fn(move || {
            let t = *at.lock().unwrap_or_else(|p| p.into_inner());
            Timestamp::from_second(t).unwrap_or(Timestamp::UNIX_EPOCH)
        })
    };
    // No cache: every evaluation reads the emulator as the test set it.
    let s = ScalerUnderTest::start_with_forecast(
        Duration::ZERO,
        ForecastOptions {
            clock,
            ..ForecastOptions::default()
        },
    )
    .await;
    let vllm = Emulator::start("llama", 1, false).await;
    let endpoint = vllm.endpoint();
    let on = scaled_object(
        "learner",
        &[
            ("endpoints", endpoint.as_str()),
            ("model", "llama"),
            ("waitingTarget", "2"),
            ("forecast", "daily"),
        ],
    );
    let mut c = s.client().await;
    // Two days, one evaluation per 5-minute bucket, the load following the synthetic day
    // (2 waiting requests per replica of demand).
    for t in ((TODAY - 2) * DAY..TODAY * DAY).step_by(300) {
        *at.lock().expect("lock") = t;
        vllm.set(0, |e| e.waiting = 2.0 * synthetic(t));
        get_metrics(&mut c, &on).await.expect("metrics");
    }
    // 09:59 on the third day, the load still low: the ramp's demand is answered ahead of it.
    *at.lock().expect("lock") = NOW;
    vllm.set(0, |e| e.waiting = 2.0 * LOW);
    let v = get_metrics(&mut c, &on).await.expect("metrics");
    assert_eq!(v.metric_value, 600, "{v:?}");
    let f = s
        .scaler
        .decisions()
        .get(NAMESPACE, "learner")
        .and_then(|e| e.forecast)
        .expect("forecast explained");
    assert!(f.decided, "{f:?}");
    assert_eq!((f.measured, f.days_learned), (Some(LOW), 3), "{f:?}");
    // At 11:30, after the ramp, the forecast expects the low level again and does not decide.
    *at.lock().expect("lock") = TODAY * DAY + 11 * 3600 + 30 * 60;
    let v = get_metrics(&mut c, &on).await.expect("metrics");
    assert_eq!(v.metric_value, 100, "{v:?}");
}
