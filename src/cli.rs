//! The command line: one [`Cli`] with a subcommand per way of running nightshift. Every flag is
//! also an environment variable. Components own their option groups; this module flattens them.

use std::{process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::{
    admin::AdminArgs,
    cluster,
    duration::parse_duration,
    pool,
    runtime::Context,
    scaler::{self, ScalerArgs},
    sim::SimArgs,
    telemetry::LogArgs,
    webhook::{self, WebhookArgs, certs},
};

/// nightshift: lend idle LLM-inference GPUs to research jobs, take them back when inference
/// needs them.
#[derive(Debug, Parser)]
#[command(name = "nightshift", version, about, long_about = None)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run every component: KEDA scaler, admission webhook and GPU-pool controller.
    Run(Box<RunArgs>),
    /// Run only the KEDA external scaler (gRPC) and the admin server.
    Scaler(ScalerOnlyArgs),
    /// Run only the admission webhook.
    Webhook(WebhookCommandArgs),
    /// Manage the webhook's TLS certificates.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Replay a request trace against a simulated cluster and compare how many GPU-hours each
    /// policy lends to research, at what cost to inference.
    Simulate(SimArgs),
    /// Run only the GPU-pool controller (spare marks, preemption tracking, `/status`).
    Pool(PoolRunArgs),
    /// Show the GPU pool: GPUs per node, spare marks, research pods, recent preemptions.
    Status(pool::StatusArgs),
}

/// Options of `nightshift scaler`.
#[derive(Debug, Args)]
pub struct ScalerOnlyArgs {
    #[command(flatten)]
    pub admin: AdminArgs,

    #[command(flatten)]
    pub shutdown: ShutdownArgs,

    #[command(flatten)]
    pub scaler: ScalerArgs,
}

/// Options of `nightshift webhook`.
#[derive(Debug, Args)]
pub struct WebhookCommandArgs {
    #[command(flatten)]
    pub admin: AdminArgs,

    #[command(flatten)]
    pub shutdown: ShutdownArgs,

    #[command(flatten)]
    pub webhook: WebhookArgs,
}

/// `nightshift certs ...`
#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Generate a CA (kept if it exists) and a serving certificate for the webhook Service, and
    /// print the caBundle.
    Generate(certs::GenerateArgs),
}

/// Options of `nightshift run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub admin: AdminArgs,

    #[command(flatten)]
    pub shutdown: ShutdownArgs,

    #[command(flatten)]
    pub scaler: ScalerArgs,

    #[command(flatten)]
    pub webhook: WebhookArgs,

    #[command(flatten)]
    pub pool: pool::PoolArgs,
}

/// Options of `nightshift pool`.
#[derive(Debug, Args)]
pub struct PoolRunArgs {
    #[command(flatten)]
    pub admin: AdminArgs,

    #[command(flatten)]
    pub shutdown: ShutdownArgs,

    #[command(flatten)]
    pub pool: pool::PoolArgs,
}

/// How long in-flight work may take to finish after SIGTERM.
#[derive(Clone, Debug, Args)]
pub struct ShutdownArgs {
    /// Time given to in-flight requests after SIGTERM before the process exits (e.g. `20s`).
    #[arg(long, env = "NIGHTSHIFT_DRAIN_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
}

impl Cli {
    /// Runs the chosen subcommand and maps its outcome to the process exit code.
    pub async fn run(self) -> ExitCode {
        if let Err(e) = self.log.init() {
            eprintln!("nightshift: {e}");
            return ExitCode::FAILURE;
        }
        let outcome = match self.command {
            Command::Run(args) => run_all(*args).await,
            Command::Scaler(args) => run_scaler(args).await,
            Command::Webhook(args) => run_webhook(args).await,
            Command::Certs(CertsCommand::Generate(args)) => generate_certs(&args),
            Command::Simulate(args) => tokio::task::spawn_blocking(move || crate::sim::run(args))
                .await
                .map_err(anyhow::Error::from)
                .and_then(|r| r.map_err(anyhow::Error::from)),
            Command::Pool(args) => run_pool(args).await,
            Command::Status(args) => match pool::status_command(args).await {
                Ok(text) => {
                    print!("{text}");
                    Ok(())
                }
                Err(e) => Err(e.into()),
            },
        };
        match outcome {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = format!("{e:#}"), "nightshift stopped with an error");
                ExitCode::FAILURE
            }
        }
    }
}

async fn run_all(args: RunArgs) -> anyhow::Result<()> {
    let RunArgs {
        admin,
        shutdown,
        scaler,
        webhook,
        pool,
    } = args;
    let mut ctx = Context::new(cluster::connect().await);
    scaler::start(scaler, &mut ctx).await?;
    webhook::start(webhook, &mut ctx).await?;
    pool::start(pool, &mut ctx).await?;
    ctx.serve(admin.admin_addr, shutdown.drain_timeout).await
}

async fn run_pool(args: PoolRunArgs) -> anyhow::Result<()> {
    let PoolRunArgs {
        admin,
        shutdown,
        pool,
    } = args;
    let mut ctx = Context::new(cluster::connect().await);
    pool::start(pool, &mut ctx).await?;
    ctx.serve(admin.admin_addr, shutdown.drain_timeout).await
}

async fn run_scaler(args: ScalerOnlyArgs) -> anyhow::Result<()> {
    let ScalerOnlyArgs {
        admin,
        shutdown,
        scaler,
    } = args;
    let mut ctx = Context::new(cluster::connect().await);
    scaler::start(scaler, &mut ctx).await?;
    ctx.serve(admin.admin_addr, shutdown.drain_timeout).await
}

async fn run_webhook(args: WebhookCommandArgs) -> anyhow::Result<()> {
    let WebhookCommandArgs {
        admin,
        shutdown,
        webhook,
    } = args;
    let kube = cluster::connect().await;
    if kube.is_none() {
        anyhow::bail!(
            "the webhook needs a Kubernetes cluster (to watch Namespaces and PriorityClasses): \
             set KUBECONFIG or run in a pod"
        );
    }
    let mut ctx = Context::new(kube);
    webhook::start(webhook, &mut ctx).await?;
    ctx.serve(admin.admin_addr, shutdown.drain_timeout).await
}

fn generate_certs(args: &certs::GenerateArgs) -> anyhow::Result<()> {
    let generated = certs::generate(args)?;
    let dir = generated.dir.display();
    if generated.new_ca {
        eprintln!("new CA written to {dir}/{}", certs::CA_CERT);
    } else {
        eprintln!(
            "kept the CA in {dir}/{} (pass --new-ca to replace it)",
            certs::CA_CERT
        );
    }
    eprintln!(
        "serving certificate for {} written to {dir}/{} and {dir}/{}",
        args.subject_alt_names().join(", "),
        certs::TLS_CERT,
        certs::TLS_KEY
    );
    eprintln!("caBundle (base64 of {dir}/{}):", certs::CA_CERT);
    println!("{}", generated.ca_bundle);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
