//! The table of trigger metadata keys: each key's name, the sources it applies to, its default
//! and a one-line meaning. The parser validates unknown and misplaced keys against it, and
//! [`markdown`] renders it for the documentation, so the two cannot drift apart.

use std::fmt::Write as _;

use Applies::{All, Prometheus, Scrape, Service};
use KeyDefault::{Described, Literal, Unset};

/// Which sources a key applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applies {
    /// Every source.
    All,
    /// Prometheus (`serverAddress`) only.
    Prometheus,
    /// Direct scrapes (`service` or `endpoints`) only.
    Scrape,
    /// Direct scrapes of a `service` only.
    Service,
}

impl Applies {
    /// The name shown in the documentation's "applies to" column.
    pub fn label(self) -> &'static str {
        match self {
            Applies::All => "all",
            Applies::Prometheus => "prometheus",
            Applies::Scrape => "scrape",
            Applies::Service => "service",
        }
    }

    /// Whether a key with this scope may be set for `source`.
    pub fn includes(self, source: SourceKind) -> bool {
        match self {
            Applies::All => true,
            Applies::Prometheus => source == SourceKind::Prometheus,
            Applies::Scrape => source != SourceKind::Prometheus,
            Applies::Service => source == SourceKind::Service,
        }
    }

    /// What is wrong with a key of this scope set for `source` (which it does not include).
    pub fn misplaced(self, source: SourceKind) -> &'static str {
        match (self, source) {
            (Applies::Prometheus, _) => "only applies with serverAddress (Prometheus)",
            (Applies::Service, SourceKind::Endpoints) => {
                "only applies with service; put ports in endpoints"
            }
            _ => "only applies to direct scrapes (service or endpoints)",
        }
    }
}

/// The source a trigger reads, chosen by which of the source keys is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    Prometheus,
    Service,
    Endpoints,
}

impl SourceKind {
    /// Every source, in the order a source key wins when several are (wrongly) set.
    pub const ALL: [SourceKind; 3] = [
        SourceKind::Prometheus,
        SourceKind::Service,
        SourceKind::Endpoints,
    ];

    /// The metadata key that selects this source.
    pub fn key(self) -> &'static str {
        match self {
            SourceKind::Prometheus => "serverAddress",
            SourceKind::Service => "service",
            SourceKind::Endpoints => "endpoints",
        }
    }
}

/// A key's default as documented.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyDefault {
    /// No default: unset means not used.
    Unset,
    /// A literal value: leaving the key out is the same as setting it to this.
    Literal(&'static str),
    /// A default that depends on the trigger, described in words.
    Described(&'static str),
}

/// One metadata key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    pub name: &'static str,
    pub applies: Applies,
    pub default: KeyDefault,
    /// What it means, in one line.
    pub doc: &'static str,
}

const fn key(name: &'static str, applies: Applies, default: KeyDefault, doc: &'static str) -> Key {
    Key {
        name,
        applies,
        default,
        doc,
    }
}

/// Every key this scaler reads.
pub const KEYS: &[Key] = &[
    key(
        "serverAddress",
        Prometheus,
        Unset,
        "Prometheus base URL (`http://` or `https://`): read the metrics from Prometheus",
    ),
    key(
        "service",
        Service,
        Unset,
        "Service in front of the vLLM pods to scrape directly; pods come from its EndpointSlices \
         (needs a Kubernetes connection)",
    ),
    key(
        "endpoints",
        Scrape,
        Unset,
        "comma-separated `IP:port` list of vLLM pods to scrape directly (refused unless \
         `--scaler-allow-endpoints`)",
    ),
    key(
        "port",
        Service,
        Described("first port"),
        "Service port name or number",
    ),
    key(
        "scheme",
        Scrape,
        Literal("http"),
        "`http` or `https` for direct scrapes",
    ),
    key(
        "metricsPath",
        Scrape,
        Literal("/metrics"),
        "metrics path for direct scrapes",
    ),
    key(
        "namespace",
        All,
        Described("ScaledObject's"),
        "namespace of the vLLM pods (and of the `service`)",
    ),
    key(
        "model",
        All,
        Described("all models"),
        "vLLM `model_name` label to read",
    ),
    key(
        "metricLabels",
        All,
        Unset,
        "extra label matchers on every series, `job=vllm,tier=prod`",
    ),
    key(
        "namespaceLabel",
        Prometheus,
        Literal("namespace"),
        "Prometheus label holding the namespace",
    ),
    key(
        "podLabel",
        Prometheus,
        Literal("pod"),
        "Prometheus label holding the pod name (KV cache is averaged per pod)",
    ),
    key(
        "waitingTarget",
        All,
        Described("`5` with learned capacity"),
        "waiting requests per replica",
    ),
    key("runningTarget", All, Unset, "running requests per replica"),
    key(
        "kvCacheTarget",
        All,
        Unset,
        "KV-cache fraction (0–1] per replica",
    ),
    key(
        "generationTokensTarget",
        All,
        Unset,
        "generated tokens/s per replica",
    ),
    key(
        "promptTokensTarget",
        All,
        Unset,
        "prompt tokens/s per replica",
    ),
    key(
        "capacity",
        All,
        Described("`learned` without targets and `query`, else `off`"),
        "`learned`: token-rate targets from the capacity per replica the scaler learns from the \
         service's own metrics while requests queue (see Learned capacity; targets set by hand \
         win); `off`: set targets by hand",
    ),
    key(
        "capacityUtilization",
        All,
        Described("`0.6` (with learned capacity)"),
        "fraction (0–1] of the learned capacity per replica to scale token rates against",
    ),
    key(
        "query",
        Prometheus,
        Unset,
        "raw PromQL returning one element; replaces the signal targets",
    ),
    key(
        "queryTarget",
        Prometheus,
        Unset,
        "per-replica target for `query` (required with it): demand = value / queryTarget",
    ),
    key(
        "activationThreshold",
        All,
        Literal("0"),
        "`IsActive` is true when demand (replicas) is above this",
    ),
    key(
        "emptyResult",
        All,
        Literal("error"),
        "no series for the model: `error` (KEDA's `fallback` applies) or `zero` (no demand; for \
         models scaled to zero, which expose no metrics)",
    ),
    key(
        "rateWindow",
        All,
        Literal("60s"),
        "window of token rates (at least two scrapes for direct scrapes; max `1h`)",
    ),
    key(
        "forecast",
        All,
        Literal("off"),
        "`daily`: also report the demand this service's learned daily shape expects one \
         `forecastLead` ahead, when higher than the measured demand (see Forecast); `off`: none",
    ),
    key(
        "forecastLead",
        All,
        Described("`3m` (with `forecast`)"),
        "how far ahead the forecast looks (a replica's start-up; max `1h`; only with `forecast`)",
    ),
    key(
        "timeout",
        All,
        Literal("3s"),
        "bound on each upstream request (max `60s`)",
    ),
    key(
        "bearerToken",
        Prometheus,
        Unset,
        "Prometheus bearer token (not with `username`/`password`)",
    ),
    key(
        "username",
        Prometheus,
        Unset,
        "Prometheus basic-auth user (with `password`)",
    ),
    key(
        "password",
        Prometheus,
        Unset,
        "Prometheus basic-auth password (with `username`)",
    ),
    key(
        "customHeaders",
        Prometheus,
        Unset,
        "extra headers for Prometheus, `X-Scope-OrgID=tenant-1,X-Other=v`",
    ),
    key(
        "prometheusCaCert",
        Prometheus,
        Unset,
        "PEM CA bundle trusted for Prometheus (in addition to the system roots)",
    ),
    key(
        "prometheusUnsafeSsl",
        Prometheus,
        Literal("false"),
        "skip Prometheus certificate verification",
    ),
];

/// The table entry of a key.
pub fn find(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// The table as Markdown: key, applies to, default, meaning.
pub fn markdown() -> String {
    let mut out =
        String::from("| key | applies to | default | meaning |\n| --- | --- | --- | --- |\n");
    for k in KEYS {
        let default = match k.default {
            KeyDefault::Unset => String::new(),
            KeyDefault::Literal(v) => format!("`{v}`"),
            KeyDefault::Described(d) => d.to_string(),
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {default} | {} |",
            k.name,
            k.applies.label(),
            k.doc
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::core::demand::Signal;

    /// Markers around the generated table in `docs/scaler.md`.
    const START: &str = "<!-- metadata-keys:start -->";
    const END: &str = "<!-- metadata-keys:end -->";

    #[test]
    fn keys_are_unique_and_every_signal_target_is_one() {
        for (i, k) in KEYS.iter().enumerate() {
            assert!(
                KEYS[..i].iter().all(|other| other.name != k.name),
                "{} is in the table twice",
                k.name
            );
        }
        for signal in Signal::ALL {
            assert!(
                find(signal.target_key()).is_some(),
                "{} is not in the table",
                signal.target_key()
            );
        }
        for source in SourceKind::ALL {
            let key = find(source.key()).expect("source keys are in the table");
            assert!(key.applies.includes(source), "{}", key.name);
        }
    }

    #[test]
    fn documented_learned_defaults_are_the_constants() {
        let documented = |name: &str| match find(name).map(|k| k.default) {
            Some(KeyDefault::Described(d)) => d,
            other => panic!("{name}: {other:?}"),
        };
        assert!(
            documented("capacityUtilization")
                .starts_with(&format!("`{}`", crate::core::demand::DEFAULT_UTILIZATION))
        );
        assert!(
            documented("waitingTarget")
                .starts_with(&format!("`{}`", super::super::LEARNED_WAITING_TARGET))
        );
    }

    /// The table in `docs/scaler.md` is the rendered [`KEYS`]. `NIGHTSHIFT_BLESS=1` rewrites it.
    #[test]
    fn docs_show_the_key_table() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/scaler.md");
        let Ok(doc) = std::fs::read_to_string(&path) else {
            return;
        };
        let table = markdown();
        let bless = std::env::var("NIGHTSHIFT_BLESS").is_ok_and(|v| v == "1");
        let marked = doc.split_once(START).and_then(|(before, rest)| {
            let (current, after) = rest.split_once(END)?;
            Some((before, current, after))
        });
        let rewritten = match marked {
            Some((_, current, _)) if current.trim() == table.trim() => return,
            Some((before, _, after)) if bless => format!("{before}{START}\n{table}{END}{after}"),
            None if bless => format!("{}\n\n{START}\n{table}{END}\n", doc.trim_end()),
            Some((_, current, _)) => panic!(
                "the metadata key table in {} is not the one the scaler reads; rewrite it with \
                 NIGHTSHIFT_BLESS=1 cargo test --lib docs_show_the_key_table\n\
                 --- in the docs:\n{}\n--- rendered from keys::KEYS:\n{table}",
                path.display(),
                current.trim()
            ),
            None => panic!(
                "{} has no {START} … {END} markers around the metadata key table",
                path.display()
            ),
        };
        std::fs::write(&path, rewritten).expect("docs/scaler.md is writable");
    }
}
