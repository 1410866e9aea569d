//! Rendering kustomizations with a real kustomize binary, on a private copy of `manifests/`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde::Deserialize;
use serde_json::Value;

/// Environment variable naming the kustomize binary (set by `.ci/test`).
const KUSTOMIZE_ENV: &str = "NIGHTSHIFT_KUSTOMIZE";
/// Set to `1` to skip these tests on a machine without kustomize (never set in CI).
const SKIP_ENV: &str = "NIGHTSHIFT_SKIP_MANIFEST_TESTS";

/// Finds kustomize: `$NIGHTSHIFT_KUSTOMIZE`, then the copy `.ci/test` caches, then `PATH`.
/// Returns `None` only when the explicit opt-out is set; otherwise a missing binary fails the
/// test with instructions.
pub fn kustomize() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(KUSTOMIZE_ENV) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{KUSTOMIZE_ENV}={} does not name a file",
            path.display()
        );
        return Some(path);
    }
    let cache = std::env::var_os("NIGHTSHIFT_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/nightshift")));
    if let Some(cached) = cache.map(|c| c.join("bin/kustomize"))
        && cached.is_file()
    {
        return Some(cached);
    }
    if let Some(on_path) = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("kustomize"))
            .find(|candidate| candidate.is_file())
    }) {
        return Some(on_path);
    }
    if std::env::var(SKIP_ENV).as_deref() == Ok("1") {
        eprintln!("manifest tests skipped: {SKIP_ENV}=1 and no kustomize binary found");
        return None;
    }
    panic!(
        "kustomize not found, so the manifests cannot be checked. Run `bash .ci/test` (it builds \
         kustomize from the Go module proxy), or set {KUSTOMIZE_ENV}=/path/to/kustomize. To skip \
         these tests deliberately, set {SKIP_ENV}=1."
    );
}

/// The repository's `manifests/` directory.
pub fn manifests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests")
}

/// A private copy of `manifests/` in a temp dir, so tests can add generated files (certificates,
/// wrapping kustomizations) without touching the source tree.
pub struct Workspace {
    dir: tempfile::TempDir,
    pub kustomize: PathBuf,
}

impl Workspace {
    /// Copies `manifests/` and generates the self-signed overlay's certificates into the copy.
    /// `None` when the tests are deliberately skipped.
    pub fn new() -> Option<Self> {
        let kustomize = kustomize()?;
        let dir = tempfile::tempdir().expect("temp dir");
        copy_tree(&manifests_dir(), &dir.path().join("manifests"));
        let ws = Self { dir, kustomize };
        ws.generate_certs("manifests/overlays/self-signed/certs");
        Some(ws)
    }

    /// The copy's root (it contains `manifests/`).
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a CA and a serving certificate for the webhook Service (and 127.0.0.1) as
    /// `ca.crt`, `tls.crt`, `tls.key` into `rel` under the root.
    pub fn generate_certs(&self, rel: &str) -> GeneratedCerts {
        let certs = GeneratedCerts::new();
        let dir = self.root().join(rel);
        std::fs::create_dir_all(&dir).expect("certs dir");
        std::fs::write(dir.join("ca.crt"), &certs.ca_pem).expect("write ca.crt");
        std::fs::write(dir.join("tls.crt"), &certs.cert_pem).expect("write tls.crt");
        std::fs::write(dir.join("tls.key"), &certs.key_pem).expect("write tls.key");
        certs
    }

    /// Writes a file under the root.
    pub fn write(&self, rel: &str, contents: &str) {
        let path = self.root().join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
        std::fs::write(path, contents).expect("write");
    }

    /// Renders the kustomization in `rel` (relative to the root) and parses every document.
    pub fn render(&self, rel: &str) -> Rendered {
        render_with(&self.kustomize, &self.root().join(rel))
    }
}

/// Runs `kustomize build dir` and parses the output.
pub fn render_with(kustomize: &Path, dir: &Path) -> Rendered {
    let output = Command::new(kustomize)
        .arg("build")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", kustomize.display()));
    assert!(
        output.status.success(),
        "kustomize build {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("kustomize prints UTF-8");
    let mut objects = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let value = Value::deserialize(document)
            .unwrap_or_else(|e| panic!("{}: output is not YAML: {e}", dir.display()));
        if !value.is_null() {
            objects.push(value);
        }
    }
    Rendered { objects }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy file");
        }
    }
}

/// A CA and a serving certificate signed by it, PEM-encoded.
pub struct GeneratedCerts {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl GeneratedCerts {
    fn new() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().expect("serving key");
        let params = CertificateParams::new(vec![
            "nightshift.nightshift-system.svc".to_string(),
            "127.0.0.1".to_string(),
        ])
        .expect("serving params");
        let cert = params
            .signed_by(&key, &issuer)
            .expect("serving certificate");
        Self {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// The parsed objects of one rendering.
pub struct Rendered {
    pub objects: Vec<Value>,
}

impl Rendered {
    /// Every object of `kind`.
    pub fn all(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    /// The one object of `kind` named `name`; panics naming what is missing.
    pub fn get(&self, kind: &str, name: &str) -> &Value {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} named {name} in the rendered output"))
    }

    /// Whether an object of `kind` named `name` exists.
    pub fn has(&self, kind: &str, name: &str) -> bool {
        self.objects
            .iter()
            .any(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }
}

/// Every directory under `manifests/` that holds a kustomization, relative to the root.
pub fn kustomization_dirs(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").path())
            .collect();
        entries.sort();
        if entries.iter().any(|p| {
            p.file_name()
                .is_some_and(|n| n == "kustomization.yaml" || n == "kustomization.yml")
        }) {
            let rel = dir.strip_prefix(root).expect("under root");
            out.push(rel.to_string_lossy().into_owned());
        }
        for path in entries.into_iter().filter(|p| p.is_dir()) {
            walk(&path, root, out);
        }
    }
    let mut out = Vec::new();
    walk(&root.join("manifests"), root, &mut out);
    out
}
