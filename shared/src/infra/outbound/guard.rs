//! The checks behind the client: the exact allow-list, the URL check run
//! before every request and every redirect, and the filtering resolver.

use std::collections::HashSet;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use super::ranges::is_blocked;

/// An injected name lookup (tests); the default asks the system resolver.
pub type ResolveFn = dyn Fn(&str) -> Vec<IpAddr> + Send + Sync;

/// The marker error the resolver and the redirect policy hand to reqwest;
/// found again in the error's source chain and turned into
/// `OutboundError::Blocked`.
#[derive(Debug)]
pub(crate) struct Refused(pub(crate) String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// A URL's host: an IP address (already normalised by the WHATWG parser:
/// `2130706433`, `0177.0.0.1`, `0x7f.1` are all 127.0.0.1) or a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HostKind {
    Ip(IpAddr),
    Name(String),
}

fn host_kind(url: &Url) -> Option<HostKind> {
    let host = url.host_str()?;
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inner.parse().ok().map(HostKind::Ip);
    }
    // For special schemes the parser turns every IPv4 spelling into the
    // dotted quad, and a name can never look like one.
    if let Ok(ip) = host.parse::<std::net::Ipv4Addr>() {
        return Some(HostKind::Ip(IpAddr::V4(ip)));
    }
    Some(HostKind::Name(host.to_ascii_lowercase()))
}

/// The allow-list, parsed. Entries are exact: no suffix or wildcard matching.
#[derive(Debug, Default)]
pub(crate) struct AllowList {
    ips: HashSet<IpAddr>,
    ip_ports: HashSet<(IpAddr, u16)>,
    hosts: HashSet<String>,
    host_ports: HashSet<(String, u16)>,
}

enum Listed {
    Yes,
    /// The name is only listed with other ports.
    OtherPort,
    No,
}

impl AllowList {
    pub(crate) fn parse(entries: &[String]) -> Result<Self, String> {
        let mut list = AllowList::default();
        for raw in entries {
            let entry = raw.trim();
            if entry.is_empty() {
                continue;
            }
            let bad = |why: &str| Err(format!("allow-list entry {entry:?}: {why}"));
            if entry.contains(['*', '/', '@', '?', '#', ' ', ',']) {
                return bad("expected an exact host, IP address or host:port (no wildcards, paths or credentials)");
            }
            if let Ok(ip) = entry.parse::<IpAddr>() {
                list.ips.insert(ip);
                continue;
            }
            if let Ok(sa) = entry.parse::<SocketAddr>() {
                list.ip_ports.insert((sa.ip(), sa.port()));
                continue;
            }
            if let Some(inner) = entry.strip_prefix('[').and_then(|e| e.strip_suffix(']')) {
                match inner.parse::<std::net::Ipv6Addr>() {
                    Ok(ip) => {
                        list.ips.insert(IpAddr::V6(ip));
                        continue;
                    }
                    Err(_) => return bad("not an IPv6 address"),
                }
            }
            let (host, port) = match entry.rsplit_once(':') {
                Some((h, p)) => match p.parse::<u16>() {
                    Ok(p) if !h.contains(':') => (h, Some(p)),
                    _ => return bad("bad port"),
                },
                None => (entry, None),
            };
            let url = Url::parse(&format!("http://{host}/")).map_err(|e| format!("allow-list entry {entry:?}: {e}"))?;
            match (host_kind(&url), port) {
                (Some(HostKind::Ip(ip)), None) => {
                    list.ips.insert(ip);
                }
                (Some(HostKind::Ip(ip)), Some(p)) => {
                    list.ip_ports.insert((ip, p));
                }
                (Some(HostKind::Name(name)), None) => {
                    list.hosts.insert(name);
                }
                (Some(HostKind::Name(name)), Some(p)) => {
                    list.host_ports.insert((name, p));
                }
                (None, _) => return bad("no host"),
            }
        }
        Ok(list)
    }

    fn url_listed(&self, host: &HostKind, port: u16) -> Listed {
        match host {
            HostKind::Ip(ip) => {
                if self.ips.contains(ip) || self.ip_ports.contains(&(*ip, port)) {
                    Listed::Yes
                } else {
                    Listed::No
                }
            }
            HostKind::Name(name) => {
                if self.hosts.contains(name) || self.host_ports.contains(&(name.clone(), port)) {
                    Listed::Yes
                } else if self.host_ports.iter().any(|(h, _)| h == name) {
                    Listed::OtherPort
                } else {
                    Listed::No
                }
            }
        }
    }

    /// At resolution time the port is unknown; the URL check has already
    /// refused a `host:port`-listed name on another port.
    fn name_listed(&self, name: &str) -> bool {
        self.hosts.contains(name) || self.host_ports.iter().any(|(h, _)| h == name)
    }

    /// A resolved address is let through only by a plain IP entry: an
    /// `ip:port` entry cannot be honoured here since the port is unknown.
    fn resolved_ip_listed(&self, ip: &IpAddr) -> bool {
        self.ips.contains(ip)
    }
}

/// The policy state shared by the pre-request check, the redirect policy and
/// the resolver.
pub(crate) struct Guard {
    pub(crate) allow_http: bool,
    pub(crate) allow: AllowList,
    pub(crate) lookup: Option<Arc<ResolveFn>>,
}

impl Guard {
    /// Scheme, credentials, allow-list and literal-IP checks: everything that
    /// can be decided from the URL alone. `Err` is the reason, safe to show
    /// (it names the host, never the path or query).
    pub(crate) fn check_url(&self, url: &Url) -> Result<(), String> {
        match url.scheme() {
            "https" => {}
            "http" if self.allow_http => {}
            "http" => return Err("plain http:// is not allowed (https only)".into()),
            other => return Err(format!("scheme {other}: is not allowed")),
        }
        let host = host_kind(url).ok_or_else(|| "URL has no host".to_string())?;
        let shown = url.host_str().unwrap_or_default();
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!("URL for {shown} carries credentials"));
        }
        let port = url.port_or_known_default().unwrap_or(443);
        match (self.allow.url_listed(&host, port), &host) {
            (Listed::Yes, _) => Ok(()),
            (Listed::OtherPort, _) => Err(format!("{shown} is allow-listed only on other ports")),
            (Listed::No, HostKind::Ip(ip)) => match is_blocked(*ip) {
                Some(why) => Err(format!("{shown} is in a blocked range: {why}")),
                None => Ok(()),
            },
            // Names are checked at every resolution, by the resolver.
            (Listed::No, HostKind::Name(_)) => Ok(()),
        }
    }

    /// Keeps the addresses `name` may be contacted at; an error when none is
    /// left. `name` comes from the resolver, so it is matched exactly.
    pub(crate) fn filter(&self, name: &str, addrs: Vec<IpAddr>) -> Result<Vec<IpAddr>, Refused> {
        if self.allow.name_listed(name) {
            return Ok(addrs);
        }
        let kept: Vec<IpAddr> =
            addrs.iter().copied().filter(|ip| is_blocked(*ip).is_none() || self.allow.resolved_ip_listed(ip)).collect();
        if kept.is_empty() && !addrs.is_empty() {
            return Err(Refused(format!("{name} resolves only to blocked addresses")));
        }
        if addrs.len() != kept.len() {
            tracing::debug!(host = name, dropped = addrs.len() - kept.len(), "outbound: dropped blocked addresses");
        }
        Ok(kept)
    }

    /// Looks `name` up (injected or system resolver) and filters the answer.
    pub(crate) async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, ResolveError> {
        let name = name.to_ascii_lowercase();
        // A name the URL parser would have read as an IP (e.g. `0x7f.1` in a
        // redirect that bypassed it) is treated as that IP, never looked up.
        let literal = Url::parse(&format!("http://{name}/")).ok().and_then(|u| match host_kind(&u) {
            Some(HostKind::Ip(ip)) => Some(ip),
            _ => None,
        });
        let addrs = match (literal, &self.lookup) {
            (Some(ip), _) => vec![ip],
            (None, Some(f)) => f(&name),
            (None, None) => tokio::net::lookup_host((name.as_str(), 0))
                .await
                .map_err(|_| ResolveError::Lookup(format!("cannot resolve {name}")))?
                .map(|sa| sa.ip())
                .collect(),
        };
        if addrs.is_empty() {
            return Err(ResolveError::Lookup(format!("{name} has no addresses")));
        }
        self.filter(&name, addrs).map_err(ResolveError::Refused)
    }
}

#[derive(Debug)]
pub(crate) enum ResolveError {
    Refused(Refused),
    Lookup(String),
}

impl std::fmt::Display for ResolveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResolveError::Refused(r) => r.fmt(f),
            ResolveError::Lookup(m) => f.write_str(m),
        }
    }
}

/// The `dns_resolver` given to reqwest: every lookup goes through the filter.
pub(crate) struct FilteringResolver(pub(crate) Arc<Guard>);

impl Resolve for FilteringResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = self.0.clone();
        let name = name.as_str().to_string();
        let fut: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin(async move {
            match guard.resolve(&name).await {
                Ok(ips) => Ok(Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0))) as Addrs),
                Err(ResolveError::Refused(r)) => Err(Box::new(r) as Box<dyn std::error::Error + Send + Sync>),
                Err(ResolveError::Lookup(m)) => {
                    Err(Box::new(std::io::Error::new(std::io::ErrorKind::NotFound, m)) as _)
                }
            }
        });
        fut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(allow: &[&str], allow_http: bool) -> Guard {
        let entries: Vec<String> = allow.iter().map(|s| s.to_string()).collect();
        Guard { allow_http, allow: AllowList::parse(&entries).unwrap(), lookup: None }
    }

    fn check(g: &Guard, url: &str) -> Result<(), String> {
        g.check_url(&Url::parse(url).unwrap())
    }

    #[test]
    fn whatwg_normalises_ipv4_spellings() {
        for s in [
            "http://2130706433/",
            "http://0177.0.0.1/",
            "http://0x7f.1/",
            "http://0x7f000001/",
            "http://127.1/",
            "http://017700000001/",
            "http://0x7F.0.0.1/",
            "http://127.0.0.1./",
        ] {
            let u = Url::parse(s).unwrap();
            assert_eq!(u.host_str(), Some("127.0.0.1"), "{s}");
            assert_eq!(host_kind(&u), Some(HostKind::Ip("127.0.0.1".parse().unwrap())), "{s}");
        }
        let u = Url::parse("http://[::ffff:127.0.0.1]/").unwrap();
        assert_eq!(host_kind(&u), Some(HostKind::Ip("::ffff:7f00:1".parse().unwrap())));
        let u = Url::parse("http://LocalHost./").unwrap();
        assert_eq!(host_kind(&u), Some(HostKind::Name("localhost.".into())));
    }

    #[test]
    fn allow_list_entries() {
        let l = AllowList::parse(&[
            " 127.0.0.1 ".into(),
            "::1".into(),
            "[fd00::1]".into(),
            "10.0.0.1:8080".into(),
            "[fe80::1]:443".into(),
            "Facilitator.Internal".into(),
            "api.example.com:8443".into(),
            "".into(),
        ])
        .unwrap();
        assert!(l.ips.contains(&"127.0.0.1".parse().unwrap()));
        assert!(l.ips.contains(&"::1".parse().unwrap()));
        assert!(l.ips.contains(&"fd00::1".parse().unwrap()));
        assert!(l.ip_ports.contains(&("10.0.0.1".parse().unwrap(), 8080)));
        assert!(l.ip_ports.contains(&("fe80::1".parse().unwrap(), 443)));
        assert!(l.hosts.contains("facilitator.internal"));
        assert!(l.host_ports.contains(&("api.example.com".into(), 8443)));
        for bad in ["*.example.com", "example.com/path", "user@example.com", "host:notaport", "[zz]", "a b"] {
            assert!(AllowList::parse(&[bad.into()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn url_checks() {
        let g = guard(&["127.0.0.1", "10.0.0.1:8080", "api.example.com:8443", "example.com"], false);
        assert!(check(&g, "https://127.0.0.1/").is_ok());
        assert!(check(&g, "https://2130706433/").is_ok()); // the same address
        assert!(check(&g, "https://127.0.0.2/").is_err());
        assert!(check(&g, "https://10.0.0.1:8080/").is_ok());
        assert!(check(&g, "https://10.0.0.1/").is_err());
        assert!(check(&g, "https://api.example.com:8443/").is_ok());
        assert!(check(&g, "https://api.example.com/").unwrap_err().contains("other ports"));
        assert!(check(&g, "https://evil-example.com/").is_ok()); // not listed: left to the resolver
        assert!(check(&g, "http://example.com/").unwrap_err().contains("https only"));
        assert!(check(&g, "ftp://example.com/").unwrap_err().contains("scheme ftp"));
        assert!(check(&g, "https://u:p@example.com/").unwrap_err().contains("credentials"));
        let msg = check(&g, "https://169.254.169.254/latest/meta-data/?token=SECRET").unwrap_err();
        assert!(msg.contains("169.254.169.254") && !msg.contains("SECRET") && !msg.contains("meta-data"), "{msg}");
    }

    #[test]
    fn filter_keeps_public_drops_private() {
        let g = guard(&[], true);
        let public: IpAddr = "93.184.216.34".parse().unwrap();
        let private: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(g.filter("mixed.test", vec![public, private]).unwrap(), vec![public]);
        assert_eq!(g.filter("mixed.test", vec![private, public]).unwrap(), vec![public]);
        let e = g.filter("inner.test", vec![private, "127.0.0.1".parse().unwrap()]).unwrap_err();
        assert_eq!(e.0, "inner.test resolves only to blocked addresses");
    }

    #[test]
    fn filter_honours_exact_allow_list() {
        let g = guard(&["127.0.0.1", "internal.test", "10.9.9.9:80"], true);
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let lo2: IpAddr = "127.0.0.2".parse().unwrap();
        let ten: IpAddr = "10.9.9.9".parse().unwrap();
        assert_eq!(g.filter("any.test", vec![lo, lo2]).unwrap(), vec![lo]);
        assert!(g.filter("any.test", vec![ten]).is_err()); // ip:port does not cover resolutions
        assert_eq!(g.filter("internal.test", vec![ten]).unwrap(), vec![ten]);
        assert!(g.filter("internal.test.", vec![ten]).is_err());
        assert!(g.filter("xinternal.test", vec![ten]).is_err());
        assert!(g.filter("sub.internal.test", vec![ten]).is_err());
    }
}
