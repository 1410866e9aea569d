//! Connection to the Kubernetes API. nightshift runs without a cluster (the scaler can read
//! Prometheus or explicit endpoints); features that need one are switched off with a clear log.

/// Connects with the usual rules (`KUBECONFIG`, `~/.kube/config`, in-cluster service account).
/// Returns `None`, after logging why, when no configuration is found.
pub async fn connect() -> Option<kube::Client> {
    match kube::Client::try_default().await {
        Ok(client) => {
            tracing::info!(
                default_namespace = client.default_namespace(),
                "connected to Kubernetes"
            );
            Some(client)
        }
        Err(e) => {
            tracing::warn!(
                error = %e,
                "no Kubernetes configuration found: features that need a cluster are off"
            );
            None
        }
    }
}
