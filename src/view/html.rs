//! The researchers' view as HTML: [`render`], a server-rendered page of a [`View`] with inline
//! SVG charts and no script.
//!
//! It owns how the page looks: layout, style, colours, charts, escaping. It must not compute
//! figures (they come whole in the [`View`], from [`super::model`]). Pure: no I/O, no clock.

use std::fmt::Write as _;

use jiff::Timestamp;

use super::model::{DAY, HistoryOrigin, Use, View, WEEK};
use super::services::Point;
use crate::pool::{history::Sample, marks::Verdict, status::age};

/// Colours of the uses, the same in every chart and bar: blue inference, green research, orange
/// headroom, light grey free (colour-blind-safe Tableau hues).
const COLOURS: [(&str, &str); 4] = [
    ("inference", "#4e79a7"),
    ("research", "#59a14f"),
    ("headroom", "#f28e2b"),
    ("free", "#d9d9d9"),
];

const STYLE: &str = "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;\
color:#1f2328;background:#fff;margin:0 auto;max-width:1100px;padding:16px 24px}\
h1{font-size:22px;margin:8px 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}\
.meta{color:#57606a}.cards{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0}\
.card{border:1px solid #d0d7de;border-radius:6px;padding:8px 14px;min-width:120px}\
.card b{display:block;font-size:24px}.sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px}\
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:4px 10px;border-bottom:1px solid #eaeef2}\
th{background:#f6f8fa;font-weight:600}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}\
.note{background:#fff8c5;border:1px solid #d4a72c66;border-radius:6px;padding:6px 10px;margin:10px 0}\
.open{color:#1a7f37;font-weight:600}.closed{color:#cf222e;font-weight:600}\
form{margin:10px 0}input{font:inherit;padding:3px 6px}button{font:inherit;padding:3px 10px}\
svg text{font:11px system-ui,sans-serif;fill:#57606a}a{color:#0969da}";

/// Escapes text for HTML bodies and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// Percent-encodes a namespace for a query string (namespaces are DNS labels, but the filter
/// echoes whatever was asked).
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn uses(u: &Use) -> [u64; 4] {
    [u.inference, u.research, u.headroom, u.free]
}

fn when(t: Timestamp) -> String {
    t.strftime("%Y-%m-%d %H:%M UTC").to_string()
}

/// A horizontal bar of `u`, drawn `width` units wide and shown `shown` wide (CSS: `160` or
/// `100%`).
fn bar(out: &mut String, u: &Use, width: f64, height: u32, shown: &str) {
    let total = u.total().max(1) as f64;
    let _ = write!(
        out,
        "<svg width=\"{shown}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" \
         preserveAspectRatio=\"none\" role=\"img\" aria-label=\"{} inference, {} research, {} \
         headroom, {} free\">",
        u.inference, u.research, u.headroom, u.free
    );
    let mut x = 0.0;
    for ((_, colour), v) in COLOURS.iter().zip(uses(u)) {
        let w = v as f64 / total * width;
        if w > 0.0 {
            let _ = write!(
                out,
                "<rect x=\"{x:.1}\" width=\"{w:.1}\" height=\"{height}\" fill=\"{colour}\"/>"
            );
        }
        x += w;
    }
    out.push_str("</svg>");
}

/// A stacked area chart of `points` over `[to - span, to]`, x labels every `tick` seconds.
fn chart(out: &mut String, title: &str, points: &[Sample], to: i64, span: i64, tick: i64) {
    const W: f64 = 1000.0;
    const H: f64 = 200.0;
    const LEFT: f64 = 40.0;
    const BOTTOM: f64 = 20.0;
    let from = to - span;
    let top = points.iter().map(|p| p.total()).max().unwrap_or(0).max(1) as f64;
    let plot_w = W - LEFT - 10.0;
    let plot_h = H - BOTTOM - 10.0;
    let x = |at: i64| LEFT + (at - from) as f64 / span as f64 * plot_w;
    let y = |v: f64| 10.0 + plot_h - v / top * plot_h;
    let _ = write!(
        out,
        "<svg viewBox=\"0 0 {W} {H}\" width=\"100%\" role=\"img\" aria-label=\"{}\">",
        esc(title)
    );
    for frac in [0.0, 0.5, 1.0] {
        let v = top * frac;
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#eaeef2\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>",
            W - 10.0,
            LEFT - 4.0,
            y(v) + 4.0,
            yy = y(v),
        );
    }
    let mut t = from;
    while t <= to {
        let ago = to - t;
        let label = if ago == 0 {
            "now".to_string()
        } else if tick >= DAY {
            format!("-{}d", ago / DAY)
        } else {
            format!("-{}h", ago / 3600)
        };
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{label}</text>",
            x(t),
            H - 4.0
        );
        t += tick;
    }
    if points.is_empty() {
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">no samples yet</text>",
            LEFT + plot_w / 2.0,
            H / 2.0
        );
    }
    // Layers bottom up; each is the band between the running sum before and after it.
    let mut below = vec![0.0_f64; points.len()];
    for (i, (_, colour)) in COLOURS.iter().enumerate() {
        if points.is_empty() {
            break;
        }
        let above: Vec<f64> = points
            .iter()
            .zip(&below)
            .map(|(p, b)| b + [p.inference, p.research, p.headroom, p.free][i] as f64)
            .collect();
        let _ = write!(out, "<path fill=\"{colour}\" d=\"M");
        for (p, v) in points.iter().zip(&above) {
            let _ = write!(out, "{:.1},{:.1} ", x(p.at), y(*v));
        }
        for (p, v) in points.iter().zip(&below).rev() {
            let _ = write!(out, "{:.1},{:.1} ", x(p.at), y(*v));
        }
        out.push_str("Z\"/>");
        below = above;
    }
    out.push_str("</svg>");
}

/// The page.
pub fn render(view: &View) -> String {
    let mut out = String::with_capacity(64 * 1024 + view.nodes.len() * 400);
    header(&mut out, view);
    pool_now(&mut out, view);
    namespaces(&mut out, view);
    preemptions(&mut out, view);
    charts(&mut out, view);
    nodes(&mut out, view);
    out
}

/// Appends the document head, the lending state and the namespace filter.
fn header(out: &mut String, view: &View) {
    let filter = view.namespace.as_deref();
    let title = match filter {
        Some(ns) => format!("GPU pool: research of {}", esc(ns)),
        None => "GPU pool".to_string(),
    };
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <link rel=\"icon\" href=\"data:,\">\
         <title>nightshift: {title}</title><style>{STYLE}</style></head><body>\
         <h1>nightshift: {title}</h1><p class=\"meta\">As of {}. Lending is ",
        when(view.generated_at)
    );
    let p = &view.pool;
    if p.lending_open {
        out.push_str("<span class=\"open\">open</span>");
    } else {
        out.push_str("<span class=\"closed\">closed</span>");
    }
    let _ = write!(
        out,
        " (windows: {}); {} GPUs kept free for inference bursts. \
         <a href=\"api/view{}\">JSON</a></p>",
        esc(&p.lending_windows),
        p.headroom_target,
        filter.map_or_else(String::new, |ns| format!("?namespace={}", query_escape(ns)))
    );
    let _ = write!(
        out,
        "<form method=\"get\" action=\"\"><label>Namespace <input name=\"namespace\" value=\"{}\" \
         placeholder=\"all\"></label> <button type=\"submit\">Filter</button>{}</form>",
        esc(filter.unwrap_or("")),
        if filter.is_some() {
            " <a href=\"?\">all namespaces</a>"
        } else {
            ""
        }
    );
    if !view.synced {
        out.push_str(
            "<p class=\"note\">The controller is still reading the cluster: figures may be \
             incomplete.</p>",
        );
    }
}

/// Appends the pool now: cards and the bar of GPUs by use.
fn pool_now(out: &mut String, view: &View) {
    let p = &view.pool;
    out.push_str("<h2>The pool now</h2><div class=\"cards\">");
    let _ = write!(
        out,
        "<div class=\"card\" id=\"nodes\">Nodes<b>{}</b>{} spare</div>",
        p.nodes, p.spare_nodes
    );
    for ((name, colour), v) in COLOURS.iter().zip(uses(&p.gpus)) {
        let _ = write!(
            out,
            "<div class=\"card\" id=\"gpus-{name}\"><span class=\"sw\" style=\"background:{colour}\"></span>{} GPUs<b>{v}</b></div>",
            capitalised(name)
        );
    }
    let _ = write!(out, "</div><p>{} GPUs in all.</p>", p.gpus.total());
    bar(out, &p.gpus, 1000.0, 18, "100%");
}

/// Appends research by namespace.
fn namespaces(out: &mut String, view: &View) {
    out.push_str("<h2>Research by namespace</h2>");
    if view.namespaces.is_empty() {
        out.push_str("<p>No research seen since nightshift started.</p>");
    } else {
        out.push_str(
            "<table id=\"namespaces\"><tr><th>Namespace</th><th class=\"n\">GPUs now</th>\
             <th class=\"n\">Pods waiting</th><th class=\"n\">GPU-hours lent</th>\
             <th class=\"n\">Preemptions</th><th class=\"n\">GPU-hours lost</th>\
             <th class=\"n\">Under reclaim notice</th></tr>",
        );
        for n in &view.namespaces {
            let _ = write!(
                out,
                "<tr><td><a href=\"?namespace={}\">{}</a></td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{:.1}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{:.1}</td><td class=\"n\">{}</td></tr>",
                query_escape(&n.namespace),
                esc(&n.namespace),
                n.gpus_now,
                n.waiting_pods,
                n.gpu_hours_lent,
                n.preemptions,
                n.gpu_hours_lost,
                n.under_notice
            );
        }
        out.push_str("</table>");
    }
    out.push_str(
        "<p class=\"meta\">Counted since this nightshift replica started. Work lost is \
         GPUs × time since the pod's last checkpoint (annotation \
         <code>nightshift.io/checkpointed-at</code>) or its start. A pod under reclaim notice \
         is about to be preempted for inference: it should checkpoint now \
         (<code>nightshift.io/reclaim-notice</code>).</p>",
    );
}

/// Appends the recent preemptions.
fn preemptions(out: &mut String, view: &View) {
    out.push_str("<h2>Recent preemptions</h2>");
    if view.preemptions.is_empty() {
        out.push_str("<p>None since nightshift started.</p>");
    } else {
        out.push_str(
            "<table id=\"preemptions\"><tr><th>When (UTC)</th><th>Namespace</th><th>Pod</th>\
             <th>Node</th><th>Reason</th><th>Taken by</th><th class=\"n\">GPUs</th>\
             <th class=\"n\">Had run</th><th class=\"n\">GPU-hours lost</th>\
             <th class=\"n\">Warned before</th></tr>",
        );
        for d in &view.preemptions {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td></tr>",
                d.at.strftime("%Y-%m-%d %H:%M:%S"),
                esc(&d.namespace),
                esc(&d.pod),
                esc(d.node.as_deref().unwrap_or("-")),
                esc(&d.reason),
                esc(d.service.as_deref().unwrap_or("-")),
                d.gpus,
                d.ran_seconds.map_or_else(|| "-".to_string(), age),
                d.gpu_hours_lost
                    .map_or_else(|| "-".to_string(), |h| format!("{h:.1}")),
                d.warned_seconds
                    .map_or_else(|| "no notice".to_string(), age)
            );
        }
        out.push_str("</table>");
    }
}

/// Appends GPUs by use over the last day and week.
fn charts(out: &mut String, view: &View) {
    out.push_str("<h2>GPUs by use over time</h2><p>");
    for (name, colour) in COLOURS {
        let _ = write!(
            out,
            "<span class=\"sw\" style=\"background:{colour}\"></span>{name} &nbsp; "
        );
    }
    out.push_str("</p>");
    let c = &view.charts;
    let _ = write!(
        out,
        "<p class=\"note\" id=\"history-origin\">{} History is kept in memory (one sample a \
         minute, at most a week: {} KiB for the pool); {}.</p>",
        origin(&c.origin),
        c.max_bytes / 1024,
        match c.since {
            Some(t) => format!("it holds {} samples since {}", c.samples, when(t)),
            None => "no sample yet".to_string(),
        }
    );
    let to = view.generated_at.as_second();
    out.push_str("<h3>Last 24 hours</h3>");
    chart(out, "GPUs by use, last 24 hours", &c.day, to, DAY, 6 * 3600);
    out.push_str("<h3>Last 7 days</h3>");
    chart(out, "GPUs by use, last 7 days", &c.week, to, WEEK, DAY);
    service_charts(out, view);
}

/// Says where the history comes from.
fn origin(o: &HistoryOrigin) -> String {
    match o {
        HistoryOrigin::SinceStart {
            at,
            rebuild_failed: None,
        } => format!("History since restart at {}.", when(*at)),
        HistoryOrigin::SinceStart {
            at,
            rebuild_failed: Some(e),
        } => format!(
            "History since restart at {}: rebuilding the earlier history from Prometheus failed \
             ({}).",
            when(*at),
            esc(e)
        ),
        HistoryOrigin::Rebuilding { at, prometheus } => format!(
            "History since restart at {}; the earlier history is being read from Prometheus \
             ({}).",
            when(*at),
            esc(prometheus)
        ),
        HistoryOrigin::Prometheus {
            at,
            prometheus,
            samples,
        } => format!(
            "History rebuilt from Prometheus ({}) at {}: {samples} samples of the last week, then \
             sampled here.",
            esc(prometheus),
            when(*at)
        ),
    }
}

/// Colours of demand (Tableau purple) and replicas (the inference blue).
const DEMAND: &str = "#b07aa1";
const REPLICAS: &str = "#4e79a7";

/// Appends demand against replicas per inference service, a small chart each.
fn service_charts(out: &mut String, view: &View) {
    let c = &view.charts;
    let _ = write!(
        out,
        "<h2>Inference services: demand and replicas</h2><p><span class=\"sw\" \
         style=\"background:{DEMAND}\"></span>demand (replicas the scaler asks for) &nbsp; \
         <span class=\"sw\" style=\"background:{REPLICAS}\"></span>replicas serving (pods \
         that reported metrics). When demand falls below the replicas, inference scales down \
         and its GPUs can be lent. Last 7 days, hourly means (at most {} KiB in memory).</p>",
        c.services_max_bytes / 1024
    );
    if c.services.is_empty() {
        out.push_str(
            "<p id=\"services-none\">No scaler decision yet: demand comes from the scaler \
             running in this process (<code>nightshift run</code>), or from Prometheus after a \
             restart.</p>",
        );
        return;
    }
    let to = view.generated_at.as_second();
    for s in &c.services {
        let id = format!("{}/{}", s.namespace, s.name);
        let _ = write!(
            out,
            "<figure class=\"service\" data-service=\"{}\" style=\"margin:8px 0\"><figcaption><b>{}</b>",
            esc(&id),
            esc(&id)
        );
        if let Some(p) = s.latest {
            let _ = write!(
                out,
                ": demand <span class=\"demand\">{:.1}</span>, replicas <span \
                 class=\"replicas\">{:.1}</span> (last 5 minutes)",
                p.demand, p.replicas
            );
        }
        out.push_str("</figcaption>");
        service_chart(out, &id, &s.week, to);
        out.push_str("</figure>");
    }
}

/// Demand and replicas of one service over `[to - WEEK, to]` as two lines, in whole viewBox
/// units (exact enough at this size, and quick to write).
fn service_chart(out: &mut String, id: &str, points: &[Point], to: i64) {
    const W: i64 = 1000;
    const H: i64 = 90;
    const LEFT: i64 = 40;
    const BOTTOM: i64 = 16;
    let from = to - WEEK;
    let top = points
        .iter()
        .map(|p| p.demand.max(p.replicas))
        .fold(1.0_f32, f32::max)
        .ceil() as f64;
    let plot_w = (W - LEFT - 10) as f64;
    let plot_h = (H - BOTTOM - 6) as f64;
    let x = |at: i64| LEFT + ((at - from) as f64 / WEEK as f64 * plot_w) as i64;
    let y = |v: f32| 6 + (plot_h - f64::from(v) / top * plot_h) as i64;
    let _ = write!(
        out,
        "<svg viewBox=\"0 0 {W} {H}\" width=\"100%\" role=\"img\" aria-label=\"demand and \
         replicas of {}, last 7 days\"><line x1=\"{LEFT}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" \
         stroke=\"#eaeef2\"/><text x=\"{}\" y=\"10\" text-anchor=\"end\">{top:.0}</text>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>",
        esc(id),
        W - 10,
        y(0.0),
        y(0.0),
        LEFT - 4,
        LEFT - 4,
        y(0.0) + 4
    );
    for d in (0..=7).rev() {
        let label = if d == 0 {
            "now".to_string()
        } else {
            format!("-{d}d")
        };
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{label}</text>",
            x(to - d * DAY),
            H - 3
        );
    }
    for (colour, value) in [
        (REPLICAS, (|p: &Point| p.replicas) as fn(&Point) -> f32),
        (DEMAND, |p: &Point| p.demand),
    ] {
        if points.is_empty() {
            break;
        }
        let _ = write!(
            out,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\""
        );
        for p in points {
            let _ = write!(out, "{},{} ", x(p.at), y(value(p)));
        }
        out.push_str("\"/>");
    }
    out.push_str("</svg>");
}

/// Appends one row per node, and the page end.
fn nodes(out: &mut String, view: &View) {
    out.push_str(
        "<h2>Nodes</h2><table id=\"nodes-table\"><tr><th>Node</th><th>State</th>\
         <th class=\"n\">Inference</th><th class=\"n\">Research</th><th class=\"n\">Headroom</th>\
         <th class=\"n\">Free</th><th>Use</th></tr>",
    );
    for n in &view.nodes {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td>",
            esc(&n.name),
            state(n.state),
            n.gpus.inference,
            n.gpus.research,
            n.gpus.headroom,
            n.gpus.free
        );
        bar(out, &n.gpus, 160.0, 12, "160");
        out.push_str("</td></tr>");
    }
    out.push_str(
        "</table><p class=\"meta\">Research jobs get spare GPUs when their namespace is labelled \
         <code>nightshift.io/research=true</code>: see docs/researchers.md.</p></body></html>",
    );
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

fn state(v: Verdict) -> &'static str {
    match v {
        Verdict::Spare => "spare",
        Verdict::Headroom => "headroom",
        Verdict::Full => "full",
        Verdict::Cordoned => "cordoned",
        Verdict::NotReady => "not ready",
        Verdict::Untrusted => "unreadable",
        Verdict::WindowClosed => "window closed",
        Verdict::Reclaiming => "reclaiming",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::history::History;
    use crate::view::model::{
        Timeline, build,
        tests::{now, report, view_of},
    };
    use crate::view::services::{self, Services};

    #[test]
    fn the_namespace_filter_keeps_the_pool_and_narrows_research() {
        let v = view_of(&report(), &History::new(), Some("team-b"));
        assert_eq!(v.pool.gpus.total(), 16);
        assert_eq!(v.namespaces.len(), 1);
        assert_eq!(v.namespaces[0].namespace, "team-b");
        assert!(v.preemptions.is_empty());
        let html = render(&v);
        assert!(html.contains("research of team-b"), "{html}");
        assert!(html.contains("None since nightshift started"));
        assert!(html.contains("href=\"api/view?namespace=team-b\""));
    }

    #[test]
    fn the_page_shows_the_figures_and_escapes_names() {
        let mut r = report();
        r.namespaces[0].namespace = "<b>x</b>".into();
        let v = view_of(&r, &History::new(), None);
        let html = render(&v);
        assert!(html.contains("&lt;b&gt;x&lt;/b&gt;"));
        assert!(!html.contains("<b>x</b>"));
        assert!(html.contains("?namespace=%3Cb%3Ex%3C%2Fb%3E"));
        assert!(html.contains("id=\"gpus-research\""));
        assert!(html.contains("Research GPUs<b>5</b>"), "{html}");
        assert!(html.contains("Headroom GPUs<b>8</b>"));
        assert!(html.contains("sft-0"));
        assert!(html.contains("1h0m"), "ran for an hour");
        assert!(html.contains("no sample yet"));
        assert!(
            html.contains("History since restart at 2033-05-18 03:33 UTC."),
            "{html}"
        );
        assert!(html.contains("id=\"services-none\""));
        assert!(!html.contains("<script"), "the page has no script");
    }

    #[test]
    fn charts_draw_one_band_per_use_over_the_samples() {
        let mut h = History::new();
        // The last three hours, a sample a minute, the last one now.
        let start = now().as_second() - 3 * 3600 + 60;
        for i in 0..180 {
            h.record(Sample {
                at: start + i * 60,
                inference: 2,
                research: 5,
                free: 1,
                headroom: 8,
            });
        }
        let v = view_of(&report(), &h, None);
        assert_eq!(v.charts.samples, 180);
        assert_eq!(v.charts.day.len(), 36, "3 h of 5-minute points");
        assert_eq!(v.charts.week.len(), 3, "3 hourly points");
        let html = render(&v);
        for (_, colour) in COLOURS {
            assert_eq!(
                html.matches(&format!("<path fill=\"{colour}\"")).count(),
                2,
                "{colour} in both charts"
            );
        }
        assert!(html.contains("holds 180 samples since"));
        assert!(html.contains(">-24h<") && html.contains(">-7d<") && html.contains(">now<"));
    }

    #[test]
    fn each_inference_service_gets_demand_and_replicas_over_the_week() {
        let mut services = Services::new();
        let key = services::ServiceKey {
            namespace: "inference".into(),
            name: "llama".into(),
        };
        // Three hours from the first 5-minute step after now - 3 h (now is 200 s into a step).
        let start = now().as_second() - 3 * 3600 + 100;
        for m in 0..180 {
            services.record(&key, start + m * 60, if m < 120 { 4.0 } else { 1.5 }, 3.0);
        }
        let origin = HistoryOrigin::Prometheus {
            at: now(),
            prometheus: "http://prometheus:9090".into(),
            samples: 42,
        };
        let timeline = Timeline {
            pool: &History::new(),
            services: &services,
            origin: &origin,
        };
        let v = build(&report(), timeline, Some("team-a"));
        assert_eq!(v.charts.services.len(), 1, "services stay under a filter");
        let s = &v.charts.services[0];
        assert_eq!(s.week.len(), 3, "three hourly means");
        assert_eq!((s.week[0].demand, s.week[2].demand), (4.0, 1.5));
        let latest = s.latest.expect("latest");
        assert_eq!((latest.demand, latest.replicas), (1.5, 3.0));
        let html = render(&v);
        assert!(html.contains("data-service=\"inference/llama\""), "{html}");
        assert!(html.contains(
            "demand <span class=\"demand\">1.5</span>, replicas <span class=\"replicas\">3.0</span>"
        ));
        assert_eq!(html.matches("<polyline").count(), 2, "demand and replicas");
        assert!(html.contains("History rebuilt from Prometheus (http://prometheus:9090)"));
        let failed = HistoryOrigin::SinceStart {
            at: now(),
            rebuild_failed: Some("timed out <30s>".into()),
        };
        assert!(origin_text(&failed).contains(
            "rebuilding the earlier history from Prometheus failed (timed out &lt;30s&gt;)"
        ));
    }

    fn origin_text(o: &HistoryOrigin) -> String {
        origin(o)
    }
}
