//! What the webhook needs to know about the cluster: the labels of a pod's namespace and the
//! PriorityClasses. Behind the small [`ClusterView`] trait so that tests feed a
//! `FixedCluster` (in `test_support`); [`KubeCluster`] answers from kube-runtime reflectors
//! (watched caches).
//!
//! Owns the watches, the "caches synced" readiness condition and the lookup error
//! ([`ClusterError`]); decides nothing.

use std::{collections::BTreeMap, sync::Arc};

use futures::StreamExt;
use k8s_openapi::api::{core::v1::Namespace, scheduling::v1::PriorityClass};
use kube::{
    Api,
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};

use super::mutate::{PriorityClassInfo, PriorityClasses};
use crate::runtime::Context;

/// A lookup the cache cannot answer failed at the API server too. PriorityClasses are only ever
/// read from the cache, so only namespaces fail.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot look up namespace {namespace:?}: {source}")]
    NamespaceLookup {
        namespace: String,
        #[source]
        source: Box<kube::Error>,
    },
}

/// Namespace labels and PriorityClasses, as the webhook sees them.
#[async_trait::async_trait]
pub trait ClusterView: PriorityClasses + Send + Sync + 'static {
    /// Labels of `namespace`; `Ok(None)` when the namespace does not exist.
    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<Option<BTreeMap<String, String>>, ClusterError>;
}

/// The cluster as seen through watched caches of Namespaces (metadata only) and PriorityClasses.
#[derive(Clone)]
pub struct KubeCluster {
    namespaces: Store<PartialObjectMeta<Namespace>>,
    classes: Store<PriorityClass>,
    client: kube::Client,
}

impl KubeCluster {
    /// Starts both watches on the supervisor and registers the readiness condition
    /// `webhook caches synced`, set once both caches have listed everything.
    pub fn start(client: kube::Client, ctx: &mut Context) -> Arc<Self> {
        let token = ctx.supervisor.shutdown_token();

        let (namespaces, ns_writer) = reflector::store::<PartialObjectMeta<Namespace>>();
        let ns_stream = watcher(
            Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(ns_writer)
        .applied_objects();
        let t = token.clone();
        ctx.supervisor.spawn("webhook-namespace-watch", async move {
            drive(ns_stream, "Namespace", t).await
        });

        let (classes, pc_writer) = reflector::store::<PriorityClass>();
        let pc_stream = watcher(
            Api::<PriorityClass>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(pc_writer)
        .applied_objects();
        let t = token.clone();
        ctx.supervisor
            .spawn("webhook-priorityclass-watch", async move {
                drive(pc_stream, "PriorityClass", t).await
            });

        let ready = ctx.readiness.register("webhook caches synced");
        let (ns_reader, pc_reader) = (namespaces.clone(), classes.clone());
        ctx.supervisor.spawn("webhook-cache-readiness", async move {
            let synced = async {
                ns_reader.wait_until_ready().await?;
                pc_reader.wait_until_ready().await
            };
            tokio::select! {
                res = synced => {
                    res.map_err(|e| anyhow::anyhow!("webhook cache writer dropped: {e}"))?;
                    tracing::info!("webhook caches synced (Namespaces, PriorityClasses)");
                    ready.set(true);
                }
                () = token.cancelled() => return Ok(()),
            }
            token.cancelled().await;
            Ok(())
        });

        Arc::new(Self {
            namespaces,
            classes,
            client,
        })
    }
}

async fn drive<S, T>(
    stream: S,
    kind: &'static str,
    token: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()>
where
    S: futures::Stream<Item = Result<T, watcher::Error>> + Send,
{
    let watch = stream.for_each(|event| async move {
        if let Err(e) = event {
            // The backoff retries; say what is wrong so RBAC or connectivity can be fixed.
            tracing::warn!(kind, error = %e, "webhook watch error, retrying");
        }
    });
    tokio::select! {
        () = watch => anyhow::bail!("{kind} watch ended"),
        () = token.cancelled() => Ok(()),
    }
}

impl PriorityClasses for KubeCluster {
    fn priority_class(&self, name: &str) -> Option<PriorityClassInfo> {
        self.classes
            .get(&ObjectRef::new(name))
            .map(|c| PriorityClassInfo::from_class(&c))
    }
}

#[async_trait::async_trait]
impl ClusterView for KubeCluster {
    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<Option<BTreeMap<String, String>>, ClusterError> {
        if let Some(ns) = self.namespaces.get(&ObjectRef::new(namespace)) {
            return Ok(Some(ns.metadata.labels.clone().unwrap_or_default()));
        }
        // A namespace created moments ago may not have reached the cache yet (e.g. a manifest
        // with a Namespace and a Pod applied together): ask the API server rather than
        // mistake a research namespace for an ordinary one.
        let api = Api::<Namespace>::all(self.client.clone());
        match api.get_metadata_opt(namespace).await {
            Ok(found) => Ok(found.map(|ns| ns.metadata.labels.unwrap_or_default())),
            Err(source) => Err(ClusterError::NamespaceLookup {
                namespace: namespace.to_string(),
                source: Box::new(source),
            }),
        }
    }
}
