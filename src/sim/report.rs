//! Presents simulation results: a table for people, JSON for machines, an SVG chart of GPUs by
//! use over time. Pure formatting; no simulation logic.

use std::fmt::Write as _;

use serde::Serialize;

use super::engine::{MinutePoint, RunSummary};
use super::hindsight::Hindsight;
use super::policy::ScalingPolicy;
use super::slo;

/// The whole comparison.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub model: String,
    pub days: f64,
    pub seed: u64,
    pub pool_gpus: u32,
    pub pool_gpu_hours: f64,
    /// GPU-hours an oracle that sizes inference to each minute's work (at full utilisation)
    /// would leave idle: the most any policy could lend.
    pub ideal_idle_gpu_hours: f64,
    /// GPU-hours the honest ceiling leaves idle: the fewest replicas the fleet model needs per
    /// minute within the SLO, started ahead of the minute they serve ([`super::ceiling`]). Its
    /// schedule's replay is the policy row `ceilingReplay`.
    pub ceiling_idle_gpu_hours: f64,
    pub slo_queue_wait_p99_s: f64,
    /// The share of minutes within the SLO a policy must keep on this trace: static peak's, less
    /// half a point ([`super::slo::bar`]).
    pub slo_bar_share: f64,
    /// The night window chosen with hindsight (when asked for); its run is the policy row
    /// `nightWindowHindsight`.
    pub hindsight: Option<Hindsight>,
    pub trace_requests: usize,
    /// The services sharing the pool, by name (one unnamed service when the scenario names
    /// none).
    pub services: Vec<String>,
    pub policies: Vec<RunSummary>,
    #[serde(skip)]
    pub timelines: Vec<Vec<MinutePoint>>,
}

/// The table printed on stdout.
pub fn table(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:.1} days, {} GPUs ({:.0} GPU-h), {}; SLO: p99 queue wait ≤ {} s per minute; bar: ≥ {:.2} % of minutes within it (static peak's share less 0.5 point)",
        r.days,
        r.pool_gpus,
        r.pool_gpu_hours,
        r.model,
        r.slo_queue_wait_p99_s,
        r.slo_bar_share * 100.0
    );
    let _ = writeln!(
        out,
        "idle at most: {:.0} GPU-h (honest ceiling: the fleet model's fewest replicas per minute, started ahead); {:.0} GPU-h (token-price oracle)",
        r.ceiling_idle_gpu_hours, r.ideal_idle_gpu_hours
    );
    let _ = writeln!(
        out,
        "{:<30} {:>11} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "policy",
        "useful GPUh",
        "lent GPUh",
        "lost GPUh",
        "preempt",
        "ceiling",
        "oracle",
        "wait p50",
        "wait p99",
        "TTFT p50",
        "TTFT p99",
        "SLO min",
        "min over",
        "scaling",
        "unserved"
    );
    for p in &r.policies {
        let _ = writeln!(
            out,
            "{:<30} {:>11.0} {:>9.0} {:>9.1} {:>8} {:>7.1}% {:>7.1}% {:>8.3}s {:>8.3}s {:>8.3}s {:>8.3}s {:>8.2}% {:>9} {:>8} {:>8}",
            p.label,
            p.useful_gpu_hours,
            p.lent_gpu_hours,
            p.lost_gpu_hours,
            p.preemptions,
            p.ceiling_share * 100.0,
            p.harvest_share * 100.0,
            p.queue_wait_p50_s,
            p.queue_wait_p99_s,
            p.ttft_p50_s,
            p.ttft_p99_s,
            p.minutes_within_slo_share * 100.0,
            p.minutes_over_slo,
            p.scale_events,
            p.unserved
        );
    }
    out.push_str(&service_lines(r));
    out.push_str(&bar_lines(r));
    out.push_str(&notice_lines(r));
    out.push_str(&predictor(r));
    out
}

/// For each policy: whether it meets the SLO bar, and its useful GPU-hours against the night
/// window chosen with hindsight's (when there is one).
fn bar_lines(r: &Report) -> String {
    let mut out = String::new();
    let window = r.hindsight.as_ref().and_then(|h| {
        r.policies
            .iter()
            .find(|p| p.policy == ScalingPolicy::NightWindowHindsight)
            .map(|p| (h, p.useful_gpu_hours))
    });
    match window {
        Some((h, useful)) => {
            let _ = writeln!(
                out,
                "against the bar (≥ {:.2} % of minutes) and the night window chosen with hindsight ({:02}:00–{:02}:00 at {}{}; {:.0} useful GPU-h; {} runs searched):",
                r.slo_bar_share * 100.0,
                h.start_hour,
                h.end_hour,
                if r.services.len() > 1 {
                    format!(
                        "{}/{} of each service's peak replicas, rounded up",
                        h.night_replicas, h.day_replicas
                    )
                } else {
                    format!("{} replicas, {} by day", h.night_replicas, h.day_replicas)
                },
                if h.meets_bar {
                    ""
                } else {
                    "; no window meets the bar, this one keeps the most minutes"
                },
                useful,
                h.runs
            );
        }
        None => {
            let _ = writeln!(
                out,
                "against the bar (≥ {:.2} % of minutes; `--hindsight` adds the night window chosen with hindsight):",
                r.slo_bar_share * 100.0
            );
        }
    }
    for p in &r.policies {
        let verdict = if slo::meets(p.minutes_within_slo_share, r.slo_bar_share) {
            "meets the bar "
        } else {
            "misses the bar"
        };
        let against = match window {
            Some((_, w)) if w > 0.0 => format!(
                "; {:+.1} % against the hindsight window",
                (p.useful_gpu_hours / w - 1.0) * 100.0
            ),
            _ => String::new(),
        };
        let churn = match p.preemptions_per_lent_gpu_day {
            Some(rate) => format!("; {rate:.2} preemptions per lent GPU-day"),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "  {:<30} {verdict}  {:>6.0} useful GPU-h{against}{churn}",
            p.label, p.useful_gpu_hours
        );
    }
    out
}

/// With a pool shared by several services: each policy's figures per service (its SLO
/// minutes are those of the service that kept the fewest).
fn service_lines(r: &Report) -> String {
    let mut out = String::new();
    if r.services.len() < 2 {
        return out;
    }
    let _ = writeln!(
        out,
        "per service (SLO minutes, queue wait p99, inference GPU-h):"
    );
    for p in &r.policies {
        let each: Vec<String> = p
            .services
            .iter()
            .map(|s| {
                format!(
                    "{} {:.2} % {:.3}s {:.0}",
                    s.name,
                    s.minutes_within_slo_share * 100.0,
                    s.queue_wait_p99_s,
                    s.inference_gpu_hours
                )
            })
            .collect();
        let _ = writeln!(out, "  {:<30} {}", p.label, each.join(" · "));
    }
    out
}

/// What reclaim notices did, against the same scaling without them.
fn notice_lines(r: &Report) -> String {
    let mut out = String::new();
    let find = |policy| r.policies.iter().find(|p| p.policy == policy);
    let (Some(plain), Some(noticed)) = (
        find(ScalingPolicy::NightshiftWithoutNotices),
        find(ScalingPolicy::Nightshift),
    ) else {
        return out;
    };
    let change = |before: f64, after: f64| {
        if before <= 0.0 {
            return "n/a".to_string();
        }
        let pct = (after / before - 1.0) * 100.0;
        let word = if pct <= 0.0 { "less" } else { "more" };
        format!("{:.0} % {word}", pct.abs())
    };
    let _ = writeln!(
        out,
        "reclaim notice: lent {:.0} → {:.0} GPU-h ({}); lost {:.1} → {:.1} GPU-h ({}; {:.1} GPU-h \
         of it writing notice checkpoints); useful {:.0} → {:.0} GPU-h ({}); preemptions {} → {} \
         ({} of them mid-checkpoint); lead time p50 {:.0} s, p99 {:.0} s; SLO minutes {:.2} % → \
         {:.2} % ({} → {} over)",
        plain.lent_gpu_hours,
        noticed.lent_gpu_hours,
        change(plain.lent_gpu_hours, noticed.lent_gpu_hours),
        plain.lost_gpu_hours,
        noticed.lost_gpu_hours,
        change(plain.lost_gpu_hours, noticed.lost_gpu_hours),
        noticed.notice_checkpoint_gpu_hours,
        plain.useful_gpu_hours,
        noticed.useful_gpu_hours,
        change(plain.useful_gpu_hours, noticed.useful_gpu_hours),
        plain.preemptions,
        noticed.preemptions,
        noticed.preempted_during_checkpoint,
        noticed.notice_lead_p50_s,
        noticed.notice_lead_p99_s,
        plain.minutes_within_slo_share * 100.0,
        noticed.minutes_within_slo_share * 100.0,
        plain.minutes_over_slo,
        noticed.minutes_over_slo,
    );
    out
}

/// The notice predictor against the simulated scheduler, one line per policy that gave
/// notices: of the preemptions, how many were warned first (the prediction named the job the
/// scheduler took) and how many not; of the notices, how many came true, were withdrawn, ended
/// with their job's work done, or were still out when the run ended.
fn predictor(r: &Report) -> String {
    let mut out = String::new();
    for p in r.policies.iter().filter(|p| p.notices > 0) {
        let came_true = p.preempted_after_checkpoint + p.preempted_during_checkpoint;
        let open = p
            .notices
            .saturating_sub(came_true + p.notices_withdrawn + p.notices_completed);
        let _ = writeln!(
            out,
            "notice predictor ({}): {} preemptions: {} warned first, {} unwarned ({} while other \
             jobs held the notices, {} with none out); {} notices: {} came true, {} withdrawn, {} \
             outlived by their job, {} open at the end",
            p.label,
            p.preemptions,
            came_true,
            p.preempted_without_notice,
            p.preempted_in_place_of_warned,
            p.preempted_without_notice
                .saturating_sub(p.preempted_in_place_of_warned),
            p.notices,
            came_true,
            p.notices_withdrawn,
            p.notices_completed,
            open,
        );
    }
    out
}

/// Minutes averaged into one chart point.
const CHART_BUCKET_MIN: usize = 10;

/// An SVG chart: one panel per policy, GPUs held by inference and research over time, with the
/// honest ceiling's inference GPUs as a dashed line.
pub fn svg(r: &Report) -> String {
    const W: f64 = 960.0;
    const LEFT: f64 = 56.0;
    const RIGHT: f64 = 16.0;
    const PANEL_H: f64 = 150.0;
    const GAP: f64 = 42.0;
    const TOP: f64 = 48.0;
    let panels = r.policies.len().max(1);
    let h = TOP + panels as f64 * (PANEL_H + GAP) + 10.0;
    let plot_w = W - LEFT - RIGHT;
    let gpus = f64::from(r.pool_gpus.max(1));
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="20" font-size="15" font-weight="bold">GPUs by use over {:.0} days ({} GPUs)</text>"#,
        r.days, r.pool_gpus
    );
    let legend = [
        ("#4e79a7", "inference"),
        ("#59a14f", "research (lent)"),
        ("#eeeeee", "idle"),
    ];
    for (i, (color, name)) in legend.iter().enumerate() {
        let x = LEFT + i as f64 * 150.0;
        let _ = writeln!(
            s,
            r##"<rect x="{x}" y="30" width="12" height="12" fill="{color}" stroke="#999"/><text x="{}" y="40">{name}</text>"##,
            x + 16.0
        );
    }
    let x = LEFT + 3.0 * 150.0;
    let _ = writeln!(
        s,
        r#"<line x1="{x}" y1="36" x2="{}" y2="36" stroke="black" stroke-dasharray="4 3"/><text x="{}" y="40">honest ceiling (inference)</text>"#,
        x + 24.0,
        x + 28.0
    );
    for (pi, (p, timeline)) in r.policies.iter().zip(&r.timelines).enumerate() {
        let y0 = TOP + GAP + pi as f64 * (PANEL_H + GAP);
        let buckets: Vec<MinutePoint> = timeline
            .chunks(CHART_BUCKET_MIN)
            .map(|c| {
                let n = c.len() as f32;
                MinutePoint {
                    inference_gpus: c.iter().map(|m| m.inference_gpus).sum::<f32>() / n,
                    research_gpus: c.iter().map(|m| m.research_gpus).sum::<f32>() / n,
                    ideal_inference_gpus: c.iter().map(|m| m.ideal_inference_gpus).sum::<f32>() / n,
                    ceiling_inference_gpus: c.iter().map(|m| m.ceiling_inference_gpus).sum::<f32>()
                        / n,
                    slo_ok: c.iter().all(|m| m.slo_ok),
                }
            })
            .collect();
        let n = buckets.len().max(1) as f64;
        let xs = |i: usize| LEFT + plot_w * i as f64 / n;
        let ys = |g: f64| y0 + PANEL_H - PANEL_H * (g / gpus).clamp(0.0, 1.0);
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="{}" font-weight="bold">{} — {:.0} useful GPU-h (lent {:.0}, {:.1} % of the honest ceiling), {:.2} % of minutes within SLO</text>"#,
            y0 - 8.0,
            p.label,
            p.useful_gpu_hours,
            p.lent_gpu_hours,
            p.ceiling_share * 100.0,
            p.minutes_within_slo_share * 100.0
        );
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{y0}" width="{plot_w}" height="{PANEL_H}" fill="#eeeeee"/>"##
        );
        // Stacked areas: inference from 0, research on top of it.
        let mut inf = format!("M{:.1},{:.1}", xs(0), ys(0.0));
        let mut res = String::new();
        let mut res_back = Vec::new();
        for (i, b) in buckets.iter().enumerate() {
            let inf_g = f64::from(b.inference_gpus);
            let top = inf_g + f64::from(b.research_gpus);
            for x in [xs(i), xs(i + 1)] {
                let _ = write!(inf, " L{x:.1},{:.1}", ys(inf_g));
                if res.is_empty() {
                    res = format!("M{x:.1},{:.1}", ys(top));
                } else {
                    let _ = write!(res, " L{x:.1},{:.1}", ys(top));
                }
                res_back.push((x, ys(inf_g)));
            }
        }
        let _ = write!(inf, " L{:.1},{:.1} Z", xs(buckets.len()), ys(0.0));
        for (x, y) in res_back.iter().rev() {
            let _ = write!(res, " L{x:.1},{y:.1}");
        }
        res.push_str(" Z");
        let _ = writeln!(s, r##"<path d="{res}" fill="#59a14f"/>"##);
        let _ = writeln!(s, r##"<path d="{inf}" fill="#4e79a7"/>"##);
        let mut ideal = String::new();
        for (i, b) in buckets.iter().enumerate() {
            let y = ys(f64::from(b.ceiling_inference_gpus));
            let cmd = if i == 0 { 'M' } else { 'L' };
            let _ = write!(ideal, "{cmd}{:.1},{y:.1} L{:.1},{y:.1} ", xs(i), xs(i + 1));
        }
        let _ = writeln!(
            s,
            r#"<path d="{ideal}" fill="none" stroke="black" stroke-width="0.8" stroke-dasharray="4 3"/>"#
        );
        // SLO misses as red ticks under the panel.
        for (i, b) in buckets.iter().enumerate() {
            if !b.slo_ok {
                let _ = writeln!(
                    s,
                    r##"<rect x="{:.1}" y="{}" width="{:.1}" height="4" fill="#e15759"/>"##,
                    xs(i),
                    y0 + PANEL_H + 1.0,
                    (xs(i + 1) - xs(i)).max(1.0)
                );
            }
        }
        for g in [0.0, gpus / 2.0, gpus] {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{g:.0}</text>"#,
                LEFT - 6.0,
                ys(g) + 4.0
            );
        }
        let days = r.days.ceil() as usize;
        for d in 0..=days {
            let x = LEFT + plot_w * (d as f64 * 1440.0 / timeline.len().max(1) as f64).min(1.0);
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{}" stroke="#666" stroke-width="0.5"/><text x="{x:.1}" y="{}" text-anchor="middle">day {d}</text>"##,
                y0 + PANEL_H,
                y0 + PANEL_H + 18.0
            );
        }
    }
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="{}" fill="#e15759">red ticks: 10-minute spans with a minute over the SLO</text>"##,
        h - 4.0
    );
    s.push_str("</svg>\n");
    s
}
