//! What a ScaledObject asks the sources to scrape: a set of pods and how to read them.
//!
//! Plain values with no behaviour beyond describing themselves, so that the source policy that
//! checks a target and the scrape source that reads it both build on this file and not on each
//! other.

use std::time::Duration;

/// Where the pods are.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Pods {
    /// The ready endpoints of a Service (found from its EndpointSlices).
    Service {
        namespace: String,
        name: String,
        /// Port name or number; `None` takes the first port.
        port: Option<String>,
    },
    /// A fixed list of `host:port`.
    Static(Vec<String>),
}

/// A set of pods and how to scrape them. Equal values share scrapes and rate history.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub pods: Pods,
    /// `http` or `https`.
    pub scheme: String,
    /// Metrics path, normally `/metrics`.
    pub path: String,
    /// Bound on each pod's scrape (and on the first EndpointSlice list).
    pub timeout: Duration,
    /// Only samples carrying all these labels are read.
    pub matchers: Vec<(String, String)>,
    /// Token rates are computed over about this long (at least the last two scrapes).
    pub rate_window: Duration,
}

impl Target {
    /// A short description for errors and logs.
    pub fn describe(&self) -> String {
        match &self.pods {
            Pods::Service {
                namespace, name, ..
            } => format!("pods of service {namespace}/{name}"),
            Pods::Static(list) => format!("endpoints {}", list.join(",")),
        }
    }

    /// The namespace of a Service's pods; empty for a fixed list.
    pub(super) fn namespace(&self) -> &str {
        match &self.pods {
            Pods::Service { namespace, .. } => namespace,
            Pods::Static(_) => "",
        }
    }
}
