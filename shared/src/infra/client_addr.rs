//! Who a request comes from, as an address: the client a limit counts
//! (the login limits, the relay's caps on open streams). Pure functions of
//! the request, so every build that limits anything has them.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use axum::extract::ConnectInfo;
use axum::http::{Extensions, HeaderMap};

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

/// The client an address belongs to: an IPv4 address (an IPv4-mapped IPv6
/// address counts as its IPv4 address), or an IPv6 /64.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
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
    use axum::http::HeaderValue;

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
    fn an_ipv6_slash_64_is_one_client() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff:1:2:3".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(client_key(a), client_key(b));
        assert_ne!(client_key(a), client_key(c));
        assert_eq!(client_key(a), "2001:db8:1:2::".parse::<IpAddr>().unwrap());
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(client_key(mapped), "192.0.2.7".parse::<IpAddr>().unwrap());
        let v4: IpAddr = "192.0.2.8".parse().unwrap();
        assert_eq!(client_key(v4), v4);
    }
}
