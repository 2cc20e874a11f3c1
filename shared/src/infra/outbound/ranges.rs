//! The address ranges the outbound client never contacts: loopback, private,
//! link-local, carrier-grade NAT, unspecified, documentation, multicast,
//! IPv4-mapped and NAT64 IPv6, unique-local, and the other special-purpose
//! blocks. One pure function, no I/O; the allow-list is applied by the caller.
//!
//! The table is CIDR text so it can be read line by line against the IANA
//! IPv4 and IPv6 Special-Purpose Address Registries
//! (<https://www.iana.org/assignments/iana-ipv4-special-registry>,
//! <https://www.iana.org/assignments/iana-ipv6-special-registry>) and the
//! multicast registries. Every block there whose "Globally Reachable" column
//! is not plainly "True" is listed, plus multicast, broadcast and the
//! reserved 240.0.0.0/4. Blocks IANA marks globally reachable (for example
//! 192.31.196.0/24 AS112 or 2001:4:112::/48) are not blocked on purpose.

use std::net::IpAddr;
use std::sync::LazyLock;

use ipnet::IpNet;

/// `(CIDR, reason)`, each with its RFC alongside. Lookup takes the first match, so a more specific
/// block comes before the block that contains it; its reason is then the
/// precise one (Teredo before the IETF 2001::/23 assignment, IPv4-mapped
/// before IPv4-compatible ::/96).
const BLOCKED: &[(&str, &str)] = &[
    // IPv4
    ("255.255.255.255/32", "broadcast"),           // RFC 919 limited broadcast
    ("0.0.0.0/8", "\"this network\" (0.0.0.0/8)"), // RFC 791
    ("10.0.0.0/8", "private (10.0.0.0/8)"),        // RFC 1918
    ("100.64.0.0/10", "carrier-grade NAT (100.64.0.0/10)"), // RFC 6598
    ("127.0.0.0/8", "loopback (127.0.0.0/8)"),     // RFC 1122
    ("169.254.0.0/16", "link-local (169.254.0.0/16)"), // RFC 3927; cloud metadata
    ("172.16.0.0/12", "private (172.16.0.0/12)"),  // RFC 1918
    ("192.0.0.0/24", "IETF protocol assignments (192.0.0.0/24)"), // RFC 6890
    ("192.0.2.0/24", "documentation (192.0.2.0/24)"), // RFC 5737 TEST-NET-1
    ("192.88.99.0/24", "6to4 relay anycast (192.88.99.0/24)"), // RFC 7526, deprecated
    ("192.168.0.0/16", "private (192.168.0.0/16)"), // RFC 1918
    ("198.18.0.0/15", "benchmarking (198.18.0.0/15)"), // RFC 2544
    ("198.51.100.0/24", "documentation (198.51.100.0/24)"), // RFC 5737 TEST-NET-2
    ("203.0.113.0/24", "documentation (203.0.113.0/24)"), // RFC 5737 TEST-NET-3
    ("224.0.0.0/4", "multicast (224.0.0.0/4)"),    // RFC 5771
    ("240.0.0.0/4", "reserved (240.0.0.0/4)"),     // RFC 1112
    // IPv6
    ("::/128", "unspecified (::)"), // RFC 4291
    ("::1/128", "loopback (::1)"),  // RFC 4291
    // Whatever IPv4 address it embeds, public or not: a mapped address is a
    // way to reach IPv4 through an IPv6 socket and has no business here.
    ("::ffff:0:0/96", "IPv4-mapped (::ffff:0:0/96)"),         // RFC 4291
    ("::ffff:0:0:0/96", "IPv4-translated (::ffff:0:0:0/96)"), // RFC 2765
    ("::/96", "IPv4-compatible (::/96)"),                     // RFC 4291, deprecated
    ("64:ff9b::/96", "NAT64 (64:ff9b::/96)"),                 // RFC 6052
    ("64:ff9b:1::/48", "local NAT64 (64:ff9b:1::/48)"),       // RFC 8215
    ("100::/64", "discard-only (100::/64)"),                  // RFC 6666
    ("2001:db8::/32", "documentation (2001:db8::/32)"),       // RFC 3849
    ("2001::/32", "Teredo (2001::/32)"),                      // RFC 4380
    ("2001::/23", "IETF protocol assignments (2001::/23)"),   // RFC 2928
    ("2002::/16", "6to4 (2002::/16)"),                        // RFC 3056
    ("3fff::/20", "documentation (3fff::/20)"),               // RFC 9637
    ("fc00::/7", "unique local (fc00::/7)"),                  // RFC 4193
    ("fe80::/10", "link-local (fe80::/10)"),                  // RFC 4291
    ("fec0::/10", "site-local (fec0::/10)"),                  // RFC 3879, deprecated
    ("ff00::/8", "multicast (ff00::/8)"),                     // RFC 4291
];

/// The table parsed once. A typo in a CIDR is a programming error that every
/// test run hits at the first lookup, so `expect` is the right failure.
static NETS: LazyLock<Vec<(IpNet, &'static str)>> = LazyLock::new(|| {
    BLOCKED
        .iter()
        .map(|(cidr, why)| {
            let net: IpNet = cidr.parse().expect("a valid CIDR in the blocked table");
            (net, *why)
        })
        .collect()
});

/// Why `ip` must not be contacted, or `None` if it is an ordinary public
/// address. Pure: the allow-list is applied by the caller.
pub fn is_blocked(ip: IpAddr) -> Option<&'static str> {
    NETS.iter().find(|(net, _)| net.contains(&ip)).map(|(_, why)| *why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_cidr_parses_and_is_its_network_address() {
        // `10.0.0.1/8` would parse but means something else than it says.
        for (cidr, _) in BLOCKED {
            let net: IpNet = cidr.parse().unwrap_or_else(|e| panic!("{cidr}: {e}"));
            assert_eq!(net, net.trunc(), "{cidr} has host bits set");
        }
        assert_eq!(NETS.len(), BLOCKED.len());
    }

    #[test]
    fn blocked_ipv4() {
        for s in [
            "0.0.0.0",
            "0.255.255.255",
            "10.0.0.0",
            "10.255.255.255",
            "100.64.0.0",
            "100.127.255.255",
            "127.0.0.1",
            "127.255.255.254",
            "169.254.169.254",
            "169.254.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.1",
            "192.0.0.170",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.0.1",
            "192.168.255.255",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.254",
            "255.255.255.255",
        ] {
            assert!(is_blocked(ip(s)).is_some(), "{s} should be blocked");
        }
    }

    #[test]
    fn blocked_ipv6() {
        for s in [
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:8.8.8.8", // all IPv4-mapped, even a public embedded address
            "::ffff:0:7f00:1",
            "::127.0.0.1",
            "::8.8.8.8",
            "64:ff9b::7f00:1",
            "64:ff9b::808:808",
            "64:ff9b:1::1",
            "100::1",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:1ff:ffff::1",
            "2001:db8::1",
            "2001:db8:ffff:ffff::1",
            "2002:7f00:1::",
            "2002:808:808::1",
            "3fff::1",
            "fc00::1",
            "fd00::1",
            "fdff:ffff::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "ff05::1:3",
        ] {
            assert!(is_blocked(ip(s)).is_some(), "{s} should be blocked");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for s in [
            "8.8.8.8",
            "1.1.1.1",
            "93.184.216.34",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.1",
            "192.0.3.0",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700::1111",
            "2001:4860:4860::8888",
            "2001:200::1",
            "2003::1",
            "2a00:1450:4001::1",
            "fbff:ffff::1",
            "fe00::1",
            "::2:0:0:1",
            "64:ff9b:2::1",
            "101::1",
        ] {
            assert_eq!(is_blocked(ip(s)), None, "{s} should pass");
        }
    }

    #[test]
    fn reasons_are_specific() {
        assert_eq!(is_blocked(ip("127.0.0.1")), Some("loopback (127.0.0.0/8)"));
        assert_eq!(is_blocked(ip("255.255.255.255")), Some("broadcast"));
        assert_eq!(is_blocked(ip("::1")), Some("loopback (::1)"));
        assert_eq!(is_blocked(ip("::")), Some("unspecified (::)"));
        assert_eq!(is_blocked(ip("::ffff:a9fe:a9fe")), Some("IPv4-mapped (::ffff:0:0/96)"));
        assert_eq!(is_blocked(ip("2001::5")), Some("Teredo (2001::/32)"));
        assert_eq!(is_blocked(ip("2001:db8::5")), Some("documentation (2001:db8::/32)"));
        assert_eq!(is_blocked(ip("169.254.169.254")), Some("link-local (169.254.0.0/16)"));
    }
}
