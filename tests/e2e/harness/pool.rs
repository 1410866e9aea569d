//! The GPU pool as nightshift's pool controller keeps it: the spare marks on the nodes, its
//! `/status` accounting and whether it leads.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use serde_json::Value;

use crate::harness::binary::{self, Nightshift};
use crate::harness::cluster::{Cluster, GPU_NODES};
use crate::harness::wait::{self, Check};

/// Deadline of a convergence: far above the seconds it takes, for a loaded 2-core machine.
const STEP: Duration = Duration::from_secs(90);

/// Waits until `/status` counts `lent` GPUs lent, is synced and leads, and every pool node's
/// spare labels agree with the accounting `/status` shows for it.
pub async fn converged(c: &Cluster, ns: &Nightshift, lent: u32, phase: &str) -> Result<()> {
    let admin = ns.admin_api();
    wait::until(
        &format!("marks and /status to converge {phase}"),
        STEP,
        || {
            let admin = admin.clone();
            async move {
                let status: Value = serde_json::from_str(&admin.get("/status").await?)?;
                let labels = binary::spare_marks(c).await?;
                let mut disagree = Vec::new();
                for node in status["nodes"].as_array().into_iter().flatten() {
                    let name = node["name"].as_str().unwrap_or_default();
                    let expected = node["spare_gpus"].as_u64().map(|g| g.to_string());
                    let labelled = labels.get(name).cloned().flatten();
                    if expected != labelled {
                        disagree.push(format!("{name}: label {labelled:?}, status {expected:?}"));
                    }
                }
                let ok = status["synced"] == true
                    && status["leader"] != false
                    && status["totals"]["lent"].as_u64() == Some(u64::from(lent))
                    && status["nodes"].as_array().map_or(0, Vec::len) == GPU_NODES as usize
                    && disagree.is_empty();
                Ok(if ok {
                    Check::Done(())
                } else {
                    Check::Pending(format!(
                        "synced {}, leader {}, lent {}, disagreeing marks {disagree:?}",
                        status["synced"], status["leader"], status["totals"]["lent"]
                    ))
                })
            }
        },
    )
    .await
}

/// How many pool nodes carry the spare mark.
pub async fn marked_nodes(c: &Cluster) -> Result<usize> {
    Ok(binary::spare_marks(c)
        .await?
        .values()
        .filter(|v| v.is_some())
        .count())
}

/// Waits until `n` pool nodes carry the spare mark, `ns` still running.
pub async fn wait_marked_nodes(
    c: &Cluster,
    ns: &mut Nightshift,
    n: usize,
    timeout: Duration,
) -> Result<()> {
    wait::until(&format!("{n} nodes marked spare"), timeout, || {
        let running = ns.check_running();
        async move {
            running?;
            let marked = marked_nodes(c).await?;
            Ok(if marked == n {
                Check::Done(())
            } else {
                Check::Pending(format!("{marked} marked"))
            })
        }
    })
    .await
}

/// Waits until `nightshift_pool_leader` of `ns` is `value` (1 leading, 0 standing by).
pub async fn wait_leader(
    c: &Cluster,
    ns: &mut Nightshift,
    value: f64,
    timeout: Duration,
) -> Result<()> {
    let admin = ns.admin_api();
    wait::until(&format!("nightshift_pool_leader {value}"), timeout, || {
        let running = ns.check_running().and(c.check_processes());
        let admin = admin.clone();
        async move {
            running?;
            let v = admin.metric("nightshift_pool_leader").await?;
            Ok(if v == value {
                Check::Done(())
            } else {
                Check::Pending(format!("{v}"))
            })
        }
    })
    .await
}

/// Waits until the spare marks of the pool nodes satisfy `ok`; returns them.
pub async fn wait_marks(
    c: &Cluster,
    what: &str,
    ok: impl Fn(&BTreeMap<String, Option<String>>) -> bool,
) -> Result<BTreeMap<String, Option<String>>> {
    wait_marks_within(c, what, STEP, ok).await
}

pub async fn wait_marks_within(
    c: &Cluster,
    what: &str,
    timeout: Duration,
    ok: impl Fn(&BTreeMap<String, Option<String>>) -> bool,
) -> Result<BTreeMap<String, Option<String>>> {
    let ok = &ok;
    wait::until(what, timeout, || async {
        c.check_processes()?;
        let m = binary::spare_marks(c).await?;
        Ok(if ok(&m) {
            Check::Done(m)
        } else {
            Check::Pending(format!("{m:?}"))
        })
    })
    .await
}
