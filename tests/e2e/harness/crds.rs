//! The projects' own CustomResourceDefinitions (KEDA, cert-manager, prometheus-operator, Argo
//! Workflows), fetched by `tests/e2e/scripts/fetch-crds.sh`, installed for server-side dry-runs.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::harness::binary::kubectl_ok;
use crate::harness::cluster::Cluster;

/// Applies CRD files (server-side: Argo's full CRDs are too large for the last-applied
/// annotation, and KEDA's start applies its own the same way) and waits until every CRD is
/// established (those of these files: others may be terminating, left by an earlier scenario).
pub fn apply_crds(c: &Cluster, files: &[PathBuf]) -> Result<()> {
    for f in files {
        let f = f.display().to_string();
        kubectl_ok(c, &["apply", "--server-side", "-f", &f], None)?;
    }
    for f in files {
        let f = f.display().to_string();
        let established = [
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            &f,
        ];
        kubectl_ok(c, &established, None)?;
    }
    Ok(())
}

/// Directory of the CRD files: `$NIGHTSHIFT_E2E_CRD_DIR`, else fetched (once, cached) by
/// `tests/e2e/scripts/fetch-crds.sh`.
pub fn crd_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os(CRD_DIR_ENV) {
        return Ok(PathBuf::from(d));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/scripts/fetch-crds.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed (set {CRD_DIR_ENV} to a directory of CRD files instead): {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(PathBuf::from(
        stdout.lines().last().unwrap_or_default().trim(),
    ))
}

/// Environment variable naming a directory of CRD files (else `fetch-crds.sh` provides them).
const CRD_DIR_ENV: &str = "NIGHTSHIFT_E2E_CRD_DIR";
