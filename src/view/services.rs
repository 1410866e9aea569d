//! Demand against replicas per inference service over the last week, for the view's charts: a
//! bounded ring per ScaledObject fed from the scaler's decisions once a minute and kept at
//! 5-minute means.
//!
//! Pure: [`Services`] takes readings with their time and answers averaged series; the sampler
//! that reads the scaler lives in [`super`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

/// One point per 5 minutes: the day chart's resolution, and a week of them per service is
/// 2,016 points (32 KiB), so that many services fit the view's memory budget.
pub const STEP: i64 = 300;
/// A week of 5-minute points.
pub const POINTS: usize = 7 * 24 * 3600 / STEP as usize;
/// Most services charted: beyond a realistic fleet (tens of inference services), so that a
/// cluster with thousands of ScaledObjects cannot grow the view without bound. Later ones are
/// left out of the charts (and counted).
pub const MAX_SERVICES: usize = 128;
/// Memory of the rings when full: [`MAX_SERVICES`] × [`POINTS`] × 16-byte points = 4,128,768
/// bytes (about 3.9 MiB); with the pool's history (236 KiB) the view stays under 5 MiB.
pub const MAX_BYTES: usize = MAX_SERVICES * POINTS * std::mem::size_of::<Point>();

/// One inference service (a ScaledObject), by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ServiceKey {
    pub namespace: String,
    pub name: String,
}

/// Mean demand and replicas over one step.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Start of the step (Unix seconds).
    pub at: i64,
    /// Replicas the scaler asked for (its demand figure).
    pub demand: f32,
    /// Replicas serving: the pods that reported metrics to the scaler.
    pub replicas: f32,
}

/// The step being filled: sums and count of the readings in it.
#[derive(Clone, Copy, Debug)]
struct Open {
    at: i64,
    demand: f64,
    replicas: f64,
    n: u32,
}

impl Open {
    fn point(&self) -> Point {
        let n = f64::from(self.n.max(1));
        Point {
            at: self.at,
            demand: (self.demand / n) as f32,
            replicas: (self.replicas / n) as f32,
        }
    }
}

#[derive(Clone, Debug)]
struct Ring {
    points: VecDeque<Point>,
    open: Option<Open>,
}

impl Ring {
    fn new() -> Self {
        Self {
            points: VecDeque::with_capacity(POINTS),
            open: None,
        }
    }

    fn push(&mut self, p: Point) {
        if self.points.len() == POINTS {
            self.points.pop_front();
        }
        self.points.push_back(p);
    }

    fn last_at(&self) -> Option<i64> {
        self.open
            .map(|o| o.at)
            .or_else(|| self.points.back().map(|p| p.at))
    }
}

/// The last week of demand and replicas of every charted service.
#[derive(Clone, Debug, Default)]
pub struct Services {
    rings: BTreeMap<ServiceKey, Ring>,
    /// Services seen but not charted because [`MAX_SERVICES`] were already.
    left_out: BTreeSet<ServiceKey>,
}

/// A service's points over a span.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub namespace: String,
    pub name: String,
    /// The latest 5-minute mean (the step being filled), whatever the span.
    pub latest: Option<Point>,
    pub points: Vec<Point>,
}

/// The step holding `at`.
fn step_of(at: i64) -> i64 {
    at.div_euclid(STEP) * STEP
}

impl Services {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one reading of `key` at `at` (Unix seconds) to its 5-minute mean. Returns whether
    /// it was kept: a value that is not a finite, non-negative number, a reading older than the
    /// service's current step, or a service beyond [`MAX_SERVICES`] is not.
    pub fn record(&mut self, key: &ServiceKey, at: i64, demand: f64, replicas: f64) -> bool {
        let usable = |v: f64| v.is_finite() && v >= 0.0;
        if !usable(demand) || !usable(replicas) {
            return false;
        }
        let Some(ring) = self.ring(key) else {
            return false;
        };
        let step = step_of(at);
        match &mut ring.open {
            Some(o) if o.at == step => {
                o.demand += demand;
                o.replicas += replicas;
                o.n += 1;
                return true;
            }
            Some(o) if o.at > step => return false,
            _ => {}
        }
        if let Some(done) = ring.open.take() {
            ring.push(done.point());
        }
        ring.open = Some(Open {
            at: step,
            demand,
            replicas,
            n: 1,
        });
        true
    }

    /// Adds points older than any `key` holds (history rebuilt from Prometheus, oldest first):
    /// points at or after the service's first are dropped, so live samples win.
    pub fn backfill(&mut self, key: &ServiceKey, points: &[Point]) -> usize {
        let Some(ring) = self.ring(key) else {
            return 0;
        };
        let first = ring
            .points
            .front()
            .map(|p| p.at)
            .or(ring.open.map(|o| o.at))
            .unwrap_or(i64::MAX);
        let older: Vec<Point> = points.iter().filter(|p| p.at < first).copied().collect();
        let room = POINTS.saturating_sub(ring.points.len() + usize::from(ring.open.is_some()));
        let kept = older.len().min(room);
        for p in older[older.len() - kept..].iter().rev() {
            ring.points.push_front(*p);
        }
        kept
    }

    /// The ring of `key`, created when fewer than [`MAX_SERVICES`] exist.
    fn ring(&mut self, key: &ServiceKey) -> Option<&mut Ring> {
        if !self.rings.contains_key(key) {
            if self.rings.len() >= MAX_SERVICES {
                self.left_out.insert(key.clone());
                return None;
            }
            self.rings.insert(key.clone(), Ring::new());
        }
        self.rings.get_mut(key)
    }

    /// Drops services with no reading since `before` (deleted ScaledObjects age out after a
    /// week), making room for new ones.
    pub fn forget_older_than(&mut self, before: i64) {
        self.rings
            .retain(|_, r| r.last_at().is_some_and(|at| at >= before));
        self.left_out.clear();
    }

    /// Services charted.
    pub fn len(&self) -> usize {
        self.rings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rings.is_empty()
    }

    /// Services seen but not charted for want of room.
    pub fn left_out(&self) -> usize {
        self.left_out.len()
    }

    /// Points held in all.
    pub fn points(&self) -> usize {
        self.rings
            .values()
            .map(|r| r.points.len() + usize::from(r.open.is_some()))
            .sum()
    }

    /// Heap memory of the rings' points (their capacity, not only their length).
    pub fn heap_bytes(&self) -> usize {
        self.rings
            .values()
            .map(|r| r.points.capacity() * std::mem::size_of::<Point>())
            .sum()
    }

    /// Mean demand and replicas per `bucket` seconds over `[from, to)` for every service, the
    /// step being filled included; buckets without points are left out.
    pub fn series(&self, from: i64, to: i64, bucket: i64) -> Vec<Series> {
        let bucket = bucket.max(STEP);
        self.rings
            .iter()
            .map(|(key, ring)| {
                let start = ring.points.partition_point(|p| p.at < from);
                let open = ring.open.map(|o| o.point());
                let points = ring
                    .points
                    .range(start..)
                    .copied()
                    .chain(open)
                    .take_while(|p| p.at < to)
                    .filter(|p| p.at >= from);
                Series {
                    namespace: key.namespace.clone(),
                    name: key.name.clone(),
                    latest: open.or_else(|| ring.points.back().copied()),
                    points: means(points, from, bucket),
                }
            })
            .collect()
    }
}

/// Means of `points` (in time order) per `bucket` seconds from `from`.
fn means(points: impl Iterator<Item = Point>, from: i64, bucket: i64) -> Vec<Point> {
    let mut out = Vec::new();
    let mut acc: Option<Open> = None;
    for p in points {
        let b = from + (p.at - from).div_euclid(bucket) * bucket;
        match &mut acc {
            Some(o) if o.at == b => {
                o.demand += f64::from(p.demand);
                o.replicas += f64::from(p.replicas);
                o.n += 1;
            }
            _ => {
                if let Some(done) = acc.take() {
                    out.push(done.point());
                }
                acc = Some(Open {
                    at: b,
                    demand: f64::from(p.demand),
                    replicas: f64::from(p.replicas),
                    n: 1,
                });
            }
        }
    }
    out.extend(acc.map(|o| o.point()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ServiceKey {
        ServiceKey {
            namespace: "inference".into(),
            name: name.into(),
        }
    }

    #[test]
    fn readings_are_averaged_per_five_minutes() {
        let mut s = Services::new();
        for (i, d) in [1.0, 2.0, 3.0, 4.0, 5.0, 10.0].into_iter().enumerate() {
            assert!(s.record(&key("llama"), i as i64 * 60, d, 2.0));
        }
        let series = s.series(0, 3600, STEP);
        assert_eq!(series.len(), 1);
        let p = &series[0].points;
        assert_eq!(p.len(), 2, "minutes 0-4, then minute 5 (still open)");
        assert_eq!((p[0].at, p[0].demand, p[0].replicas), (0, 3.0, 2.0));
        assert_eq!((p[1].at, p[1].demand), (300, 10.0));
        let hourly = s.series(0, 3600, 3600);
        assert_eq!(hourly[0].points.len(), 1);
        assert_eq!(hourly[0].points[0].demand, 6.5, "mean of the two steps");
    }

    #[test]
    fn unusable_and_late_readings_are_not_kept() {
        let mut s = Services::new();
        assert!(!s.record(&key("a"), 0, f64::NAN, 1.0));
        assert!(!s.record(&key("a"), 0, 1.0, -1.0));
        assert!(!s.record(&key("a"), 0, f64::INFINITY, 1.0));
        assert!(s.record(&key("a"), 600, 1.0, 1.0));
        assert!(
            !s.record(&key("a"), 0, 1.0, 1.0),
            "older than the open step"
        );
        assert_eq!(s.points(), 1);
    }

    #[test]
    fn a_week_of_many_services_stays_within_the_bound() {
        let mut s = Services::new();
        for n in 0..MAX_SERVICES + 5 {
            let k = key(&format!("svc-{n}"));
            for m in 0..(POINTS as i64 + 3) * 5 {
                s.record(&k, m * 60, 1.5, 2.0);
            }
        }
        assert_eq!(s.len(), MAX_SERVICES);
        assert_eq!(s.left_out(), 5);
        assert_eq!(
            s.points(),
            MAX_SERVICES * (POINTS + 1),
            "a week and the open step"
        );
        assert!(
            s.heap_bytes() <= MAX_BYTES,
            "{} > {MAX_BYTES}",
            s.heap_bytes()
        );
        assert_eq!(std::mem::size_of::<Point>(), 16);
        let pool = crate::pool::history::MAX_BYTES;
        assert!(MAX_BYTES + pool <= 5 * 1024 * 1024, "view history ≤ 5 MiB");
    }

    #[test]
    fn backfilled_points_go_before_live_ones_and_respect_the_bound() {
        let mut s = Services::new();
        s.record(&key("a"), 10 * STEP, 4.0, 4.0);
        let old: Vec<Point> = (0..12)
            .map(|i| Point {
                at: i * STEP,
                demand: i as f32,
                replicas: 1.0,
            })
            .collect();
        assert_eq!(s.backfill(&key("a"), &old), 10, "steps 10 and 11 are live");
        let p = &s.series(0, 20 * STEP, STEP)[0].points;
        assert_eq!(p.len(), 11);
        assert_eq!((p[9].at, p[9].demand), (9 * STEP, 9.0));
        assert_eq!((p[10].at, p[10].demand), (10 * STEP, 4.0));
        let long: Vec<Point> = (0..POINTS as i64 * 2)
            .map(|i| Point {
                at: i * STEP,
                demand: 1.0,
                replicas: 1.0,
            })
            .collect();
        let mut fresh = Services::new();
        assert_eq!(fresh.backfill(&key("b"), &long), POINTS, "the newest week");
        assert_eq!(fresh.points(), POINTS);
        assert!(fresh.heap_bytes() <= POINTS * std::mem::size_of::<Point>());
    }

    #[test]
    fn services_without_readings_for_a_week_are_forgotten() {
        let mut s = Services::new();
        s.record(&key("old"), 0, 1.0, 1.0);
        s.record(&key("new"), 7 * 86_400, 1.0, 1.0);
        s.forget_older_than(86_400);
        let names: Vec<String> = s
            .series(0, i64::MAX, STEP)
            .into_iter()
            .map(|x| x.name)
            .collect();
        assert_eq!(names, ["new"]);
    }
}
