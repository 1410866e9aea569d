//! Wires components together and supervises them: one shutdown signal drives every server, and
//! the process ends (non-zero) if any component dies.
//!
//! This is the binary's edge, so `anyhow` is used for the tasks' results.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use axum::Router;
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{
    runtime::admin::{self, Readiness},
    runtime::tls,
};

/// What components need while they are being started: the metrics registry to register into,
/// readiness conditions, admin routes to add, an optional Kubernetes client and the supervisor
/// to spawn their tasks on.
pub struct Context {
    pub registry: Registry,
    pub readiness: Readiness,
    pub admin_routes: Router,
    pub kube: Option<kube::Client>,
    pub supervisor: Supervisor,
    /// The TLS metrics every TLS server reports into (one family for the process).
    pub tls_metrics: tls::Metrics,
}

impl Context {
    /// A context with no routes and a registry holding only the TLS metrics.
    pub fn new(kube: Option<kube::Client>) -> Self {
        let mut registry = Registry::with_prefix(admin::METRICS_PREFIX);
        let tls_metrics = tls::Metrics::default();
        tls_metrics.register(&mut registry);
        Self {
            registry,
            readiness: Readiness::default(),
            admin_routes: Router::new(),
            kube,
            supervisor: Supervisor::new(),
            tls_metrics,
        }
    }

    /// Adds routes to the admin server.
    pub fn add_admin_routes(&mut self, routes: Router) {
        let current = std::mem::take(&mut self.admin_routes);
        self.admin_routes = current.merge(routes);
    }

    /// Binds the admin server, spawns it, and waits until shutdown (signal or a component's end),
    /// giving components `drain` to finish in-flight work.
    pub async fn serve(mut self, admin_addr: SocketAddr, drain: Duration) -> anyhow::Result<()> {
        let listener = admin::bind(admin_addr).await?;
        let router =
            admin::router(Arc::new(self.registry), self.readiness).merge(self.admin_routes);
        let token = self.supervisor.shutdown_token();
        self.supervisor.spawn("admin", async move {
            admin::serve(listener, router, token).await?;
            Ok(())
        });
        self.supervisor.wait(drain).await
    }
}

/// Runs named tasks until a shutdown signal arrives or one of them ends, then cancels the rest
/// and waits for them to drain.
pub struct Supervisor {
    shutdown: CancellationToken,
    tasks: JoinSet<(&'static str, anyhow::Result<()>)>,
}

impl Default for Supervisor {
    fn default() -> Self {
        Self::new()
    }
}

impl Supervisor {
    pub fn new() -> Self {
        Self {
            shutdown: CancellationToken::new(),
            tasks: JoinSet::new(),
        }
    }

    /// The token every task watches; cancelled on SIGTERM/SIGINT or when any task ends.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Spawns a task. A task that returns (even `Ok`) before shutdown ends the process: every
    /// component is meant to run until told to stop.
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.tasks.spawn(async move { (name, task.await) });
    }

    /// Waits for a signal or the first task to end, cancels everything, then waits up to `drain`
    /// for the remaining tasks. Returns the first error seen.
    pub async fn wait(mut self, drain: Duration) -> anyhow::Result<()> {
        let mut first_error: Option<anyhow::Error> = None;
        tokio::select! {
            () = shutdown_signal() => {
                tracing::info!("shutdown signal received, draining");
            }
            Some(joined) = self.tasks.join_next() => {
                let err = task_outcome(joined, self.shutdown.is_cancelled());
                if let Some(e) = err { first_error = Some(e); }
            }
        }
        self.shutdown.cancel();
        let drained = tokio::time::timeout(drain, async {
            while let Some(joined) = self.tasks.join_next().await {
                if let Some(e) = task_outcome(joined, true) {
                    first_error.get_or_insert(e);
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(?drain, "drain timeout reached, aborting remaining tasks");
            self.tasks.abort_all();
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

fn task_outcome(
    joined: Result<(&'static str, anyhow::Result<()>), tokio::task::JoinError>,
    shutting_down: bool,
) -> Option<anyhow::Error> {
    match joined {
        Ok((name, Ok(()))) if shutting_down => {
            tracing::debug!(task = name, "stopped");
            None
        }
        Ok((name, Ok(()))) => {
            tracing::error!(task = name, "stopped unexpectedly; shutting down");
            Some(anyhow::anyhow!("task {name} stopped unexpectedly"))
        }
        Ok((name, Err(e))) => {
            tracing::error!(
                task = name,
                error = format!("{e:#}"),
                "failed; shutting down"
            );
            Some(e.context(format!("task {name} failed")))
        }
        Err(e) => {
            tracing::error!(error = %e, "task panicked or was aborted");
            Some(anyhow::anyhow!("task panicked: {e}"))
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failing_task_cancels_the_others_and_is_reported() {
        let mut sup = Supervisor::new();
        let token = sup.shutdown_token();
        sup.spawn("long", async move {
            token.cancelled().await;
            Ok(())
        });
        sup.spawn("broken", async { Err(anyhow::anyhow!("boom")) });
        let err = sup
            .wait(Duration::from_secs(5))
            .await
            .expect_err("must fail");
        assert!(format!("{err:#}").contains("boom"), "{err:#}");
    }

    #[tokio::test]
    async fn tasks_that_ignore_shutdown_are_aborted_after_the_drain_timeout() {
        let mut sup = Supervisor::new();
        sup.spawn("stuck", async {
            std::future::pending::<()>().await;
            Ok(())
        });
        sup.spawn("quits", async { Ok(()) });
        let err = sup
            .wait(Duration::from_millis(50))
            .await
            .expect_err("early exit is an error");
        assert!(format!("{err:#}").contains("quits"), "{err:#}");
    }
}
