//! The researchers' view as data: [`View`] (also the `/api/view` JSON), built from a pool status
//! report and the usage history by [`build`].
//!
//! It owns what the page shows: the pool now, research by namespace, recent preemptions, the
//! charts' series. It must not write HTML (that is [`super::html`]'s). Pure: no I/O, no clock;
//! everything comes in as arguments.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::services::{self, Point, Services};
use crate::pool::{
    history::{self, History, Sample},
    marks::Verdict,
    status::StatusReport,
};

/// The 24-hour chart averages 5 minutes per point (288 points): smooth enough to read, few
/// enough to draw fast.
const DAY_BUCKET: i64 = 300;
/// The 7-day chart averages an hour per point (168 points).
const WEEK_BUCKET: i64 = 3600;
pub(super) const DAY: i64 = 86_400;
pub(super) const WEEK: i64 = 7 * DAY;

/// GPUs by use, now, for the whole pool or one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Use {
    pub inference: u64,
    pub research: u64,
    pub free: u64,
    pub headroom: u64,
}

impl Use {
    pub fn total(&self) -> u64 {
        self.inference + self.research + self.free + self.headroom
    }
}

/// The pool now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolNow {
    pub nodes: usize,
    pub gpus: Use,
    pub spare_nodes: usize,
    pub lending_open: bool,
    /// `always` or the daily windows.
    pub lending_windows: String,
    /// GPUs kept free for inference bursts.
    pub headroom_target: u64,
}

/// One pool node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeUse {
    pub name: String,
    pub state: Verdict,
    pub gpus: Use,
}

/// Research of one namespace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NamespaceUse {
    pub namespace: String,
    pub gpus_now: u64,
    /// Research pods not bound to a node yet.
    pub waiting_pods: u64,
    pub gpu_hours_lent: f64,
    pub preemptions: u64,
    pub gpu_hours_lost: f64,
    /// Research pods under a reclaim notice now (inference needs their GPUs soon).
    #[serde(default)]
    pub under_notice: u64,
}

/// One preempted (or otherwise disrupted) research pod.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Preemption {
    pub at: Timestamp,
    pub namespace: String,
    pub pod: String,
    pub node: Option<String>,
    pub reason: String,
    pub gpus: u64,
    pub ran_seconds: Option<i64>,
    /// GPU-hours since the pod's last checkpoint (or start).
    pub gpu_hours_lost: Option<f64>,
    /// Seconds between the pod's reclaim notice and its preemption (`None`: no notice).
    #[serde(default)]
    pub warned_seconds: Option<i64>,
    /// The inference service (ScaledObject, `namespace/name`) whose scale-up took the GPUs,
    /// when nightshift can tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
}

/// Where the history in memory comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HistoryOrigin {
    /// Sampled in memory since this replica started at `at`; `rebuild_failed` says why a
    /// configured Prometheus could not give the earlier history.
    SinceStart {
        at: Timestamp,
        rebuild_failed: Option<String>,
    },
    /// Sampled since `at` while the earlier history is read from `prometheus`.
    Rebuilding { at: Timestamp, prometheus: String },
    /// Rebuilt from `prometheus` at `at` (`samples` samples and points), then sampled in memory.
    Prometheus {
        at: Timestamp,
        prometheus: String,
        samples: usize,
    },
}

/// Demand against replicas of one inference service (a ScaledObject).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceChart {
    pub namespace: String,
    pub name: String,
    /// The latest 5-minute mean.
    pub latest: Option<Point>,
    /// Last 7 days, hourly means.
    pub week: Vec<Point>,
}

/// Usage over time (in memory since the controller started, or rebuilt from Prometheus).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Charts {
    pub origin: HistoryOrigin,
    /// The oldest sample kept (`null` before the first).
    pub since: Option<Timestamp>,
    pub samples: usize,
    /// Most memory the history of the pool takes (a week of samples).
    pub max_bytes: usize,
    /// Most memory the history of the inference services takes.
    pub services_max_bytes: usize,
    /// Last 24 h, 5-minute means.
    pub day: Vec<Sample>,
    /// Last 7 days, hourly means.
    pub week: Vec<Sample>,
    /// Demand against replicas per inference service, by namespace and name.
    pub services: Vec<ServiceChart>,
}

/// Everything the page shows; served as JSON at `/api/view`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct View {
    pub generated_at: Timestamp,
    /// The namespace filter, when one is set.
    pub namespace: Option<String>,
    /// Whether the controller's caches hold a full list (figures may be incomplete before).
    pub synced: bool,
    pub pool: PoolNow,
    pub namespaces: Vec<NamespaceUse>,
    /// Most recent first.
    pub preemptions: Vec<Preemption>,
    pub charts: Charts,
    pub nodes: Vec<NodeUse>,
}

fn hours(seconds: u64) -> f64 {
    (seconds as f64 / 360.0).round() / 10.0
}

/// Everything over time the view shows, and where it comes from.
#[derive(Clone, Copy, Debug)]
pub struct Timeline<'a> {
    pub pool: &'a History,
    pub services: &'a Services,
    pub origin: &'a HistoryOrigin,
}

/// The view of `report` and `timeline`, restricted to `namespace` when set (the pool, its nodes
/// and the inference services stay whole: they are shared).
pub fn build(report: &StatusReport, timeline: Timeline<'_>, namespace: Option<&str>) -> View {
    let history = timeline.pool;
    let wanted = |ns: &str| namespace.is_none_or(|w| w == ns);
    let nodes: Vec<NodeUse> = report
        .nodes
        .iter()
        .map(|n| {
            let held_back = n.state == Verdict::Headroom;
            NodeUse {
                name: n.name.clone(),
                state: n.state,
                gpus: Use {
                    inference: n.protected,
                    research: n.lent,
                    free: if held_back { 0 } else { n.free },
                    headroom: if held_back { n.free } else { 0 },
                },
            }
        })
        .collect();
    let mut gpus = Use::default();
    for n in &nodes {
        gpus.inference += n.gpus.inference;
        gpus.research += n.gpus.research;
        gpus.free += n.gpus.free;
        gpus.headroom += n.gpus.headroom;
    }
    let mut by_ns: BTreeMap<&str, NamespaceUse> = BTreeMap::new();
    for n in report.namespaces.iter().filter(|n| wanted(&n.namespace)) {
        by_ns.insert(
            &n.namespace,
            NamespaceUse {
                namespace: n.namespace.clone(),
                gpus_now: n.lent_gpus,
                waiting_pods: 0,
                gpu_hours_lent: hours(n.lent_gpu_seconds),
                preemptions: n.preemptions,
                gpu_hours_lost: hours(n.lost_gpu_seconds),
                under_notice: 0,
            },
        );
    }
    for p in report.research_pods.iter().filter(|p| wanted(&p.namespace)) {
        let u = by_ns.entry(&p.namespace).or_insert_with(|| NamespaceUse {
            namespace: p.namespace.clone(),
            gpus_now: 0,
            waiting_pods: 0,
            gpu_hours_lent: 0.0,
            preemptions: 0,
            gpu_hours_lost: 0.0,
            under_notice: 0,
        });
        if p.node.is_none() && p.phase == "Pending" {
            u.waiting_pods += 1;
        }
        if p.noticed.is_some() {
            u.under_notice += 1;
        }
    }
    let preemptions = report
        .recent_disruptions
        .iter()
        .filter(|d| wanted(&d.namespace))
        .map(|d| Preemption {
            at: d.at,
            namespace: d.namespace.clone(),
            pod: d.name.clone(),
            node: d.node.clone(),
            reason: d.reason.clone(),
            gpus: d.gpus,
            ran_seconds: d.ran_seconds,
            gpu_hours_lost: d.lost_gpu_seconds.map(hours),
            warned_seconds: d.noticed.map(|n| d.at.duration_since(n).as_secs().max(0)),
            service: d.service.clone(),
        })
        .collect();
    let now = report.generated_at.as_second();
    // The charts' windows end with `now` included and span exactly a day and a week, so that
    // they fall into whole buckets (288 and 168) and the last point is a full bucket's mean,
    // not a bucket of the last second alone.
    let until = now + 1;
    let (day_from, week_from) = (until - DAY, until - WEEK);
    View {
        generated_at: report.generated_at,
        namespace: namespace.map(str::to_string),
        synced: report.synced,
        pool: PoolNow {
            nodes: nodes.len(),
            gpus,
            spare_nodes: report.spare_nodes,
            lending_open: report.lending_open,
            lending_windows: if report.lending_windows.is_empty() {
                "always".to_string()
            } else {
                report.lending_windows.clone()
            },
            headroom_target: report.headroom,
        },
        namespaces: by_ns.into_values().collect(),
        preemptions,
        charts: Charts {
            origin: timeline.origin.clone(),
            since: history
                .first_at()
                .and_then(|s| Timestamp::from_second(s).ok()),
            samples: history.len(),
            max_bytes: history::MAX_BYTES,
            services_max_bytes: services::MAX_BYTES,
            day: history.series(day_from, until, DAY_BUCKET),
            week: history.series(week_from, until, WEEK_BUCKET),
            services: timeline
                .services
                .series(week_from, until, WEEK_BUCKET)
                .into_iter()
                .map(|s| ServiceChart {
                    namespace: s.namespace,
                    name: s.name,
                    latest: s.latest,
                    week: s.points,
                })
                .collect(),
        },
        nodes,
    }
}

/// Tests of the model, and the fixtures of a pool report and its view that the tests of
/// [`super::html`] share.
#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::pool::{
        accounting::{DisruptionRecord, GpuTotals},
        status::{NamespaceStatus, NodeStatus, ResearchPod},
    };

    pub(crate) fn now() -> Timestamp {
        Timestamp::from_second(2_000_000_000).expect("ts")
    }

    fn since_start() -> HistoryOrigin {
        HistoryOrigin::SinceStart {
            at: now(),
            rebuild_failed: None,
        }
    }

    pub(crate) fn view_of(r: &StatusReport, h: &History, namespace: Option<&str>) -> View {
        let timeline = Timeline {
            pool: h,
            services: &Services::new(),
            origin: &since_start(),
        };
        build(r, timeline, namespace)
    }

    fn node(name: &str, state: Verdict, protected: u64, lent: u64, free: u64) -> NodeStatus {
        NodeStatus {
            name: name.into(),
            allocatable: protected + lent + free,
            protected,
            lent,
            free,
            state,
            spare_gpus: None,
            marked_spare_gpus: None,
        }
    }

    pub(crate) fn report() -> StatusReport {
        StatusReport {
            generated_at: now(),
            leader: Some(true),
            synced: true,
            lending_open: true,
            lending_windows: String::new(),
            headroom: 8,
            totals: GpuTotals::default(),
            spare_nodes: 1,
            nodes: vec![
                node("gpu-a", Verdict::Headroom, 0, 0, 8),
                node("gpu-b", Verdict::Spare, 2, 5, 1),
            ],
            research_pods: vec![ResearchPod {
                namespace: "team-b".into(),
                name: "queued".into(),
                node: None,
                phase: "Pending".into(),
                gpus: Some(1),
                age_seconds: Some(5),
                disruption: None,
                noticed: Some(now()),
            }],
            namespaces: vec![NamespaceStatus {
                namespace: "team-a".into(),
                lent_gpus: 5,
                lent_gpu_seconds: 36_000,
                preemptions: 1,
                lost_gpu_seconds: 1800,
            }],
            recent_disruptions: vec![DisruptionRecord {
                namespace: "team-a".into(),
                name: "sft-0".into(),
                node: Some("gpu-b".into()),
                reason: "PreemptionByScheduler".into(),
                ran_seconds: Some(3600),
                gpus: 3,
                at: now(),
                lost_gpu_seconds: Some(1800),
                uid: Some("u1".into()),
                noticed: Some(now() - jiff::SignedDuration::from_mins(10)),
                service: Some("inference/llama".into()),
                owner: None,
            }],
        }
    }

    #[test]
    fn free_gpus_of_headroom_nodes_count_as_headroom() {
        let v = view_of(&report(), &History::new(), None);
        assert_eq!(
            v.pool.gpus,
            Use {
                inference: 2,
                research: 5,
                free: 1,
                headroom: 8
            }
        );
        assert_eq!(v.pool.lending_windows, "always");
        assert_eq!(v.nodes[0].gpus.headroom, 8);
        let names: Vec<&str> = v.namespaces.iter().map(|n| n.namespace.as_str()).collect();
        assert_eq!(names, ["team-a", "team-b"]);
        assert_eq!(v.namespaces[0].gpu_hours_lent, 10.0);
        assert_eq!(v.namespaces[0].gpu_hours_lost, 0.5);
        assert_eq!(v.namespaces[1].waiting_pods, 1);
        assert_eq!(v.preemptions[0].gpu_hours_lost, Some(0.5));
        assert_eq!(v.preemptions[0].warned_seconds, Some(600));
        assert_eq!(v.preemptions[0].service.as_deref(), Some("inference/llama"));
        assert_eq!(v.namespaces[1].under_notice, 1);
    }

    #[test]
    fn a_full_week_of_samples_makes_whole_buckets_up_to_now() {
        let mut h = History::new();
        let now = now().as_second();
        let minutes = i64::try_from(history::CAPACITY).expect("capacity");
        for i in (0..minutes).rev() {
            h.record(Sample {
                at: now - i * 60,
                inference: 2,
                research: 5,
                free: 1,
                headroom: 8,
            });
        }
        let v = view_of(&report(), &h, None);
        assert_eq!(v.charts.day.len(), 288, "a day of 5-minute points");
        assert_eq!(v.charts.week.len(), 168, "a week of hourly points");
        let last = v.charts.day.last().expect("a point");
        assert_eq!(
            last.at,
            now + 1 - 300,
            "the last point is the last five minutes"
        );
        assert_eq!(v.charts.week.last().expect("a point").at, now + 1 - 3600);
    }
}
