//! Who a request comes from, as an address: the client a limit counts
//! (the login limits, the relay's caps on open streams). Pure functions of
//! the request, so every build that limits anything has them.
//!
//! Behind the template's optional CloudFront edge (with its WAF), every
//! request reaches API Gateway from CloudFront, so `sourceIp` is one of
//! CloudFront's addresses, shared by every viewer of an edge. The edge's
//! viewer-request function then says who the viewer was
//! ([`VIEWER_ADDRESS_HEADER`]), and CloudFront adds an origin header holding
//! a secret only it and the functions know ([`EDGE_SECRET_HEADER`]). The
//! viewer address is believed only beside that secret: anyone can reach API
//! Gateway's own URL around CloudFront and send a viewer address of their
//! choosing ([`client_behind`]).
//!
//! Why a header of Reeve's own rather than CloudFront's
//! `CloudFront-Viewer-Address`: CloudFront adds its own headers only where
//! an origin request policy names them, and the one kind of policy that
//! does (`allViewerAndWhitelistCloudFront`) also forwards the viewer's
//! `Host`, which API Gateway refuses; the managed AllViewerExceptHostHeader
//! policy forwards the viewer's headers but none of CloudFront's. A
//! function's header is a viewer header, which that policy forwards.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::ConnectInfo;
use axum::http::{Extensions, HeaderMap};
use ipnet::IpNet;
use subtle::ConstantTimeEq;

/// The origin header the CloudFront edge adds to every request it forwards,
/// holding the edge's secret (`REEVE_EDGE_SECRET`, from Secrets Manager).
/// CloudFront replaces a viewer's own header of that name.
pub const EDGE_SECRET_HEADER: &str = "x-reeve-edge-secret";

/// The viewer's address as CloudFront saw it, alone (`198.51.100.10`,
/// `2001:db8::8a2e:370:7334`): what the template's viewer-request function
/// writes from `event.viewer.ip`, in place of any the viewer sent.
pub const VIEWER_ADDRESS_HEADER: &str = "x-reeve-viewer-address";

/// The secret CloudFront's origin header carries. Compared in constant
/// time; never shown (`Debug` is redacted).
#[derive(Clone)]
pub struct EdgeSecret(Arc<[u8]>);

impl EdgeSecret {
    pub fn new(value: &str) -> EdgeSecret {
        EdgeSecret(value.as_bytes().into())
    }

    /// Whether `headers` carry exactly one edge header, holding this secret.
    fn vouches_for(&self, headers: &HeaderMap) -> bool {
        let mut sent = headers.get_all(EDGE_SECRET_HEADER).iter();
        match (sent.next(), sent.next()) {
            (Some(value), None) => bool::from(value.as_bytes().ct_eq(&self.0)),
            _ => false,
        }
    }
}

impl PartialEq for EdgeSecret {
    fn eq(&self, other: &Self) -> bool {
        bool::from(self.0.ct_eq(&other.0))
    }
}

impl Eq for EdgeSecret {}

impl std::fmt::Debug for EdgeSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EdgeSecret(redacted)")
    }
}

/// The client a request comes from, for its budget. With the edge's secret
/// `edge` configured and sent alongside, the viewer address CloudFront
/// forwarded; in every other case (no edge, no secret or a wrong one, a
/// viewer address that does not parse) the address as the transport saw it
/// ([`client_of`]), whatever [`VIEWER_ADDRESS_HEADER`] says.
pub fn client_behind(edge: Option<&EdgeSecret>, headers: &HeaderMap, extensions: &Extensions) -> Option<IpAddr> {
    edge.filter(|edge| edge.vouches_for(headers))
        .and_then(|_| viewer_address(headers))
        .or_else(|| client_of(extensions))
}

/// The one [`VIEWER_ADDRESS_HEADER`] of `headers`, as an address: a bare
/// IPv4 or IPv6 address, nothing else (no port, no list).
fn viewer_address(headers: &HeaderMap) -> Option<IpAddr> {
    let mut sent = headers.get_all(VIEWER_ADDRESS_HEADER).iter();
    let (Some(value), None) = (sent.next(), sent.next()) else { return None };
    value.to_str().ok()?.trim().parse().ok()
}

/// The address a request came from, as its transport saw it: the TCP peer
/// (`reeve serve`, served with its connect info), or on Lambda API
/// Gateway's `requestContext.http.sourceIp` (the address that connected to
/// API Gateway, which no client header can change). `None` when neither
/// is known (a test's in-process request): such a request is not limited.
pub fn client_of(extensions: &Extensions) -> Option<IpAddr> {
    if let Some(ConnectInfo(peer)) = extensions.get::<ConnectInfo<SocketAddr>>() {
        return Some(peer.ip());
    }
    #[cfg(feature = "api-auth")]
    if let Some(lambda_http::request::RequestContext::ApiGatewayV2(context)) =
        extensions.get::<lambda_http::request::RequestContext>()
    {
        return context.http.source_ip.as_deref().and_then(|ip| ip.parse().ok());
    }
    None
}

/// How wide a network counts as one client: an IPv4 prefix and an IPv6
/// prefix, in bits. One holder commonly has a whole IPv6 network (a home
/// line gets a /56, a server a /64, a company a /48), so counting IPv6 per
/// address, or even per /64, hands one holder thousands of budgets; an IPv4
/// address is scarce, and many users share one behind a NAT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientPrefixes {
    /// 0..=32.
    pub v4: u8,
    /// 0..=128.
    pub v6: u8,
}

impl ClientPrefixes {
    /// Each IPv4 address, each IPv6 /56.
    pub const DEFAULT: ClientPrefixes = ClientPrefixes { v4: 32, v6: 56 };

    /// The network `ip` belongs to, as one client (an IPv4-mapped IPv6
    /// address counts as its IPv4 address). A prefix longer than the
    /// address's bits is taken as the whole address.
    pub fn network(&self, ip: IpAddr) -> IpNet {
        let ip = ip.to_canonical();
        let prefix = match ip {
            IpAddr::V4(_) => self.v4.min(32),
            IpAddr::V6(_) => self.v6.min(128),
        };
        IpNet::new(ip, prefix).expect("a prefix within the address's bits").trunc()
    }
}

impl Default for ClientPrefixes {
    fn default() -> Self {
        ClientPrefixes::DEFAULT
    }
}

/// The client an address belongs to by the default prefixes (an IPv4
/// address, an IPv6 /56), as its network's first address: what the relay's
/// caps on open streams count.
pub fn client_key(ip: IpAddr) -> IpAddr {
    ClientPrefixes::DEFAULT.network(ip).network()
}

/// The client behind `proxy_hops` proxies that each append the address they
/// saw to `X-Forwarded-For`, as an AWS load balancer does: the
/// `proxy_hops`-th entry from the right. Entries further left were written
/// by whoever sent the request, so they prove nothing and are never taken,
/// however many there are. With no hops, no header, or an entry that is not
/// an address (which a trusted proxy never writes), the TCP peer.
///
/// Every `X-Forwarded-For` line counts, in order, as one list: a second line
/// is the same header continued.
pub fn client_ip(headers: &HeaderMap, peer: Option<IpAddr>, proxy_hops: usize) -> Option<IpAddr> {
    if proxy_hops == 0 {
        return peer;
    }
    let entries: Vec<&str> = headers
        .get_all(X_FORWARDED_FOR)
        .iter()
        .filter_map(|line| line.to_str().ok())
        .flat_map(|line| line.split(','))
        .map(str::trim)
        .collect();
    // Fewer entries than proxies: the request skipped an outer one, and the
    // left-most entry is the one the innermost proxy wrote.
    let Some(entry) = entries.get(entries.len() - proxy_hops.min(entries.len())) else {
        return peer;
    };
    parse_forwarded(entry).or(peer)
}

/// An address as a proxy writes it: `192.0.2.1`, `2001:db8::1`, or with a
/// port (`192.0.2.1:4711`, `[2001:db8::1]:4711`).
fn parse_forwarded(entry: &str) -> Option<IpAddr> {
    entry.parse::<IpAddr>().ok().or_else(|| entry.parse::<SocketAddr>().ok().map(|a| a.ip()))
}

const X_FORWARDED_FOR: &str = "x-forwarded-for";

#[cfg(test)]
mod tests {
    use axum::http::{HeaderName, HeaderValue};

    use super::*;

    #[test]
    fn the_client_is_the_entry_the_trusted_proxy_added() {
        let peer: IpAddr = "10.0.0.5".parse().unwrap();
        let headers = |lines: &[&str]| {
            let mut map = HeaderMap::new();
            for line in lines {
                map.append(X_FORWARDED_FOR, HeaderValue::from_str(line).unwrap());
            }
            map
        };
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        // (header lines, hops, client)
        let cases: &[(&[&str], usize, Option<IpAddr>)] = &[
            // Without trusted proxies the header is the client's own words.
            (&["203.0.113.9"], 0, Some(peer)),
            (&["203.0.113.9"], 1, ip("203.0.113.9")),
            // A client's forged entries are left of the ALB's.
            (&["1.1.1.1, 2.2.2.2, 203.0.113.9"], 1, ip("203.0.113.9")),
            (&["1.1.1.1", "203.0.113.9"], 1, ip("203.0.113.9")),
            (&["1.1.1.1, 2.2.2.2, 203.0.113.9"], 2, ip("2.2.2.2")),
            (&["garbage, 203.0.113.9"], 1, ip("203.0.113.9")),
            (&["[2001:db8::7]:4711"], 1, ip("2001:db8::7")),
            (&["203.0.113.9:4711"], 1, ip("203.0.113.9")),
            // Fewer entries than proxies: the innermost proxy's.
            (&["203.0.113.9"], 2, ip("203.0.113.9")),
            // Nothing a proxy would write: the peer.
            (&[], 1, Some(peer)),
            (&["not-an-address"], 1, Some(peer)),
            (&["1.1.1.1, "], 1, Some(peer)),
        ];
        for (lines, hops, client) in cases {
            assert_eq!(client_ip(&headers(lines), Some(peer), *hops), *client, "{lines:?} behind {hops}");
        }
    }

    #[test]
    fn the_viewer_address_is_believed_only_beside_the_edge_s_secret() {
        let source: IpAddr = "192.0.2.200".parse().unwrap();
        let mut extensions = Extensions::new();
        extensions.insert(ConnectInfo(SocketAddr::new(source, 443)));
        let edge = EdgeSecret::new("the-edge-secret-of-this-deployment-0123456789");
        let headers = |pairs: &[(&str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(value).unwrap());
            }
            map
        };
        let secret = (EDGE_SECRET_HEADER, "the-edge-secret-of-this-deployment-0123456789");
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        // (the edge configured?, headers, client)
        type Case<'a> = (bool, &'a [(&'a str, &'a str)], Option<IpAddr>);
        let cases: &[Case] = &[
            // What the edge's function writes: the viewer's address, alone.
            (true, &[secret, (VIEWER_ADDRESS_HEADER, "198.51.100.10")], ip("198.51.100.10")),
            (true, &[secret, (VIEWER_ADDRESS_HEADER, "2001:db8::8a2e:370:7334")], ip("2001:db8::8a2e:370:7334")),
            (true, &[secret, (VIEWER_ADDRESS_HEADER, " 2001:db8::7 ")], ip("2001:db8::7")),
            // Forged: no secret, a wrong one, one of another length, two of them.
            (true, &[(VIEWER_ADDRESS_HEADER, "198.51.100.10")], Some(source)),
            (true, &[(EDGE_SECRET_HEADER, "guess"), (VIEWER_ADDRESS_HEADER, "198.51.100.10")], Some(source)),
            (
                true,
                &[
                    (EDGE_SECRET_HEADER, "the-edge-secret-of-this-deployment-0123456788"),
                    (VIEWER_ADDRESS_HEADER, "198.51.100.10"),
                ],
                Some(source),
            ),
            (true, &[secret, secret, (VIEWER_ADDRESS_HEADER, "198.51.100.10")], Some(source)),
            // No edge configured: the header is nobody's word, secret or not.
            (false, &[secret, (VIEWER_ADDRESS_HEADER, "198.51.100.10")], Some(source)),
            // Nothing the edge's function would write: the transport's address.
            (true, &[secret], Some(source)),
            (true, &[secret, (VIEWER_ADDRESS_HEADER, "198.51.100.10:46532")], Some(source)),
            (true, &[secret, (VIEWER_ADDRESS_HEADER, "[2001:db8::7]:4711")], Some(source)),
            (true, &[secret, (VIEWER_ADDRESS_HEADER, "198.51.100")], Some(source)),
            (true, &[secret, (VIEWER_ADDRESS_HEADER, "198.51.100.10, 203.0.113.1")], Some(source)),
            (true, &[secret, (VIEWER_ADDRESS_HEADER, "example.com")], Some(source)),
            (
                true,
                &[secret, (VIEWER_ADDRESS_HEADER, "198.51.100.10"), (VIEWER_ADDRESS_HEADER, "203.0.113.1")],
                Some(source),
            ),
        ];
        for (configured, pairs, client) in cases {
            let edge = configured.then_some(&edge);
            assert_eq!(client_behind(edge, &headers(pairs), &extensions), *client, "{pairs:?}, edge {configured}");
        }
        assert_eq!(format!("{edge:?}"), "EdgeSecret(redacted)");
    }

    #[test]
    fn one_network_is_one_client() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let defaults = ClientPrefixes::DEFAULT;
        let wide = ClientPrefixes { v4: 24, v6: 48 };
        // (prefixes, one address, another, the same client?)
        let cases = [
            // IPv6: one /56 is one client, whatever its /64s.
            (defaults, "2001:db8:1:200::1", "2001:db8:1:2ff:ffff:1:2:3", true),
            (defaults, "2001:db8:1:2aa::1", "2001:db8:1:2aa::2", true),
            (defaults, "2001:db8:1:200::1", "2001:db8:1:300::1", false),
            (defaults, "2001:db8:1:2ff::1", "2001:db8:1:300::1", false),
            // IPv4: each address is a client; a mapped address is its IPv4 one.
            (defaults, "192.0.2.7", "192.0.2.7", true),
            (defaults, "192.0.2.7", "192.0.2.8", false),
            (defaults, "::ffff:192.0.2.7", "192.0.2.7", true),
            // Other prefixes, other networks.
            (wide, "192.0.2.7", "192.0.2.200", true),
            (wide, "192.0.2.7", "192.0.3.7", false),
            (wide, "2001:db8:1:ff00::1", "2001:db8:1:1::1", true),
            (wide, "2001:db8:1::1", "2001:db8:2::1", false),
        ];
        for (prefixes, a, b, same) in cases {
            assert_eq!(prefixes.network(ip(a)) == prefixes.network(ip(b)), same, "{a} and {b} by {prefixes:?}");
        }
        assert_eq!(defaults.network(ip("2001:db8:1:2aa::1")).to_string(), "2001:db8:1:200::/56");
        assert_eq!(defaults.network(ip("::ffff:192.0.2.7")).to_string(), "192.0.2.7/32");
        assert_eq!(client_key(ip("2001:db8:1:2aa::1")), ip("2001:db8:1:200::"));
    }
}
