//! Structured logging set-up. Owns the `tracing` subscriber; metrics live in
//! [`crate::runtime::admin`]. Plain lines are coloured only on a terminal and never with `NO_COLOR`
//! set.

use std::{ffi::OsStr, io::IsTerminal};

use clap::{Args, ValueEnum};
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// How log lines are written to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Logging options shared by every subcommand.
#[derive(Clone, Debug, Args)]
pub struct LogArgs {
    /// Log line format.
    #[arg(long, env = "NIGHTSHIFT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain, global = true)]
    pub log_format: LogFormat,

    /// Log filter in `tracing` EnvFilter syntax (e.g. `info,nightshift=debug`).
    #[arg(long, env = "NIGHTSHIFT_LOG", default_value = DEFAULT_FILTER, global = true)]
    pub log: String,
}

/// `info`, except for rustls, which logs what a TLS peer does wrong (an IP address sent as the
/// server name, an extension it should not send) at `warn`, once per connection. Any client that
/// reaches a listener could thus write warnings into the log at will, and at the webhook's
/// handshake rate bury the lines that matter; nightshift logs a failed handshake itself, at
/// `debug`. Errors of rustls's own are still logged.
pub const DEFAULT_FILTER: &str = "info,rustls=error";

/// Errors while setting up logging.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid log filter {filter:?}: {source}")]
    Filter {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("a global tracing subscriber is already installed")]
    AlreadyInstalled,
}

impl LogArgs {
    /// Installs the global subscriber. Does not touch the process environment.
    pub fn init(&self) -> Result<(), Error> {
        let filter = EnvFilter::try_new(&self.log).map_err(|source| Error::Filter {
            filter: self.log.clone(),
            source,
        })?;
        let registry = tracing_subscriber::registry().with(filter);
        let result = match self.log_format {
            LogFormat::Plain => registry
                .with(
                    fmt::layer()
                        .with_ansi(use_colour(
                            std::io::stderr().is_terminal(),
                            std::env::var_os("NO_COLOR").as_deref(),
                        ))
                        .with_writer(std::io::stderr),
                )
                .try_init(),
            LogFormat::Json => registry
                .with(
                    fmt::layer()
                        .json()
                        .flatten_event(true)
                        .with_current_span(true)
                        .with_writer(std::io::stderr),
                )
                .try_init(),
        };
        result.map_err(|_| Error::AlreadyInstalled)
    }
}

/// Pure: whether plain log lines get ANSI colour codes. Only on a terminal (a file or a log
/// collector would keep the escape codes as text), and never when `NO_COLOR` is set to a
/// non-empty value (<https://no-color.org>).
pub fn use_colour(stderr_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default filter drops a TLS peer's protocol warnings (rustls logs through `log`, which
    /// reaches the subscriber under the module's path as its target) and keeps nightshift's.
    #[test]
    fn the_default_filter_keeps_nightshift_and_drops_peer_warnings() {
        use std::sync::{Arc, Mutex};

        #[derive(Clone, Default)]
        struct Targets(Arc<Mutex<Vec<String>>>);
        impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Targets {
            fn on_event(
                &self,
                event: &tracing::Event<'_>,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                if let Ok(mut seen) = self.0.lock() {
                    seen.push(event.metadata().target().to_string());
                }
            }
        }

        let seen = Targets::default();
        let filter = EnvFilter::try_new(DEFAULT_FILTER).expect("the default parses");
        let subscriber = tracing_subscriber::registry()
            .with(filter)
            .with(seen.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "rustls::msgs::handshake", "Illegal SNI extension");
            tracing::error!(target: "rustls::server::hs", "a fault of rustls's own");
            tracing::info!(target: "nightshift::webhook::server", "webhook listening");
            tracing::debug!(target: "nightshift::webhook::review", "research pod marked");
            tracing::info!(target: "kube_runtime::watcher", "a dependency's info");
        });
        let seen = seen.0.lock().expect("targets").clone();
        assert_eq!(
            seen,
            [
                "rustls::server::hs",
                "nightshift::webhook::server",
                "kube_runtime::watcher"
            ]
        );
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some(OsStr::new(""))));
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(false, None));
        assert!(!use_colour(false, Some(OsStr::new(""))));
    }
}
