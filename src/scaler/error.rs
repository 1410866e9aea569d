//! The scaler's errors, in two kinds that never mix:
//!
//! - [`Error`]: answering KEDA went wrong; mapped to a gRPC status code here, the only place
//!   where that mapping is made. No error ever becomes a zero: KEDA's `fallback` applies to
//!   errors.
//! - [`StartError`]: the server cannot start or stopped serving (sources, TLS, bind); it ends
//!   the process with a message and is never sent to KEDA.

use std::net::SocketAddr;

use tonic::{Code, Status};

use super::metadata::MetadataError;
use crate::{
    core::demand::DemandError,
    runtime::tls,
    sources::{SourceError, policy::Denied},
};

/// Everything that can go wrong answering KEDA.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The trigger's metadata is invalid.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// The source policy refuses the trigger's source.
    #[error(transparent)]
    Denied(#[from] Denied),
    /// The metric source failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The source answered but had no series for the selection, and `emptyResult` is `error`.
    #[error(
        "{source_name} has no {family} series for {selection}: is the model deployed and its \
         metrics scraped? (set emptyResult: zero if no metrics means no demand)"
    )]
    Empty {
        source_name: String,
        family: &'static str,
        selection: String,
    },
    /// Token rates need two scrapes of a pod; the first answer comes after the second scrape.
    #[error("{source_name}: token rates are not known yet (need two scrapes); retry shortly")]
    WarmingUp { source_name: String },
    /// The readings could not be turned into demand (e.g. a negative or NaN value).
    #[error("cannot compute demand: {0}")]
    Demand(#[from] DemandError),
    /// A raw `query` reached evaluation without a Prometheus source (metadata parsing refuses
    /// that combination, so this is a bug, not a user error).
    #[error("query without serverAddress")]
    QueryWithoutServer,
}

impl Error {
    /// The gRPC status code for this error.
    pub fn code(&self) -> Code {
        match self {
            Error::Metadata(_) => Code::InvalidArgument,
            Error::Denied(_) => Code::PermissionDenied,
            Error::Source(e) => match e {
                SourceError::Unavailable { .. } => Code::Unavailable,
                SourceError::Timeout { .. } => Code::DeadlineExceeded,
                SourceError::Garbage { .. } => Code::Internal,
                SourceError::Rejected { .. } => Code::InvalidArgument,
                SourceError::NotConfigured(_) => Code::FailedPrecondition,
                SourceError::Denied(_) => Code::PermissionDenied,
            },
            Error::Empty { .. } => Code::NotFound,
            Error::WarmingUp { .. } => Code::Unavailable,
            Error::Demand(_) => Code::Internal,
            Error::QueryWithoutServer => Code::Internal,
        }
    }
}

/// Why the scaler cannot start or stopped serving; never an answer to KEDA (that is [`Error`]).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The metric sources cannot be set up (e.g. no HTTP client for direct scrapes).
    #[error("scaler metric sources: {0}")]
    Sources(#[from] SourceError),
    /// The TLS files cannot be used.
    #[error("scaler TLS: {0}")]
    Tls(#[from] tls::Error),
    /// The gRPC port cannot be bound (in use, not permitted).
    #[error("scaler gRPC server: cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed while serving.
    #[error("scaler gRPC server: {0}")]
    Serve(#[source] tonic::transport::Error),
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        Status::new(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn source_failures_map_to_distinct_retryable_codes() {
        let down = Error::Source(SourceError::Unavailable {
            upstream: "Prometheus http://p".into(),
            detail: "connection refused".into(),
        });
        let status = Status::from(down);
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().contains("connection refused"));
        let slow = Error::Source(SourceError::Timeout {
            upstream: "x".into(),
            after: Duration::from_secs(1),
        });
        assert_eq!(Status::from(slow).code(), Code::DeadlineExceeded);
        let garbage = Error::Source(SourceError::Garbage {
            upstream: "x".into(),
            detail: "html".into(),
        });
        assert_eq!(Status::from(garbage).code(), Code::Internal);
        let bad = Error::Metadata(MetadataError {
            problems: vec!["waitingTarget: \"x\" is not a positive number".into()],
        });
        let status = Status::from(bad);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("waitingTarget"));
    }
}
