//! The blocked address ranges (DESIGN §9): one pure function, no I/O.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IPv4 ranges never reachable from Reeve unless an address is allow-listed.
/// More specific entries come first so the reason is the most precise one.
const V4: &[(u32, u8, &str)] = &[
    (0xFFFF_FFFF, 32, "broadcast"),
    (0x0000_0000, 8, "\"this network\" (0.0.0.0/8)"),
    (0x0A00_0000, 8, "private (10.0.0.0/8)"),
    (0x6440_0000, 10, "carrier-grade NAT (100.64.0.0/10)"),
    (0x7F00_0000, 8, "loopback (127.0.0.0/8)"),
    (0xA9FE_0000, 16, "link-local (169.254.0.0/16)"),
    (0xAC10_0000, 12, "private (172.16.0.0/12)"),
    (0xC000_0000, 24, "IETF protocol assignments (192.0.0.0/24)"),
    (0xC000_0200, 24, "documentation (192.0.2.0/24)"),
    (0xC058_6300, 24, "6to4 relay anycast (192.88.99.0/24)"),
    (0xC0A8_0000, 16, "private (192.168.0.0/16)"),
    (0xC612_0000, 15, "benchmarking (198.18.0.0/15)"),
    (0xC633_6400, 24, "documentation (198.51.100.0/24)"),
    (0xCB00_7100, 24, "documentation (203.0.113.0/24)"),
    (0xE000_0000, 4, "multicast (224.0.0.0/4)"),
    (0xF000_0000, 4, "reserved (240.0.0.0/4)"),
];

/// IPv6 ranges, same rule. IPv4-mapped (`::ffff:0:0/96`) is blocked as a
/// whole, whatever IPv4 address it embeds.
const V6: &[(u128, u8, &str)] = &[
    (0, 128, "unspecified (::)"),
    (1, 128, "loopback (::1)"),
    (0xFFFF_0000_0000, 96, "IPv4-mapped (::ffff:0:0/96)"),
    (
        0xFFFF_0000_0000_0000,
        96,
        "IPv4-translated (::ffff:0:0:0/96)",
    ),
    (0, 96, "IPv4-compatible (::/96)"),
    (
        0x0064_FF9B_0000_0000_0000_0000_0000_0000,
        96,
        "NAT64 (64:ff9b::/96)",
    ),
    (
        0x0064_FF9B_0001_0000_0000_0000_0000_0000,
        48,
        "local NAT64 (64:ff9b:1::/48)",
    ),
    (
        0x0100_0000_0000_0000_0000_0000_0000_0000,
        64,
        "discard-only (100::/64)",
    ),
    (
        0x2001_0DB8_0000_0000_0000_0000_0000_0000,
        32,
        "documentation (2001:db8::/32)",
    ),
    (
        0x2001_0000_0000_0000_0000_0000_0000_0000,
        32,
        "Teredo (2001::/32)",
    ),
    (
        0x2001_0000_0000_0000_0000_0000_0000_0000,
        23,
        "IETF protocol assignments (2001::/23)",
    ),
    (
        0x2002_0000_0000_0000_0000_0000_0000_0000,
        16,
        "6to4 (2002::/16)",
    ),
    (
        0x3FFF_0000_0000_0000_0000_0000_0000_0000,
        20,
        "documentation (3fff::/20)",
    ),
    (
        0xFC00_0000_0000_0000_0000_0000_0000_0000,
        7,
        "unique local (fc00::/7)",
    ),
    (
        0xFE80_0000_0000_0000_0000_0000_0000_0000,
        10,
        "link-local (fe80::/10)",
    ),
    (
        0xFEC0_0000_0000_0000_0000_0000_0000_0000,
        10,
        "site-local (fec0::/10)",
    ),
    (
        0xFF00_0000_0000_0000_0000_0000_0000_0000,
        8,
        "multicast (ff00::/8)",
    ),
];

/// Why `ip` must not be contacted, or `None` if it is an ordinary public
/// address. Pure: the allow-list is applied by the caller.
pub fn is_blocked(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => blocked_v4(v4),
        IpAddr::V6(v6) => blocked_v6(v6),
    }
}

fn blocked_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let bits = u32::from(ip);
    V4.iter()
        .find(|(net, len, _)| prefix_match(u128::from(bits), u128::from(*net), *len, 32))
        .map(|(_, _, why)| *why)
}

fn blocked_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(ip);
    V6.iter()
        .find(|(net, len, _)| prefix_match(bits, *net, *len, 128))
        .map(|(_, _, why)| *why)
}

fn prefix_match(addr: u128, net: u128, len: u8, width: u32) -> bool {
    let host_bits = width - u32::from(len);
    if host_bits >= width {
        return true; // a /0
    }
    (addr >> host_bits) == (net >> host_bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
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
        assert_eq!(
            is_blocked(ip("::ffff:a9fe:a9fe")),
            Some("IPv4-mapped (::ffff:0:0/96)")
        );
        assert_eq!(is_blocked(ip("2001::5")), Some("Teredo (2001::/32)"));
        assert_eq!(
            is_blocked(ip("2001:db8::5")),
            Some("documentation (2001:db8::/32)")
        );
        assert_eq!(
            is_blocked(ip("169.254.169.254")),
            Some("link-local (169.254.0.0/16)")
        );
    }
}
