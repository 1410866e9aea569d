//! The bounds on the timings the README's end-to-end table reports. Each is about 3× the slowest
//! figure measured for its step on the shared 2-core machine (debug build, other builds running),
//! or tighter where the step's design fixes most of it; docs/testing.md lists them with their
//! reasons. A step slower than its bound fails its scenario, naming the step, the time and the
//! bound; the scenarios print every figure either way.

use std::time::Duration;

use anyhow::{Result, ensure};

/// The most a step may take.
pub struct Bound {
    /// The step, as the README's table names it.
    pub step: &'static str,
    pub max: Duration,
}

impl Bound {
    /// Fails unless `took` is within the bound.
    pub fn check(&self, took: Duration) -> Result<()> {
        ensure!(
            took <= self.max,
            "{}: took {:.2} s, over its bound of {:.1} s (docs/testing.md, \"Timing bounds\", \
             gives each bound's reason)",
            self.step,
            took.as_secs_f64(),
            self.max.as_secs_f64()
        );
        Ok(())
    }
}

/// Load 10 → 30 waiting requests until the HPA asks for 6 replicas: ≤ 1 s scrape, ≤ 1 s scaler
/// cache, a 1 s KEDA poll, two 2 s HPA syncs (measured 3.2–4.8 s).
pub const RISE_TO_DESIRED: Bound = Bound {
    step: "load rise → HPA desires 6 replicas",
    max: Duration::from_millis(14_400),
};

/// The same rise until all 6 inference pods are bound, research preempted (3.2–5.1 s).
pub const RISE_TO_BOUND: Bound = Bound {
    step: "load rise → all 6 inference pods bound",
    max: Duration::from_millis(15_300),
};

/// Load 30 → 10 until the Deployment is back at 2: one replica per 2 s HPA sync (7.7–9.0 s).
pub const FALL_TO_REPLICAS: Bound = Bound {
    step: "load fall → Deployment back to 2",
    max: Duration::from_secs(27),
};

/// The same fall until the 24 research pods run again on re-marked GPUs (8.1–9.0 s).
pub const FALL_TO_RESEARCH: Bound = Bound {
    step: "load fall → the 24 research pods running again",
    max: Duration::from_secs(27),
};

/// Prometheus killed until KEDA's `Fallback` condition: the scaler's cached answer, then 3
/// failed 1 s polls (2.1–3.1 s).
pub const SOURCE_DOWN_TO_FALLBACK: Bound = Bound {
    step: "Prometheus killed → KEDA Fallback",
    max: Duration::from_millis(9_300),
};

/// Prometheus killed until the Deployment is at `fallback.replicas` (3.1–3.9 s).
pub const SOURCE_DOWN_TO_FALLBACK_REPLICAS: Bound = Bound {
    step: "Prometheus killed → Deployment at fallback.replicas",
    max: Duration::from_millis(11_700),
};

/// KEDA's adapter or nightshift killed until the HPA reports `ScalingActive=False`: its next
/// 2 s sync (1.8–2.1 s).
pub const METRIC_DOWN_TO_HELD: Bound = Bound {
    step: "KEDA adapter or nightshift killed → HPA ScalingActive=False",
    max: Duration::from_millis(6_300),
};

/// `external-push`: load at a service scaled to zero until its first replica: the 1 s stream
/// interval, ≤ 1 s scrape and ≤ 1 s cache (1.8 s).
pub const PUSH_TO_FIRST_REPLICA: Bound = Bound {
    step: "external-push: load at a service at zero → first replica",
    max: Duration::from_millis(5_500),
};

/// Leader killed until the standby leads, with a 6 s Lease checked every 0.8 s (2/15 of it).
/// The standby starts counting when it first sees the dead leader's last renewal, at most one
/// check after it, and takes over at the first check a whole Lease later: at most the Lease
/// plus two checks (7.6 s), plus 1 s for round trips and the gauge's polling on a loaded
/// machine. Tighter than 3× the measured 6.4–6.8 s, which the Lease itself mostly makes.
pub const LEADER_KILLED_TO_STANDBY: Bound = Bound {
    step: "leader killed → standby holds the Lease",
    max: Duration::from_millis(8_600),
};

/// Load near the next replica until the pod the scheduler will preempt is warned: the 5 s
/// notice pass after the demand moved (3.4–4.2 s).
pub const NEAR_REPLICA_TO_NOTICE: Bound = Bound {
    step: "load near the next replica → the victim warned",
    max: Duration::from_millis(12_600),
};
