//! Which upstreams a ScaledObject may make the scaler call: the source policy.
//!
//! Whoever may create a ScaledObject chooses its trigger metadata, and so where the scaler sends
//! requests. The author is untrusted: the scaler must not reach, on their behalf, what they
//! could not reach themselves (internal services, the cloud metadata address, other tenants'
//! pods). This module owns that decision as pure functions over the parsed source and the
//! operator's [`SourcePolicy`]; the scaler applies it before any request is made (already at
//! `GetMetricSpec`), and the scrape source applies [`SourcePolicy::check_ip`] again to the
//! addresses a Service's EndpointSlices name, which only the API server knows.
//!
//! Rules, each denial naming the rule and the flag that would allow it:
//! - a Prometheus `serverAddress` must be one of the allowed base URLs (or under one);
//! - a `service` must be in the ScaledObject's own namespace, unless the namespace is listed;
//! - `endpoints` (a static `host:port` list) are off unless enabled, and are IP literals only:
//!   a host name would be resolved when scraped, after this check, to whatever its DNS says;
//! - no loopback or unspecified address (the scaler's own pod) and no link-local address (the
//!   cloud metadata service at 169.254.169.254, fe80::/10) as a Prometheus host or scrape
//!   target, unless allowed.

use std::net::IpAddr;

use url::Url;

use super::{
    prometheus::Server,
    target::{Pods, Target},
};

/// Namespaces whose pods and Services a ScaledObject may scrape.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Namespaces {
    /// Only the ScaledObject's own namespace.
    #[default]
    Own,
    /// The ScaledObject's own namespace and these.
    Listed(Vec<String>),
    /// Any namespace.
    Any,
}

impl Namespaces {
    /// From the flag's list: empty means own only, a `*` entry means any.
    pub fn from_list(list: &[String]) -> Self {
        let list: Vec<String> = list
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if list.iter().any(|s| s == "*") {
            Namespaces::Any
        } else if list.is_empty() {
            Namespaces::Own
        } else {
            Namespaces::Listed(list)
        }
    }

    fn allows(&self, own: &str, target: &str) -> bool {
        target == own
            || match self {
                Namespaces::Own => false,
                Namespaces::Listed(list) => list.iter().any(|n| n == target),
                Namespaces::Any => true,
            }
    }
}

/// The operator's choices; the default denies everything dangerous.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourcePolicy {
    /// Allowed Prometheus base URLs: a `serverAddress` equal to one or under its path. A `*`
    /// entry allows any URL (the address rules still apply).
    pub prometheus: Vec<String>,
    /// Namespaces a `service` may be in.
    pub namespaces: Namespaces,
    /// Whether static `endpoints` lists are accepted.
    pub endpoints: bool,
    /// Whether loopback and unspecified addresses may be called.
    pub loopback: bool,
    /// Whether link-local addresses may be called.
    pub link_local: bool,
}

/// A source the policy does not allow: which rule refused it and which flag would allow it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("denied by the scaler's source policy ({rule}): {detail} (allowed with {flag})")]
pub struct Denied {
    /// The rule, in a few words.
    pub rule: &'static str,
    /// What was refused.
    pub detail: String,
    /// The flag an operator would set to allow it.
    pub flag: &'static str,
}

/// Flag names, as the denials quote them (and as `ScalerArgs` defines them).
pub const FLAG_PROMETHEUS: &str = "--scaler-allowed-prometheus";
pub const FLAG_NAMESPACES: &str = "--scaler-scrape-namespaces";
pub const FLAG_ENDPOINTS: &str = "--scaler-allow-endpoints";
pub const FLAG_LOOPBACK: &str = "--scaler-allow-loopback";
pub const FLAG_LINK_LOCAL: &str = "--scaler-allow-link-local";

impl SourcePolicy {
    /// Everything allowed: for tests and local development against processes on loopback.
    pub fn permissive() -> Self {
        Self {
            prometheus: vec!["*".into()],
            namespaces: Namespaces::Any,
            endpoints: true,
            loopback: true,
            link_local: true,
        }
    }

    /// Whether the scaler may query the Prometheus `server` for a ScaledObject.
    pub fn check_prometheus(&self, server: &Server) -> Result<(), Denied> {
        let deny = |rule, flag| Denied {
            rule,
            detail: format!("serverAddress {}", server.address),
            flag,
        };
        let Ok(url) = Url::parse(&server.address) else {
            return Err(deny("Prometheus not allowed", FLAG_PROMETHEUS));
        };
        // The allow-list first: an unlisted address is refused for that, whatever it is.
        let allowed = self.prometheus.iter().any(|entry| {
            let entry = entry.trim();
            entry == "*" || Url::parse(entry).is_ok_and(|base| under(&url, &base))
        });
        if !allowed {
            return Err(deny("Prometheus not allowed", FLAG_PROMETHEUS));
        }
        // Then the address rules, which hold even for a listed URL.
        match url.host() {
            Some(url::Host::Ipv4(ip)) => self.check_ip(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.check_ip(IpAddr::V6(ip)),
            Some(url::Host::Domain(name)) => self.check_name(name),
            None => Err(deny("Prometheus not allowed", FLAG_PROMETHEUS)),
        }
    }

    /// Whether the scaler may scrape `target` for a ScaledObject in `own_namespace`.
    pub fn check_scrape(&self, target: &Target, own_namespace: &str) -> Result<(), Denied> {
        match &target.pods {
            Pods::Service {
                namespace, name, ..
            } => {
                if self.namespaces.allows(own_namespace, namespace) {
                    Ok(())
                } else {
                    Err(Denied {
                        rule: "service outside the ScaledObject's namespace",
                        detail: format!(
                            "service {namespace}/{name} for a ScaledObject in {own_namespace}"
                        ),
                        flag: FLAG_NAMESPACES,
                    })
                }
            }
            Pods::Static(list) => {
                if !self.endpoints {
                    return Err(Denied {
                        rule: "static endpoints are off",
                        detail: "endpoints cannot be tied to a namespace's pods; use service"
                            .into(),
                        flag: FLAG_ENDPOINTS,
                    });
                }
                for endpoint in list {
                    let ip = endpoint_ip(endpoint).ok_or_else(|| Denied {
                        rule: "endpoints must be IP addresses",
                        detail: format!(
                            "{endpoint:?}: a host name resolves, when scraped, to whatever its \
                             DNS says"
                        ),
                        flag: "a service trigger",
                    })?;
                    self.check_ip(ip)?;
                }
                Ok(())
            }
        }
    }

    /// Whether the scaler may send a request to `ip`.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Denied> {
        let ip = ip.to_canonical();
        if (ip.is_loopback() || ip.is_unspecified()) && !self.loopback {
            return Err(Denied {
                rule: "loopback address",
                detail: ip.to_string(),
                flag: FLAG_LOOPBACK,
            });
        }
        if is_link_local(ip) && !self.link_local {
            return Err(Denied {
                rule: "link-local address",
                detail: ip.to_string(),
                flag: FLAG_LINK_LOCAL,
            });
        }
        Ok(())
    }

    /// Host names that always mean loopback (RFC 6761), whatever the resolver says.
    fn check_name(&self, name: &str) -> Result<(), Denied> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if (name == "localhost" || name.ends_with(".localhost")) && !self.loopback {
            return Err(Denied {
                rule: "loopback address",
                detail: name,
                flag: FLAG_LOOPBACK,
            });
        }
        Ok(())
    }
}

/// Whether `url` is `base` or under its path, on the same scheme, host and port. Compared as
/// parsed URLs, so `http://allowed:9090@elsewhere` (user info) is not mistaken for a prefix.
fn under(url: &Url, base: &Url) -> bool {
    if url.scheme() != base.scheme()
        || url.host_str() != base.host_str()
        || url.port_or_known_default() != base.port_or_known_default()
    {
        return false;
    }
    let base_path = base.path().trim_end_matches('/');
    let path = url.path();
    path.strip_prefix(base_path)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        // fe80::/10
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// The IP of an `ip:port` or `[ipv6]:port` endpoint; `None` for a host name.
pub fn endpoint_ip(endpoint: &str) -> Option<IpAddr> {
    endpoint
        .parse::<std::net::SocketAddr>()
        .ok()
        .map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::sources::prometheus::Auth;

    fn server(address: &str) -> Server {
        Server {
            address: address.into(),
            auth: Auth::None,
            headers: vec![],
            ca_cert: None,
            unsafe_ssl: false,
            timeout: Duration::from_secs(1),
        }
    }

    fn target(pods: Pods) -> Target {
        Target {
            pods,
            scheme: "http".into(),
            path: "/metrics".into(),
            timeout: Duration::from_secs(1),
            matchers: vec![],
            rate_window: Duration::from_secs(60),
        }
    }

    fn service(namespace: &str) -> Target {
        target(Pods::Service {
            namespace: namespace.into(),
            name: "vllm".into(),
            port: None,
        })
    }

    fn statics(list: &[&str]) -> Target {
        target(Pods::Static(list.iter().map(|s| s.to_string()).collect()))
    }

    fn platform() -> SourcePolicy {
        SourcePolicy {
            prometheus: vec!["http://prometheus.monitoring:9090".into()],
            ..SourcePolicy::default()
        }
    }

    #[test]
    fn prometheus_must_be_an_allowed_base_url_or_under_it() {
        let p = platform();
        assert_eq!(
            p.check_prometheus(&server("http://prometheus.monitoring:9090")),
            Ok(())
        );
        assert_eq!(
            p.check_prometheus(&server("http://Prometheus.monitoring:9090/prom")),
            Ok(())
        );
        for address in [
            "http://prometheus.monitoring:9091",
            "https://prometheus.monitoring:9090",
            "http://prometheus.monitoring:9090@attacker.example",
            "http://prometheus.monitoring:90900",
            "http://prometheus.monitoring.attacker.example:9090",
            "http://internal.admin:80",
            "not a url",
        ] {
            let denied = p.check_prometheus(&server(address)).expect_err(address);
            assert_eq!(denied.flag, FLAG_PROMETHEUS, "{address}");
        }
        let nested = SourcePolicy {
            prometheus: vec!["https://thanos.example/tenant-a/".into()],
            ..SourcePolicy::default()
        };
        assert!(
            nested
                .check_prometheus(&server("https://thanos.example/tenant-a/api"))
                .is_ok()
        );
        assert!(
            nested
                .check_prometheus(&server("https://thanos.example/tenant-ab"))
                .is_err()
        );
    }

    #[test]
    fn metadata_and_loopback_addresses_are_denied_even_when_listed() {
        let p = SourcePolicy {
            prometheus: vec!["*".into()],
            ..SourcePolicy::default()
        };
        for (address, flag) in [
            ("http://169.254.169.254/latest", FLAG_LINK_LOCAL),
            ("http://[fe80::1]:9090", FLAG_LINK_LOCAL),
            ("http://127.0.0.1:9090", FLAG_LOOPBACK),
            ("http://[::1]:9090", FLAG_LOOPBACK),
            ("http://0.0.0.0:9090", FLAG_LOOPBACK),
            ("http://[::ffff:127.0.0.1]:9090", FLAG_LOOPBACK),
            ("http://localhost:9090", FLAG_LOOPBACK),
            ("http://a.localhost.:9090", FLAG_LOOPBACK),
        ] {
            let denied = p.check_prometheus(&server(address)).expect_err(address);
            assert_eq!(denied.flag, flag, "{address}");
            assert!(denied.to_string().contains(flag), "{denied}");
        }
        assert!(
            p.check_prometheus(&server("http://10.0.0.7:9090")).is_ok(),
            "a pod IP is not special"
        );
        let dev = SourcePolicy {
            loopback: true,
            ..p
        };
        assert!(
            dev.check_prometheus(&server("http://127.0.0.1:9090"))
                .is_ok()
        );
        assert!(
            dev.check_prometheus(&server("http://169.254.169.254"))
                .is_err()
        );
    }

    #[test]
    fn services_stay_in_their_namespace_unless_listed() {
        let own = SourcePolicy::default();
        assert_eq!(own.check_scrape(&service("team-a"), "team-a"), Ok(()));
        let denied = own
            .check_scrape(&service("team-b"), "team-a")
            .expect_err("other namespace");
        assert_eq!(denied.flag, FLAG_NAMESPACES);
        assert!(denied.to_string().contains("team-b/vllm"), "{denied}");
        let listed = SourcePolicy {
            namespaces: Namespaces::from_list(&["team-b".into()]),
            ..SourcePolicy::default()
        };
        assert!(listed.check_scrape(&service("team-b"), "team-a").is_ok());
        assert!(listed.check_scrape(&service("team-c"), "team-a").is_err());
        let any = SourcePolicy {
            namespaces: Namespaces::from_list(&["x".into(), " * ".into()]),
            ..SourcePolicy::default()
        };
        assert!(any.check_scrape(&service("team-c"), "team-a").is_ok());
        assert_eq!(Namespaces::from_list(&[String::new()]), Namespaces::Own);
    }

    #[test]
    fn static_endpoints_are_off_by_default_and_ip_literals_only() {
        let denied = SourcePolicy::default()
            .check_scrape(&statics(&["10.0.0.7:8000"]), "team-a")
            .expect_err("off");
        assert_eq!(denied.flag, FLAG_ENDPOINTS);
        let on = SourcePolicy {
            endpoints: true,
            ..SourcePolicy::default()
        };
        assert!(
            on.check_scrape(&statics(&["10.0.0.7:8000", "[fd00::7]:8000"]), "a")
                .is_ok()
        );
        for (list, rule) in [
            (&["vllm.team-b:8000"][..], "endpoints must be IP addresses"),
            (&["10.0.0.7:8000", "127.0.0.1:8000"][..], "loopback address"),
            (&["169.254.169.254:80"][..], "link-local address"),
        ] {
            let denied = on.check_scrape(&statics(list), "a").expect_err(rule);
            assert_eq!(denied.rule, rule, "{list:?}");
        }
    }

    proptest! {
        /// No policy without the loopback and link-local flags lets any source reach a
        /// loopback, unspecified or link-local IPv4 address, whatever else it allows.
        #[test]
        fn dangerous_ipv4_is_never_reached_without_its_flag(
            kind in 0u8..4,
            last in any::<[u8; 2]>(),
            port in 1u16..,
            endpoints in any::<bool>(),
            any_namespace in any::<bool>(),
        ) {
            let ip = match kind {
                0 => [127, 0, last[0], last[1]],
                1 => [169, 254, last[0], last[1]],
                2 => [0, 0, 0, 0],
                _ => [127, last[0], 0, last[1]],
            };
            let ip = std::net::Ipv4Addr::from(ip);
            let policy = SourcePolicy {
                prometheus: vec!["*".into(), format!("http://{ip}:{port}")],
                namespaces: if any_namespace { Namespaces::Any } else { Namespaces::Own },
                endpoints,
                loopback: false,
                link_local: false,
            };
            let address = format!("http://{ip}:{port}");
            prop_assert!(policy.check_prometheus(&server(&address)).is_err());
            let endpoint = format!("{ip}:{port}");
            prop_assert!(policy.check_scrape(&statics(&[&endpoint]), "a").is_err());
            let mapped = format!("[::ffff:{ip}]:{port}");
            prop_assert!(policy.check_scrape(&statics(&[&mapped]), "a").is_err());
        }

        /// Only the listed base URL (or a path under it) passes the Prometheus allow-list.
        #[test]
        fn only_urls_under_an_allowed_base_pass(
            host in "[a-z]{1,8}(\\.[a-z]{1,8}){0,2}",
            port in 1u16..,
            suffix in "[a-z0-9@:./-]{0,12}",
        ) {
            let base = "http://prometheus.monitoring:9090".to_string();
            let policy = SourcePolicy { prometheus: vec![base.clone()], ..SourcePolicy::default() };
            let address = format!("http://{host}:{port}{suffix}");
            let allowed = policy.check_prometheus(&server(&address)).is_ok();
            if allowed {
                let url = Url::parse(&address).expect("allowed URLs parse");
                prop_assert_eq!(url.host_str(), Some("prometheus.monitoring"));
                prop_assert_eq!(url.port(), Some(9090));
            }
        }

        /// Services in the ScaledObject's own namespace are always allowed; others only when
        /// listed.
        #[test]
        fn service_namespaces(own in "[a-z]{1,6}", other in "[a-z]{1,6}", listed in any::<bool>()) {
            let policy = SourcePolicy {
                namespaces: if listed { Namespaces::Listed(vec![other.clone()]) } else { Namespaces::Own },
                ..SourcePolicy::default()
            };
            prop_assert!(policy.check_scrape(&service(&own), &own).is_ok());
            let allowed = policy.check_scrape(&service(&other), &own).is_ok();
            prop_assert_eq!(allowed, listed || other == own);
        }
    }
}
