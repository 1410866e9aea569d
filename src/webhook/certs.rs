//! `nightshift certs generate`: a private CA and a serving certificate for the webhook Service,
//! written as PEM files, with the `caBundle` to paste into the MutatingWebhookConfiguration.
//!
//! Running it again keeps the CA (so the `caBundle` registered in the cluster stays valid) and
//! issues a fresh serving certificate: that is a rotation the running webhook picks up by itself.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use clap::Args;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// Errors of `nightshift certs generate`: the directory, a file, or rcgen.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate generation failed: {0}")]
    Generate(String),
}

/// File names inside the output directory (the names a `kubernetes.io/tls` Secret uses).
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";

/// Subject of the CA. Kept constant: a reused CA key signs new certificates under this name, and
/// clients match issuer and subject names byte for byte.
const CA_COMMON_NAME: &str = "nightshift webhook CA";

/// Options of `nightshift certs generate`.
#[derive(Clone, Debug, Args)]
pub struct GenerateArgs {
    /// Directory to write ca.crt, ca.key, tls.crt and tls.key into.
    #[arg(long, env = "NIGHTSHIFT_CERTS_DIR", default_value = "certs")]
    pub dir: PathBuf,

    /// Name of the webhook's Service.
    #[arg(long, env = "NIGHTSHIFT_CERTS_SERVICE", default_value = "nightshift")]
    pub service: String,

    /// Namespace of the webhook's Service.
    #[arg(
        long,
        env = "NIGHTSHIFT_CERTS_NAMESPACE",
        default_value = "nightshift-system"
    )]
    pub namespace: String,

    /// Extra DNS names for the serving certificate (comma-separated).
    #[arg(
        long,
        env = "NIGHTSHIFT_CERTS_DNS_NAMES",
        value_delimiter = ',',
        default_value = "localhost"
    )]
    pub dns_names: Vec<String>,

    /// IP addresses for the serving certificate (comma-separated), for a webhook reached by URL
    /// while developing.
    #[arg(
        long,
        env = "NIGHTSHIFT_CERTS_IPS",
        value_delimiter = ',',
        default_value = "127.0.0.1,::1"
    )]
    pub ips: Vec<IpAddr>,

    /// Validity of the serving certificate, in days.
    #[arg(long, env = "NIGHTSHIFT_CERTS_DAYS", default_value_t = 365)]
    pub days: u32,

    /// Validity of a new CA, in days.
    #[arg(long, env = "NIGHTSHIFT_CERTS_CA_DAYS", default_value_t = 3650)]
    pub ca_days: u32,

    /// Create a new CA even if one exists in the directory (the caBundle changes).
    #[arg(long, env = "NIGHTSHIFT_CERTS_NEW_CA", default_value_t = false)]
    pub new_ca: bool,
}

impl GenerateArgs {
    /// The Service's DNS names (`svc`, `svc.ns`, `svc.ns.svc`, `svc.ns.svc.cluster.local`) plus
    /// the extra names.
    pub fn subject_alt_names(&self) -> Vec<String> {
        let (s, n) = (&self.service, &self.namespace);
        let mut names = vec![
            format!("{s}.{n}.svc"),
            s.clone(),
            format!("{s}.{n}"),
            format!("{s}.{n}.svc.cluster.local"),
        ];
        names.extend(self.dns_names.iter().filter(|d| !d.is_empty()).cloned());
        names.extend(self.ips.iter().map(IpAddr::to_string));
        names.dedup();
        names
    }
}

/// What was written.
#[derive(Clone, Debug)]
pub struct Generated {
    pub dir: PathBuf,
    /// Whether the CA was newly created (false: an existing CA was reused).
    pub new_ca: bool,
    /// The CA certificate PEM, base64-encoded: the webhook configuration's `caBundle`.
    pub ca_bundle: String,
}

/// Writes the CA (unless one is reused) and a new serving certificate into `args.dir`.
pub fn generate(args: &GenerateArgs) -> Result<Generated, CertsError> {
    let dir = &args.dir;
    std::fs::create_dir_all(dir).map_err(|source| CertsError::Write {
        path: dir.clone(),
        source,
    })?;
    let ca_cert_path = dir.join(CA_CERT);
    let ca_key_path = dir.join(CA_KEY);
    let reuse = !args.new_ca && ca_cert_path.exists() && ca_key_path.exists();

    let ca_key = if reuse {
        let pem = read(&ca_key_path)?;
        KeyPair::from_pem(&pem)
            .map_err(|e| CertsError::Generate(format!("{}: {e}", ca_key_path.display())))?
    } else {
        KeyPair::generate().map_err(cert_error)?
    };
    let ca_params = ca_params(args.ca_days)?;
    if !reuse {
        let ca_cert = ca_params.self_signed(&ca_key).map_err(cert_error)?;
        write(&ca_key_path, &ca_key.serialize_pem(), true)?;
        write(&ca_cert_path, &ca_cert.pem(), false)?;
    }
    let issuer = Issuer::new(ca_params, ca_key);

    let mut params = CertificateParams::new(args.subject_alt_names()).map_err(cert_error)?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("{}.{}.svc", args.service, args.namespace),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, args.days)?;
    let key = KeyPair::generate().map_err(cert_error)?;
    let cert = params.signed_by(&key, &issuer).map_err(cert_error)?;
    // Key first: a reader that sees the new certificate with the old key rejects the pair and
    // keeps serving the previous one until both files agree.
    write(&dir.join(TLS_KEY), &key.serialize_pem(), true)?;
    write(&dir.join(TLS_CERT), &cert.pem(), false)?;

    let ca_pem = read(&ca_cert_path)?;
    Ok(Generated {
        dir: dir.clone(),
        new_ca: !reuse,
        ca_bundle: base64_simd::STANDARD.encode_to_string(ca_pem),
    })
}

fn ca_params(days: u32) -> Result<CertificateParams, CertsError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_COMMON_NAME);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, days)?;
    Ok(params)
}

/// From yesterday (tolerates clock skew between machines) to `days` from today.
fn set_validity(params: &mut CertificateParams, days: u32) -> Result<(), CertsError> {
    let today = jiff::Zoned::now().date();
    let at = |date: jiff::civil::Date| {
        u8::try_from(date.month())
            .ok()
            .zip(u8::try_from(date.day()).ok())
            .map(|(m, d)| rcgen::date_time_ymd(i32::from(date.year()), m, d))
    };
    let from = today.yesterday().ok().and_then(at);
    let until = today
        .checked_add(jiff::Span::new().days(i64::from(days)))
        .ok()
        .and_then(at);
    let (from, until) = from
        .zip(until)
        .ok_or_else(|| CertsError::Generate(format!("{days} days of validity is out of range")))?;
    params.not_before = from;
    params.not_after = until;
    Ok(())
}

fn cert_error(e: rcgen::Error) -> CertsError {
    CertsError::Generate(e.to_string())
}

fn read(path: &Path) -> Result<String, CertsError> {
    std::fs::read_to_string(path).map_err(|source| CertsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes atomically (temporary file + rename) so a reader never sees half a file; private keys
/// are readable by the owner only.
fn write(path: &Path, contents: &str, private: bool) -> Result<(), CertsError> {
    let err = |source| CertsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).map_err(err)?;
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    }
    #[cfg(not(unix))]
    let _ = private;
    std::fs::rename(&tmp, path).map_err(err)
}
