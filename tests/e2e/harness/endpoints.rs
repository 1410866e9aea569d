//! The endpoints of a Service whose backends run outside the cluster: the scenario writes the
//! Service's EndpointSlices itself, one per backend, as the EndpointSlice controller writes them
//! for the pods of a Deployment (address, port by the Service port's name, `ready` from the
//! readiness probe). The API server, which dials such Services at an endpoint (aggregator
//! routing), then picks a ready one at random for each call.

use std::net::IpAddr;

use anyhow::{Context, Result};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

/// The label that ties a slice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Who manages the slices: not the EndpointSlice controller, which leaves them alone.
const MANAGED_BY: &str = "e2e.nightshift.io";

/// The EndpointSlices of Service `service` in `namespace` for its port `port_name`.
pub struct ServiceEndpoints {
    api: Api<EndpointSlice>,
    service: String,
    port_name: String,
}

impl ServiceEndpoints {
    pub fn new(client: &kube::Client, namespace: &str, service: &str, port_name: &str) -> Self {
        Self {
            api: Api::namespaced(client.clone(), namespace),
            service: service.to_string(),
            port_name: port_name.to_string(),
        }
    }

    /// Writes backend `backend`'s slice: one endpoint at `ip:port`, ready or not.
    pub async fn set(&self, backend: &str, ip: IpAddr, port: u16, ready: bool) -> Result<()> {
        let name = format!("{}-{backend}", self.service);
        let slice: EndpointSlice = serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": name,
                "labels": {
                    SERVICE_NAME_LABEL: self.service,
                    "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
                },
            },
            "addressType": if ip.is_ipv4() { "IPv4" } else { "IPv6" },
            "endpoints": [{
                "addresses": [ip.to_string()],
                "conditions": {"ready": ready, "serving": ready, "terminating": false},
            }],
            "ports": [{"name": self.port_name, "port": port, "protocol": "TCP"}],
        }))?;
        self.api
            .patch(
                &name,
                &PatchParams::apply(MANAGED_BY).force(),
                &Patch::Apply(&slice),
            )
            .await
            .with_context(|| format!("writing EndpointSlice {name}"))?;
        Ok(())
    }

    /// Deletes every slice written for this Service.
    pub async fn delete_all(&self) -> Result<()> {
        let selector = format!(
            "{SERVICE_NAME_LABEL}={},endpointslice.kubernetes.io/managed-by={MANAGED_BY}",
            self.service
        );
        self.api
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&selector),
            )
            .await?;
        Ok(())
    }
}
