//! A short-lived CA and webhook serving certificate for `localhost`/`127.0.0.1`, generated with
//! the `certs generate` code into a directory and loaded as the webhook serves it. Shared by the
//! webhook's tests and benchmarks.

use std::{path::Path, sync::Arc};

use crate::{
    runtime::tls::{Metrics, ServerTls},
    webhook::{
        certs::{self, GenerateArgs},
        tls,
    },
};

/// Writes `ca.crt`, `ca.key`, `tls.crt` and `tls.key` into `dir` and loads the serving pair as
/// the webhook does; returns the options used too, so that a test can rotate the certificate
/// with them.
pub fn generate(dir: &Path) -> (GenerateArgs, Arc<ServerTls>) {
    let args = GenerateArgs {
        dir: dir.to_path_buf(),
        service: "nightshift".into(),
        namespace: "nightshift-system".into(),
        dns_names: vec!["localhost".into()],
        ips: vec!["127.0.0.1".parse().expect("ip")],
        days: 1,
        ca_days: 2,
        new_ca: false,
    };
    certs::generate(&args).expect("certificates generated");
    let tls = tls::load(
        &dir.join(certs::TLS_CERT),
        &dir.join(certs::TLS_KEY),
        &Metrics::default(),
    )
    .expect("certificate loads");
    (args, tls)
}
