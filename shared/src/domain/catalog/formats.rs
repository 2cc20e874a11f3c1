//! Checks for the string formats the catalog uses. Each returns the message an
//! operator sees; the caller attaches the TOML path.

/// Asset ids and task kinds: task kinds appear in URLs (`/v1/tasks/{kind}`),
/// so both stay within characters that never need escaping.
pub fn id(what: &str, id: &str) -> Result<(), String> {
    let mut chars = id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if first_ok && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_') {
        Ok(())
    } else {
        Err(format!(
            "invalid {what} {id:?}: use lowercase letters, digits, \"-\" and \"_\", starting with a letter or digit"
        ))
    }
}

/// A CAIP-2 chain id; for `eip155` the reference must also be a chain id
/// number, since x402 and wallets compare it numerically.
pub fn caip2(network: &str) -> Result<(), String> {
    let invalid = || format!("{network:?} is not a CAIP-2 network id (namespace:reference, e.g. \"eip155:8453\")");
    let (namespace, reference) = network.split_once(':').ok_or_else(invalid)?;
    let namespace_ok = (3..=8).contains(&namespace.len())
        && namespace.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let reference_ok = (1..=32).contains(&reference.len())
        && reference.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !namespace_ok || !reference_ok {
        return Err(invalid());
    }
    let chain_id = reference.chars().all(|c| c.is_ascii_digit()) && !reference.starts_with('0');
    if is_evm(network) && !chain_id {
        return Err(format!("{network:?}: an eip155 reference must be a decimal chain id"));
    }
    Ok(())
}

pub fn is_evm(network: &str) -> bool {
    network.starts_with("eip155:")
}

/// Only the shape is checked: the EIP-55 checksum needs Keccak-256, which this
/// crate does not depend on.
pub fn evm_address(address: &str) -> Result<(), String> {
    match address.strip_prefix("0x") {
        Some(hex) if hex.len() == 40 && hex.chars().all(|c| c.is_ascii_hexdigit()) => Ok(()),
        _ => Err(format!("{address:?} is not an EVM address (0x followed by 40 hex digits)")),
    }
}

/// The parts of an absolute http(s) URL that policy decisions need.
pub struct HttpUrl<'a> {
    pub https: bool,
    pub host: &'a str,
}

/// A deliberately small parser (there is no URL crate here): it accepts
/// `http(s)://host[:port][/path][?query][#fragment]` and rejects credentials,
/// which would otherwise sit in plain text in the catalog.
pub fn http_url(url: &str) -> Result<HttpUrl<'_>, String> {
    let invalid = |why: &str| format!("{url:?} is not an absolute http(s) URL: {why}");
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid("it contains whitespace"));
    }
    let (https, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(invalid("it must start with https:// or http://"));
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err(invalid("credentials are not allowed in the URL"));
    }
    let (host, port) = split_host_port(authority).ok_or_else(|| invalid("it has no valid host"))?;
    let host_ok = match host.strip_prefix('[').and_then(|v6| v6.strip_suffix(']')) {
        Some(v6) => !v6.is_empty() && v6.chars().all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.'),
        None => !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'),
    };
    if !host_ok {
        return Err(invalid("it has no valid host"));
    }
    let port_ok =
        |port: &str| port.chars().all(|c| c.is_ascii_digit()) && port.parse::<u16>().is_ok_and(|port| port != 0);
    if port.is_some_and(|port| !port_ok(port)) {
        return Err(invalid("the port must be a number from 1 to 65535"));
    }
    Ok(HttpUrl { https, host })
}

/// Splits `host[:port]`, where the host may be a bracketed IPv6 literal.
fn split_host_port(authority: &str) -> Option<(&str, Option<&str>)> {
    let host_end = if authority.starts_with('[') {
        authority.find(']')? + 1
    } else {
        authority.find(':').unwrap_or(authority.len())
    };
    let (host, rest) = authority.split_at(host_end);
    let port = if rest.is_empty() { None } else { Some(rest.strip_prefix(':')?) };
    Some((host, port))
}

/// Plain http is allowed only where it cannot leave the machine, so tests can
/// run a local facilitator without TLS.
pub fn is_loopback(host: &str) -> bool {
    matches!(host, "127.0.0.1" | "localhost" | "[::1]")
}

/// `type/subtype` with RFC 9110 token characters. Parameters such as
/// `; charset=utf-8` are refused because presigning compares types exactly.
pub fn media_type(media_type: &str) -> Result<(), String> {
    let token =
        |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c));
    match media_type.split_once('/') {
        Some((kind, subtype)) if token(kind) && token(subtype) => Ok(()),
        _ => Err(format!(
            "{media_type:?} is not a media type of the form type/subtype (e.g. \"image/png\", no parameters)"
        )),
    }
}

pub fn non_blank(text: &str) -> Result<(), String> {
    if text.trim().is_empty() { Err("must not be empty".to_owned()) } else { Ok(()) }
}
