//! Preemption victims and pod counts shared by the scenarios that scale inference over research.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, anyhow};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;

use crate::harness::cluster::Cluster;
use crate::harness::objects::{self, is_bound};
use crate::harness::wait::{self, Check};

/// Records every pod of a namespace that the scheduler marks as a preemption victim, split by
/// its `role` label (research or not). The mark is short-lived (kwok finishes deletions at
/// once), so it is watched, not polled. The watch stops when this is dropped.
///
/// It also keeps the last `status.nominatedNodeName` seen on each pod: the node the scheduler
/// chose for a preemptor, which it may clear once the pod is bound.
pub struct VictimWatch {
    research: Arc<Mutex<BTreeSet<String>>>,
    inference: Arc<Mutex<BTreeSet<String>>>,
    nominated: Arc<Mutex<BTreeMap<String, String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for VictimWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl VictimWatch {
    /// Starts watching the pods of `namespace` and returns once the watch is established (so
    /// that no early victim is missed), or fails after `timeout`.
    pub async fn start(client: &kube::Client, namespace: &str, timeout: Duration) -> Result<Self> {
        let research = Arc::new(Mutex::new(BTreeSet::new()));
        let inference = Arc::new(Mutex::new(BTreeSet::new()));
        let nominated = Arc::new(Mutex::new(BTreeMap::new()));
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let (r, i, nom) = (research.clone(), inference.clone(), nominated.clone());
        let task = tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            while let Some(Ok(ev)) = stream.next().await {
                let pod = match ev {
                    watcher::Event::Apply(p)
                    | watcher::Event::InitApply(p)
                    | watcher::Event::Delete(p) => p,
                    watcher::Event::InitDone => {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    watcher::Event::Init => continue,
                };
                if let Some(node) = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.nominated_node_name.as_ref())
                    .filter(|n| !n.is_empty())
                    && let Ok(mut m) = nom.lock()
                {
                    m.insert(pod.metadata.name.clone().unwrap_or_default(), node.clone());
                }
                if !objects::preempted_by_scheduler(&pod) {
                    continue;
                }
                let is_research = pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("role"))
                    .is_some_and(|r| r == "research");
                let set = if is_research { &r } else { &i };
                if let Ok(mut s) = set.lock() {
                    s.insert(pod.metadata.name.clone().unwrap_or_default());
                }
            }
        });
        let watch = Self {
            research,
            inference,
            nominated,
            task,
        };
        tokio::time::timeout(timeout, ready_rx)
            .await
            .map_err(|_| anyhow!("the pod watch did not start within {timeout:?}"))?
            .map_err(|_| anyhow!("the pod watch ended before it started"))?;
        Ok(watch)
    }

    /// Research victims seen so far.
    pub fn research(&self) -> usize {
        self.research.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// Names of the research victims seen so far.
    pub fn research_names(&self) -> Vec<String> {
        self.research
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The last node the scheduler nominated `pod` for, if it was seen.
    pub fn nominated(&self, pod: &str) -> Option<String> {
        self.nominated.lock().ok()?.get(pod).cloned()
    }

    /// Victims that were not research pods (there must be none).
    pub fn inference(&self) -> usize {
        self.inference.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// Waits until at least `n` research pods were marked, and returns how many.
    pub async fn wait_research(&self, n: usize, timeout: Duration) -> Result<usize> {
        wait::until(
            &format!("{n} research pods marked DisruptionTarget/PreemptionByScheduler"),
            timeout,
            || async {
                let seen = self.research.lock().map(|s| s.len()).unwrap_or(0);
                Ok(if seen >= n {
                    Check::Done(seen)
                } else {
                    Check::Pending(format!("{seen} victims seen"))
                })
            },
        )
        .await
    }
}

/// Waits until exactly `n` pods of `namespace` matching `selector` are in `state`.
pub async fn wait_pods(
    cluster: &Cluster,
    namespace: &str,
    selector: &str,
    n: usize,
    state: fn(&Pod) -> bool,
    timeout: Duration,
) -> Result<()> {
    let client = cluster.client.clone();
    wait::until(
        &format!("{n} pods with {selector} in {namespace}"),
        timeout,
        || async {
            cluster.check_processes()?;
            let pods = objects::pods(&client, namespace, selector).await?;
            let matching = pods.values().filter(|p| state(p)).count();
            Ok(if matching == n {
                Check::Done(())
            } else {
                Check::Pending(format!("{matching} of {} pods", pods.len()))
            })
        },
    )
    .await
}

/// GPUs requested by the bound, non-terminating pods of `namespace`.
pub async fn gpus_in_use(client: &kube::Client, namespace: &str) -> Result<u32> {
    let pods = objects::pods(client, namespace, "").await?;
    Ok(pods
        .values()
        .filter(|p| is_bound(p))
        .map(objects::gpus_of)
        .sum())
}
