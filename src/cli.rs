//! The command line: one [`Cli`] with a subcommand per way of running nightshift. Every flag is
//! also an environment variable. Components own their option groups; this module flattens them.

use std::{process::ExitCode, sync::Arc, time::Duration};

use clap::{Args, Parser, Subcommand};
use futures::future::BoxFuture;

use crate::{
    core::duration::parse_duration,
    core::vocabulary::VocabularyArgs,
    pool::{
        self, PoolArgs, StatusArgs,
        deliver::{DemandSource, Evaluated},
    },
    runtime::Context,
    runtime::admin::AdminArgs,
    runtime::cluster,
    runtime::telemetry::LogArgs,
    scaler::{self, ScalerArgs},
    sim::SimArgs,
    view::{self, ViewArgs},
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
    Run(Box<RunCommandArgs>),
    /// Run only the KEDA external scaler (gRPC) and the admin server.
    Scaler(ScalerCommandArgs),
    /// Run only the admission webhook.
    Webhook(WebhookCommandArgs),
    /// Manage the webhook's TLS certificates.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Replay a request trace against a simulated cluster and compare how many GPU-hours each
    /// policy lends to research, at what cost to inference.
    Simulate(SimArgs),
    /// Run only the GPU-pool controller (spare marks, preemption tracking, `/status`).
    Pool(PoolCommandArgs),
    /// Show the GPU pool: GPUs per node, spare marks, research pods, recent preemptions.
    Status(StatusCommandArgs),
}

/// Options of `nightshift run`.
#[derive(Debug, Args)]
pub struct RunCommandArgs {
    #[command(flatten)]
    pub admin: AdminArgs,

    #[command(flatten)]
    pub shutdown: ShutdownArgs,

    #[command(flatten)]
    pub vocabulary: VocabularyArgs,

    #[command(flatten)]
    pub scaler: ScalerArgs,

    #[command(flatten)]
    pub webhook: WebhookArgs,

    #[command(flatten)]
    pub pool: PoolArgs,

    #[command(flatten)]
    pub view: ViewArgs,
}

/// Options of `nightshift scaler`.
#[derive(Debug, Args)]
pub struct ScalerCommandArgs {
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
    pub vocabulary: VocabularyArgs,

    #[command(flatten)]
    pub webhook: WebhookArgs,
}

/// Options of `nightshift pool`.
#[derive(Debug, Args)]
pub struct PoolCommandArgs {
    #[command(flatten)]
    pub admin: AdminArgs,

    #[command(flatten)]
    pub shutdown: ShutdownArgs,

    #[command(flatten)]
    pub vocabulary: VocabularyArgs,

    #[command(flatten)]
    pub pool: PoolArgs,

    #[command(flatten)]
    pub view: ViewArgs,
}

/// Options of `nightshift status`.
#[derive(Debug, Args)]
pub struct StatusCommandArgs {
    #[command(flatten)]
    pub vocabulary: VocabularyArgs,

    #[command(flatten)]
    pub status: StatusArgs,
}

/// `nightshift certs ...`
#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Generate a CA (kept if it exists) and a serving certificate for the webhook Service, and
    /// print the caBundle.
    Generate(certs::GenerateArgs),
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
            Command::Run(args) => run_components((*args).into()).await,
            Command::Scaler(args) => run_components(args.into()).await,
            Command::Webhook(args) => run_components(args.into()).await,
            Command::Pool(args) => run_components(args.into()).await,
            Command::Certs(CertsCommand::Generate(args)) => generate_certs(&args),
            Command::Simulate(args) => tokio::task::spawn_blocking(move || crate::sim::run(args))
                .await
                .map_err(anyhow::Error::from)
                .and_then(|r| r.map_err(anyhow::Error::from)),
            Command::Status(args) => print_status(args).await,
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

/// What one process runs: the components chosen by its command, with their options.
struct Components {
    admin: AdminArgs,
    shutdown: ShutdownArgs,
    scaler: Option<ScalerArgs>,
    /// The components that read the names shared through [`crate::core::vocabulary`], with them.
    named: Option<Named>,
    /// Why this process cannot run without a Kubernetes cluster, if it cannot.
    needs_cluster: Option<&'static str>,
}

/// The webhook and the pool controller, and the one set of names they share.
struct Named {
    vocabulary: VocabularyArgs,
    webhook: Option<WebhookArgs>,
    pool: Option<(PoolArgs, ViewArgs)>,
}

impl From<RunCommandArgs> for Components {
    fn from(args: RunCommandArgs) -> Self {
        let RunCommandArgs {
            admin,
            shutdown,
            vocabulary,
            scaler,
            webhook,
            pool,
            view,
        } = args;
        Self {
            admin,
            shutdown,
            scaler: Some(scaler),
            named: Some(Named {
                vocabulary,
                webhook: Some(webhook),
                pool: Some((pool, view)),
            }),
            needs_cluster: None,
        }
    }
}

impl From<ScalerCommandArgs> for Components {
    fn from(args: ScalerCommandArgs) -> Self {
        let ScalerCommandArgs {
            admin,
            shutdown,
            scaler,
        } = args;
        Self {
            admin,
            shutdown,
            scaler: Some(scaler),
            named: None,
            needs_cluster: None,
        }
    }
}

impl From<WebhookCommandArgs> for Components {
    fn from(args: WebhookCommandArgs) -> Self {
        let WebhookCommandArgs {
            admin,
            shutdown,
            vocabulary,
            webhook,
        } = args;
        Self {
            admin,
            shutdown,
            scaler: None,
            named: Some(Named {
                vocabulary,
                webhook: Some(webhook),
                pool: None,
            }),
            needs_cluster: Some(
                "the webhook needs a Kubernetes cluster (to watch Namespaces and PriorityClasses)",
            ),
        }
    }
}

impl From<PoolCommandArgs> for Components {
    fn from(args: PoolCommandArgs) -> Self {
        let PoolCommandArgs {
            admin,
            shutdown,
            vocabulary,
            pool,
            view,
        } = args;
        Self {
            admin,
            shutdown,
            scaler: None,
            named: Some(Named {
                vocabulary,
                webhook: None,
                pool: Some((pool, view)),
            }),
            needs_cluster: None,
        }
    }
}

/// Checks the shared names, starts each chosen component on one [`Context`] (scaler, webhook,
/// pool controller, in that order) and serves until shutdown.
async fn run_components(components: Components) -> anyhow::Result<()> {
    let Components {
        admin,
        shutdown,
        scaler,
        named,
        needs_cluster,
    } = components;
    let named = named
        .map(|n| n.vocabulary.vocabulary().map(|v| (v, n.webhook, n.pool)))
        .transpose()?;
    let kube = cluster::connect().await;
    if let Some(why) = needs_cluster
        && kube.is_none()
    {
        anyhow::bail!("{why}: set KUBECONFIG or run in a pod");
    }
    let mut ctx = Context::new(kube);
    let scaler = match scaler {
        Some(args) => Some(scaler::start(args, &mut ctx).await?),
        None => None,
    };
    let decisions = scaler.as_ref().map(|s| s.decisions().clone());
    let demand = scaler.map(|s| Arc::new(ScalerDemand(s)) as Arc<dyn DemandSource>);
    if let Some((vocabulary, webhook, pool)) = named {
        if let Some(args) = webhook {
            webhook::start(args, &vocabulary, &mut ctx).await?;
        }
        if let Some((args, view_args)) = pool {
            match pool::run::start(args, vocabulary, demand, &mut ctx).await? {
                Some(controller) => view::start(view_args, controller, decisions, &mut ctx).await?,
                None => tracing::warn!("no Kubernetes cluster: the researchers' view is off"),
            }
        }
    }
    ctx.serve(admin.admin_addr, shutdown.drain_timeout).await
}

/// The scaler of this process as the pool's demand source for reclaim notices: the same
/// evaluation (and source policy) as KEDA's calls, so a notice follows the demand KEDA acts on.
struct ScalerDemand(Arc<scaler::Scaler>);

impl DemandSource for ScalerDemand {
    fn evaluate(
        &self,
        namespace: String,
        name: String,
        metadata: scaler::metadata::Table,
    ) -> BoxFuture<'static, Evaluated> {
        let scaler = self.0.clone();
        Box::pin(async move {
            match scaler.evaluate(&namespace, &name, &metadata).await {
                Ok(e) => Evaluated::Demand(e.replicas),
                Err(scaler::Error::Metadata(_) | scaler::Error::Denied(_)) => Evaluated::NotOurs,
                Err(_) => Evaluated::Failed,
            }
        })
    }
}

/// `nightshift status`: prints the report.
async fn print_status(args: StatusCommandArgs) -> anyhow::Result<()> {
    let StatusCommandArgs { vocabulary, status } = args;
    let vocabulary = vocabulary.vocabulary()?;
    let text = pool::report::status_command(status, vocabulary).await?;
    print!("{text}");
    Ok(())
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
    use crate::pool::controller::{Controller, Metrics};
    use crate::test_support::fixtures::node;
    use crate::webhook::mutate::{self, Classification, PriorityClassInfo};
    use jiff::Timestamp;
    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::watcher;
    use std::collections::BTreeMap;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    fn run_args(args: &[&str]) -> RunCommandArgs {
        let cli = Cli::try_parse_from(["nightshift", "run"].iter().chain(args)).expect("parses");
        match cli.command {
            Command::Run(args) => *args,
            other => panic!("not run: {other:?}"),
        }
    }

    /// A research class and lent label set once on `nightshift run` reach both the webhook's
    /// marks and the pool's counts: the pod the webhook marks is counted as lent GPUs and listed
    /// as research in the status report.
    #[test]
    fn names_set_once_are_used_by_the_webhook_and_the_pool() {
        let args = run_args(&[
            "--research-priority-class=scavenger",
            "--lent-label=example.com/borrowed",
        ]);
        let names = args.vocabulary.checked().expect("valid names");
        let policy = args.webhook.policy(&names);
        let classes: BTreeMap<String, PriorityClassInfo> = [(
            "scavenger".to_string(),
            PriorityClassInfo {
                value: -5000,
                preemption_policy: "Never".into(),
            },
        )]
        .into();
        let research_ns: BTreeMap<String, String> =
            [(names.research_label.clone(), "true".to_string())].into();
        let created: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "sft", "namespace": "team-a", "uid": "u-sft"},
            "spec": {"containers": [{"name": "main", "image": "trainer:1",
                "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
            "status": {"phase": "Running"}
        }))
        .expect("pod");
        let admitted = crate::webhook::pod_fields::AdmittedPod::from(&created);
        let m = mutate::mutate(&admitted, "team-a", &research_ns, &policy, &classes)
            .expect("not denied");
        assert_eq!(m.selection, Classification::Research { gpu: true });
        let mut doc = serde_json::to_value(&created).expect("pod serialises");
        json_patch::patch(
            &mut doc,
            &m.patch.operations().expect("the patch is JSON").0,
        )
        .expect("patch applies");
        doc["spec"]["nodeName"] = "gpu-a".into();
        let admitted: Pod = serde_json::from_value(doc).expect("patched pod");
        let spec = admitted.spec.as_ref().expect("spec");
        assert_eq!(spec.priority_class_name.as_deref(), Some("scavenger"));
        assert_eq!(
            admitted
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("example.com/borrowed"))
                .map(String::as_str),
            Some("true")
        );

        let pool_policy = args.pool.lending.policy(names).expect("pool policy");
        let mut controller = Controller::new(pool_policy, Metrics::default());
        let now = Timestamp::from_second(2_000_000_000).expect("ts");
        controller.on_node_event(watcher::Event::Init);
        controller.on_node_event(watcher::Event::InitApply(node("gpu-a", 8).build()));
        controller.on_node_event(watcher::Event::InitDone);
        controller.on_pod_event(watcher::Event::Init, now);
        controller.on_pod_event(watcher::Event::InitApply(admitted), now);
        controller.on_pod_event(watcher::Event::InitDone, now);
        controller.reconcile(now, tokio::time::Instant::now());
        let g = controller.ledger().gpus("gpu-a").expect("pool node");
        assert_eq!((g.protected, g.lent, g.free), (0, 2, 6));
        let report = controller.status(now);
        let research: Vec<&str> = report
            .research_pods
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(research, ["sft"]);
    }

    #[test]
    fn every_command_that_reads_the_names_offers_them_once() {
        use clap::CommandFactory;
        let cli = Cli::command();
        for command in ["run", "webhook", "pool", "status"] {
            let sub = cli.find_subcommand(command).expect("subcommand");
            let flags: Vec<&str> = sub.get_arguments().filter_map(|a| a.get_long()).collect();
            for name in [
                "research-priority-class",
                "lent-label",
                "gpu-resource",
                "pool-label",
            ] {
                assert_eq!(
                    flags.iter().filter(|f| **f == name).count(),
                    1,
                    "{command} --{name}"
                );
            }
        }
        let scaler = cli.find_subcommand("scaler").expect("scaler");
        assert!(
            scaler
                .get_arguments()
                .all(|a| a.get_long() != Some("research-priority-class"))
        );
    }
}
