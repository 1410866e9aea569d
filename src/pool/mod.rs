//! The GPU pool: spare-GPU accounting, spare marks on nodes, preemption tracking and status.
//!
//! - [`accounting`] (pure): GPUs per pool node, protected / lent / free, as the scheduler counts.
//! - [`marks`] (pure): which nodes are spare given the headroom, and the label patches.
//! - [`windows`] (pure): daily lending windows.
//! - [`controller`] (pure): the state machine between watch events and patches: its state and
//!   report, with a file each for watch events, the reconcile pass, notices and metrics.
//! - [`history`] (pure): GPUs by use over the last week, one sample a minute, for the view.
//! - [`pending`] (pure): why a research pod waits for spare GPUs, and when to say it again.
//! - [`reclaim`] (pure): which research pods to warn before inference takes their GPUs back.
//! - [`owner`] (pure): the Job or Workflow that controls a research pod.
//! - [`notices`] (pure): the Events on research pods, and their digest on the pods' owners.
//! - [`status`] (pure): the `/status` document and the `nightshift status` table.
//! - [`deliver`]: reclaim notices: each service's demand read, the notices written to pods.
//! - [`lease`]: leader election over a Lease, so that one replica writes.
//! - [`run`]: the running controller: election, watches, patches, the `/status` route.
//! - [`report`]: `nightshift status`, a one-shot report from the cluster or a running server.
//!
//! The names the pool reads (labels, the research PriorityClass, the GPU resource) come from
//! [`crate::core::vocabulary`], shared with the webhook. This module owns the pool's options and
//! its one error type, which it maps to HTTP in one place ([`Error::http_status`]).

pub mod accounting;
pub mod controller;
pub mod deliver;
pub mod history;
pub mod lease;
pub mod marks;
pub mod notices;
pub mod owner;
pub mod pending;
pub mod reclaim;
pub mod report;
pub mod run;
pub mod status;
pub mod windows;

use std::time::Duration;

use axum::{Json, http::StatusCode, response::IntoResponse};
use clap::Args;

use crate::core::vocabulary::{POOL_LABEL, SPARE_LABEL, Vocabulary};
use controller::LendingPolicy;
use lease::LeaseError;
use windows::Windows;

/// How spare GPUs are decided (shared by the controller and the `status` command).
#[derive(Clone, Debug, Args)]
pub struct LendingArgs {
    /// GPUs kept free of research work cluster-wide for inference bursts (whole nodes are
    /// reserved first).
    #[arg(
        long = "pool-headroom",
        env = "NIGHTSHIFT_POOL_HEADROOM",
        default_value_t = 0
    )]
    pub headroom: u64,

    /// Daily lending windows, comma-separated `HH:MM-HH:MM@Zone` (e.g.
    /// `20:00-08:00@Asia/Seoul`); outside them no node is marked spare. Empty: always.
    #[arg(long = "pool-lending-windows", env = "NIGHTSHIFT_POOL_LENDING_WINDOWS", default_value = "", value_parser = parse_windows)]
    pub lending_windows: Windows,
}

fn parse_windows(s: &str) -> Result<Windows, String> {
    s.parse().map_err(|e: windows::WindowError| e.to_string())
}

impl LendingArgs {
    /// The controller's policy with the shared names. The pool needs the names that select its
    /// nodes and mark them, which the webhook alone may switch off.
    pub fn policy(&self, vocabulary: Vocabulary) -> Result<LendingPolicy, Error> {
        if vocabulary.pool_label.is_none() {
            return Err(Error::NoPoolLabel);
        }
        if vocabulary.spare_label.is_none() {
            return Err(Error::NoSpareLabel);
        }
        Ok(LendingPolicy {
            vocabulary,
            headroom: self.headroom,
            windows: self.lending_windows.clone(),
        })
    }
}

/// The label selector of the pool's nodes.
pub fn node_selector(vocabulary: &Vocabulary) -> Result<String, Error> {
    vocabulary.pool_selector().ok_or(Error::NoPoolLabel)
}

/// Options of the GPU-pool controller.
#[derive(Clone, Debug, Args)]
pub struct PoolArgs {
    #[command(flatten)]
    pub lending: LendingArgs,

    /// Namespace of the Lease that elects the one replica writing spare marks.
    #[arg(
        long = "pool-lease-namespace",
        env = "NIGHTSHIFT_POOL_LEASE_NAMESPACE",
        default_value = "nightshift-system"
    )]
    pub lease_namespace: String,

    /// Name of that Lease.
    #[arg(
        long = "pool-lease-name",
        env = "NIGHTSHIFT_POOL_LEASE_NAME",
        default_value = "nightshift-pool"
    )]
    pub lease_name: String,

    /// This replica's identity in the Lease (default: `$POD_NAME`, else `$HOSTNAME`).
    #[arg(long = "pool-identity", env = "NIGHTSHIFT_POOL_IDENTITY")]
    pub identity: Option<String>,

    /// How long a silent leader keeps the Lease before a standby takes over (e.g. `15s`).
    #[arg(long = "pool-lease-duration", env = "NIGHTSHIFT_POOL_LEASE_DURATION", default_value = "15s", value_parser = crate::core::duration::parse_duration)]
    pub lease_duration: Duration,

    #[command(flatten)]
    pub notice: NoticeArgs,
}

/// When research pods are warned of a coming reclaim (see docs/research-notice.md). Needs the
/// scaler in the same process: it evaluates each ScaledObject's demand.
#[derive(Clone, Debug, Args)]
pub struct NoticeArgs {
    /// Warn research pods before inference takes their GPUs back.
    #[arg(long = "pool-notices", env = "NIGHTSHIFT_POOL_NOTICES", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,

    /// How close (in replicas) a service's recent demand peak must come to its next replica for
    /// the pods that replica would preempt to be warned.
    #[arg(long = "pool-notice-margin", env = "NIGHTSHIFT_POOL_NOTICE_MARGIN", default_value_t = crate::core::notice::NoticePolicy::default().margin)]
    pub margin: f64,

    /// How much further (in replicas) the peak must fall before a notice is withdrawn.
    #[arg(long = "pool-notice-hysteresis", env = "NIGHTSHIFT_POOL_NOTICE_HYSTERESIS", default_value_t = crate::core::notice::NoticePolicy::default().hysteresis)]
    pub hysteresis: f64,

    /// The window of demand whose peak is watched (e.g. `10m`).
    #[arg(long = "pool-notice-window", env = "NIGHTSHIFT_POOL_NOTICE_WINDOW", default_value = "10m", value_parser = crate::core::duration::parse_duration)]
    pub window: Duration,
}

impl NoticeArgs {
    /// The notice policy, or why the options are unusable.
    pub fn policy(&self) -> Result<crate::core::notice::NoticePolicy, Error> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !ok(self.margin) || !ok(self.hysteresis) {
            return Err(Error::BadNotice);
        }
        Ok(crate::core::notice::NoticePolicy {
            window_s: self.window.as_secs_f64(),
            margin: self.margin,
            hysteresis: self.hysteresis,
        })
    }
}

/// Options of `nightshift status`.
#[derive(Clone, Debug, Args)]
pub struct StatusArgs {
    /// Read the status from a running nightshift's admin server (e.g. `http://localhost:8080`)
    /// instead of computing it from the cluster with the local kubeconfig.
    #[arg(long, env = "NIGHTSHIFT_STATUS_FROM")]
    pub from: Option<String>,

    /// Print the JSON document instead of tables.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub lending: LendingArgs,
}

/// Errors of the GPU pool.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the GPU-pool controller is off: no Kubernetes cluster is configured")]
    Off,
    #[error(
        "the GPU-pool controller finds its nodes by --pool-label, which must not be empty \
         (e.g. {POOL_LABEL})"
    )]
    NoPoolLabel,
    #[error(
        "the GPU-pool controller marks spare nodes with --spare-label, which must not be empty \
         (e.g. {SPARE_LABEL})"
    )]
    NoSpareLabel,
    #[error("cannot connect to Kubernetes (set KUBECONFIG or use --from URL): {0}")]
    Connect(#[source] kube::Error),
    #[error("listing {what} failed: {source}")]
    List {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("patching the spare marks of node {node} failed: {source}")]
    Patch {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("the watch of {0} ended")]
    WatchEnded(&'static str),
    #[error("--pool-notice-margin and --pool-notice-hysteresis must be finite numbers ≥ 0")]
    BadNotice,
    #[error("the checkpoint-call client could not be built: {0}")]
    HookClient(#[source] reqwest::Error),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("fetching {url} failed: {source}")]
    Fetch {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url} answered {status}: {body}")]
    FetchStatus {
        url: String,
        status: u16,
        body: String,
    },
}

impl Error {
    /// The HTTP status this error becomes on the admin port.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Error::Off => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> axum::response::Response {
        let body = serde_json::json!({ "error": self.to_string() });
        (self.http_status(), Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lending() -> LendingArgs {
        LendingArgs {
            headroom: 0,
            lending_windows: Windows::default(),
        }
    }

    #[test]
    fn the_pool_needs_the_names_that_select_and_mark_its_nodes() {
        let names = Vocabulary::default();
        assert!(lending().policy(names.clone()).is_ok());
        assert_eq!(node_selector(&names).expect("selector"), POOL_LABEL);
        let no_pool = Vocabulary {
            pool_label: None,
            ..names.clone()
        };
        assert!(matches!(
            lending().policy(no_pool.clone()),
            Err(Error::NoPoolLabel)
        ));
        assert!(matches!(node_selector(&no_pool), Err(Error::NoPoolLabel)));
        let no_spare = Vocabulary {
            spare_label: None,
            ..names
        };
        assert!(matches!(
            lending().policy(no_spare),
            Err(Error::NoSpareLabel)
        ));
    }
}
