//! What the pool looks like, for people: the `/status` JSON document and the table that
//! `nightshift status` prints from it.
//!
//! Owns the report types (serialised the same way by the server and read back by the command)
//! and their rendering. Building a report is [`super::controller::Controller::status`]'s job.

use std::fmt::Write as _;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::{
    accounting::{DisruptionRecord, GpuTotals, PodFacts},
    marks::Verdict,
};

/// One pool node in the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub name: String,
    pub allocatable: u64,
    pub protected: u64,
    pub lent: u64,
    pub free: u64,
    /// Why the node is or is not spare.
    pub state: Verdict,
    /// Spare GPUs decided now (`null` unless spare).
    pub spare_gpus: Option<u64>,
    /// `nightshift.io/spare-gpus` as the node carries it now (`null` when not marked).
    pub marked_spare_gpus: Option<String>,
}

/// One research pod in the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResearchPod {
    pub namespace: String,
    pub name: String,
    pub node: Option<String>,
    pub phase: String,
    pub gpus: Option<u64>,
    /// Seconds since creation.
    pub age_seconds: Option<i64>,
    /// `DisruptionTarget` reason, when the pod is being or was disrupted.
    pub disruption: Option<String>,
    /// When the pod was given a reclaim notice that still stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noticed: Option<Timestamp>,
}

impl ResearchPod {
    pub fn from_facts(p: &PodFacts, now: Timestamp) -> Self {
        Self {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            node: p.node.clone(),
            phase: p.phase.clone(),
            gpus: p.gpus,
            age_seconds: p.created.map(|c| now.duration_since(c).as_secs().max(0)),
            disruption: p.disruption.as_ref().map(|d| d.reason.clone()),
            noticed: p.noticed,
        }
    }
}

/// Research of one namespace, since the reporting replica started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceStatus {
    pub namespace: String,
    /// GPUs its research pods hold on the pool now.
    pub lent_gpus: u64,
    pub lent_gpu_seconds: u64,
    /// Research pods disrupted (preempted or evicted).
    pub preemptions: u64,
    /// GPU-seconds of work lost to those disruptions.
    pub lost_gpu_seconds: u64,
}

/// The `/status` document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    pub generated_at: Timestamp,
    /// Whether the reporting replica writes the marks (`null` for a one-shot report).
    pub leader: Option<bool>,
    /// Whether the caches hold a full list of nodes and pods.
    pub synced: bool,
    pub lending_open: bool,
    pub lending_windows: String,
    pub headroom: u64,
    pub totals: GpuTotals,
    pub spare_nodes: usize,
    pub nodes: Vec<NodeStatus>,
    pub research_pods: Vec<ResearchPod>,
    /// Research accounting per namespace, since the reporting replica started (empty for a
    /// one-shot report, which has no history).
    #[serde(default)]
    pub namespaces: Vec<NamespaceStatus>,
    /// Most recent first.
    pub recent_disruptions: Vec<DisruptionRecord>,
}

/// Formats seconds as a short age (`45s`, `12m`, `3h20m`, `2d4h`).
pub fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (cell, w) in cells.zip(&widths) {
            let _ = write!(s, "{cell:<w$}  ");
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(out, &mut header.iter().copied());
    for row in rows {
        line(out, &mut row.iter().map(String::as_str));
    }
}

fn dash(v: Option<impl ToString>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn verdict(v: Verdict) -> &'static str {
    match v {
        Verdict::Spare => "spare",
        Verdict::Headroom => "headroom",
        Verdict::Full => "full",
        Verdict::Cordoned => "cordoned",
        Verdict::NotReady => "not-ready",
        Verdict::Untrusted => "unreadable",
        Verdict::WindowClosed => "window-closed",
        Verdict::Reclaiming => "reclaiming",
    }
}

impl StatusReport {
    /// The report as readable tables.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_summary(&mut out);
        self.render_nodes(&mut out);
        self.render_research_pods(&mut out);
        self.render_disruptions(&mut out);
        self.render_namespaces(&mut out);
        out
    }

    /// Appends the totals line and who writes the marks.
    fn render_summary(&self, out: &mut String) {
        let t = &self.totals;
        let lending = if self.lending_open { "open" } else { "closed" };
        let _ = writeln!(
            out,
            "GPU pool: {} nodes, {} GPUs: {} protected, {} lent, {} free; {} spare nodes; \
             headroom {}; lending {lending} (windows: {})",
            self.nodes.len(),
            t.allocatable,
            t.protected,
            t.lent,
            t.free,
            self.spare_nodes,
            self.headroom,
            self.lending_windows,
        );
        if !self.synced {
            out.push_str("warning: caches not synced yet, figures may be incomplete\n");
        }
        match self.leader {
            Some(true) => out.push_str("this replica writes the spare marks (leader)\n"),
            Some(false) => out.push_str("this replica stands by (another one writes the marks)\n"),
            None => {}
        }
        out.push('\n');
    }

    /// Appends one row per pool node.
    fn render_nodes(&self, out: &mut String) {
        let rows: Vec<Vec<String>> = self
            .nodes
            .iter()
            .map(|n| {
                vec![
                    n.name.clone(),
                    n.allocatable.to_string(),
                    n.protected.to_string(),
                    n.lent.to_string(),
                    n.free.to_string(),
                    verdict(n.state).to_string(),
                    dash(n.spare_gpus),
                    dash(n.marked_spare_gpus.clone()),
                ]
            })
            .collect();
        table(
            out,
            &[
                "NODE",
                "GPUS",
                "PROTECTED",
                "LENT",
                "FREE",
                "STATE",
                "SPARE",
                "MARKED",
            ],
            &rows,
        );
    }

    /// Appends the research pods.
    fn render_research_pods(&self, out: &mut String) {
        let _ = writeln!(out, "\nResearch pods ({}):", self.research_pods.len());
        if !self.research_pods.is_empty() {
            let rows: Vec<Vec<String>> = self
                .research_pods
                .iter()
                .map(|p| {
                    vec![
                        p.namespace.clone(),
                        p.name.clone(),
                        dash(p.node.clone()),
                        p.phase.clone(),
                        dash(p.gpus),
                        dash(p.age_seconds.map(age)),
                        dash(p.disruption.clone()),
                    ]
                })
                .collect();
            table(
                out,
                &[
                    "NAMESPACE",
                    "POD",
                    "NODE",
                    "PHASE",
                    "GPUS",
                    "AGE",
                    "DISRUPTION",
                ],
                &rows,
            );
        }
    }

    /// Appends recent preemptions and evictions, with the work each lost.
    fn render_disruptions(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\nRecent preemptions and evictions ({}):",
            self.recent_disruptions.len()
        );
        if !self.recent_disruptions.is_empty() {
            let rows: Vec<Vec<String>> = self
                .recent_disruptions
                .iter()
                .map(|d| {
                    vec![
                        d.at.strftime("%Y-%m-%d %H:%M:%S").to_string(),
                        d.namespace.clone(),
                        d.name.clone(),
                        dash(d.node.clone()),
                        d.reason.clone(),
                        dash(d.service.clone()),
                        d.gpus.to_string(),
                        dash(d.ran_seconds.map(age)),
                        dash(d.lost_gpu_seconds.map(gpu_hours)),
                    ]
                })
                .collect();
            table(
                out,
                &[
                    "AT (UTC)",
                    "NAMESPACE",
                    "POD",
                    "NODE",
                    "REASON",
                    "TAKEN BY",
                    "GPUS",
                    "RAN",
                    "LOST GPU-H",
                ],
                &rows,
            );
        }
    }

    /// Appends research by namespace.
    fn render_namespaces(&self, out: &mut String) {
        if !self.namespaces.is_empty() {
            let _ = writeln!(out, "\nResearch by namespace (since this replica started):");
            let rows: Vec<Vec<String>> = self
                .namespaces
                .iter()
                .map(|n| {
                    vec![
                        n.namespace.clone(),
                        n.lent_gpus.to_string(),
                        gpu_hours(n.lent_gpu_seconds),
                        n.preemptions.to_string(),
                        gpu_hours(n.lost_gpu_seconds),
                    ]
                })
                .collect();
            table(
                out,
                &[
                    "NAMESPACE",
                    "GPUS NOW",
                    "LENT GPU-H",
                    "PREEMPTED",
                    "LOST GPU-H",
                ],
                &rows,
            );
        }
    }
}

/// GPU-seconds as GPU-hours with one decimal.
fn gpu_hours(seconds: u64) -> String {
    format!("{:.1}", seconds as f64 / 3600.0)
}
