//! The view's history rebuilt from Prometheus after a restart: range queries over the last week
//! of nightshift's own metrics, at the steps of the in-memory rings (a minute for the pool's
//! GPUs by use, 5 minutes for demand and replicas per inference service).
//!
//! Metrics read (as every nightshift replica exports them; `max` across replicas, which all
//! watch the same pool): `nightshift_pool_gpus{state}` (protected, lent, free),
//! `nightshift_pool_headroom_gpus` (the part of the free ones held back),
//! `nightshift_scaler_demand_replicas` and `nightshift_scaler_pods` per ScaledObject.
//!
//! Every answer is checked: a value that is not a finite, non-negative number, or an answer
//! that is not a matrix, fails the whole rebuild, so the view shows no history rather than a
//! wrong one. The caller bounds the time ([`from_prometheus`] takes the deadline).

use std::{collections::BTreeMap, time::Duration};

use jiff::Timestamp;

use super::services::{self, Point, ServiceKey};
use crate::{
    pool::history::{self, Sample},
    runtime::admin::METRICS_PREFIX,
    sources::history::HistoryReader,
};

/// A week: the longest chart.
const WEEK: i64 = 7 * 86_400;

/// Errors of a rebuild: those of reading nightshift's history from Prometheus.
pub use crate::sources::history::HistoryError as Error;

/// The history found in Prometheus, oldest first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rebuilt {
    pub pool: Vec<Sample>,
    pub services: BTreeMap<ServiceKey, Vec<Point>>,
}

impl Rebuilt {
    /// Samples and points in all.
    pub fn len(&self) -> usize {
        self.pool.len() + self.services.values().map(Vec::len).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The PromQL of the pool's GPUs in one state, one series for the pool.
fn pool_query(state: &str) -> String {
    format!("max({METRICS_PREFIX}_pool_gpus{{state=\"{state}\"}})")
}

fn headroom_query() -> String {
    format!("max({METRICS_PREFIX}_pool_headroom_gpus)")
}

/// The PromQL of a per-ScaledObject gauge averaged over each 5-minute step.
fn service_query(metric: &str) -> String {
    format!(
        "max by (namespace, scaled_object) (avg_over_time({METRICS_PREFIX}_{metric}[{}s]))",
        services::STEP
    )
}

/// Reads the last week before `now` from the Prometheus at `address`, giving up after
/// `timeout` in all.
pub async fn from_prometheus(
    address: &str,
    now: Timestamp,
    timeout: Duration,
) -> Result<Rebuilt, Error> {
    let reader = Reader(HistoryReader::new(address, timeout)?);
    tokio::time::timeout(timeout, reader.read(now.as_second()))
        .await
        .map_err(|_| Error::Timeout {
            address: address.to_string(),
            after: timeout,
        })?
}

struct Reader(HistoryReader);

impl Reader {
    async fn read(&self, now: i64) -> Result<Rebuilt, Error> {
        let pool = self.pool(now).await?;
        let services = self.services(now).await?;
        Ok(Rebuilt { pool, services })
    }

    /// GPUs by use a minute apart: protected, lent and free must all be known at a minute;
    /// headroom counts as 0 where it is not (metrics of a version without it).
    async fn pool(&self, now: i64) -> Result<Vec<Sample>, Error> {
        let step = history::SAMPLE_SECONDS;
        let end = now.div_euclid(step) * step;
        let start = end - (history::CAPACITY as i64 - 1) * step;
        let protected = self
            .single(&pool_query("protected"), start, end, step)
            .await?;
        let lent = self.single(&pool_query("lent"), start, end, step).await?;
        let free = self.single(&pool_query("free"), start, end, step).await?;
        let headroom = self.single(&headroom_query(), start, end, step).await?;
        let count = |v: f64| u32::try_from(v.round() as u64).unwrap_or(u32::MAX);
        Ok(protected
            .iter()
            .filter_map(|(at, p)| {
                let (l, f) = (lent.get(at)?, free.get(at)?);
                let h = headroom.get(at).copied().unwrap_or(0.0);
                Some(Sample {
                    at: *at,
                    inference: count(*p),
                    research: count(*l),
                    free: count(*f).saturating_sub(count(h)),
                    headroom: count(h),
                })
            })
            .collect())
    }

    /// Demand and replicas per service, 5-minute means stamped with the step's start; both
    /// must be known at a step.
    async fn services(&self, now: i64) -> Result<BTreeMap<ServiceKey, Vec<Point>>, Error> {
        let step = services::STEP;
        // Each answer at t covers (t - step, t]: the point of the step that ends at t.
        let end = now.div_euclid(step) * step;
        let start = end - WEEK + step;
        let demand = self
            .0
            .range(&service_query("scaler_demand_replicas"), start, end, step)
            .await?;
        let pods = self
            .0
            .range(&service_query("scaler_pods"), start, end, step)
            .await?;
        let key = |labels: &BTreeMap<String, String>| ServiceKey {
            namespace: labels.get("namespace").cloned().unwrap_or_default(),
            name: labels.get("scaled_object").cloned().unwrap_or_default(),
        };
        let replicas: BTreeMap<ServiceKey, BTreeMap<i64, f64>> = pods
            .into_iter()
            .map(|(labels, values)| (key(&labels), values.into_iter().collect()))
            .collect();
        let mut out = BTreeMap::new();
        for (labels, values) in demand {
            let k = key(&labels);
            let Some(r) = replicas.get(&k) else {
                continue;
            };
            let points: Vec<Point> = values
                .into_iter()
                .filter_map(|(at, d)| {
                    Some(Point {
                        at: at - step,
                        demand: d as f32,
                        replicas: *r.get(&at)? as f32,
                    })
                })
                .collect();
            if !points.is_empty() {
                out.insert(k, points);
            }
        }
        Ok(out)
    }

    /// A range query expected to answer one series (or none): its values by time.
    async fn single(
        &self,
        query: &str,
        start: i64,
        end: i64,
        step: i64,
    ) -> Result<BTreeMap<i64, f64>, Error> {
        let series = self.0.range(query, start, end, step).await?;
        Ok(series
            .into_iter()
            .next()
            .map(|(_, values)| values.into_iter().collect())
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queries_read_nightshifts_own_metric_names() {
        assert_eq!(
            pool_query("lent"),
            "max(nightshift_pool_gpus{state=\"lent\"})"
        );
        assert_eq!(headroom_query(), "max(nightshift_pool_headroom_gpus)");
        assert_eq!(
            service_query("scaler_pods"),
            "max by (namespace, scaled_object) (avg_over_time(nightshift_scaler_pods[300s]))"
        );
    }

    #[tokio::test]
    async fn an_unreachable_prometheus_is_an_error_not_a_history() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        // Nothing listens on the port any more.
        let err = from_prometheus(
            &format!("http://127.0.0.1:{port}"),
            Timestamp::now(),
            Duration::from_secs(5),
        )
        .await
        .expect_err("nothing listens");
        assert!(matches!(err, Error::Query { .. }), "{err}");
        let bad = from_prometheus("not a url", Timestamp::now(), Duration::from_secs(1))
            .await
            .expect_err("bad address");
        assert!(matches!(bad, Error::Client { .. }), "{bad}");
    }
}
