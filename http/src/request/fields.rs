//! Fields that several requests carry: keys, values and addresses, with their validation.

use crate::error::ApiError;
use crate::limits::{MAX_ADDR_BYTES, MAX_KEY_BYTES, MAX_VALUE_BYTES};

/// Validates a key-value key: 1 to 1,024 bytes of UTF-8 without control characters.
pub fn validate_key(key: &str) -> Result<(), ApiError> {
    if key.is_empty() {
        return Err(ApiError::invalid("invalid_key", "key must not be empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(ApiError::invalid(
            "invalid_key",
            format!(
                "key is {} bytes long, at most {MAX_KEY_BYTES} are allowed",
                key.len()
            ),
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "invalid_key",
            "key contains control characters",
        ));
    }
    Ok(())
}

/// Validates the key of a new write: a valid key ([`validate_key`]) none of whose
/// `/`-separated segments is `.` or `..`. URL clients drop such segments (`a/./b` reaches the
/// server as `a/b`), so a key holding one could be written by some clients and not addressed
/// by others. Keys written before this rule stay readable and deletable.
pub fn validate_new_key(key: &str) -> Result<(), ApiError> {
    validate_key(key)?;
    if key.split('/').any(|s| s == "." || s == "..") {
        return Err(ApiError::invalid(
            "invalid_key",
            format!("key {key:?} has a \".\" or \"..\" segment, which URL clients drop"),
        ));
    }
    Ok(())
}

/// Validates a key-value value's size (at most 1 MiB).
pub fn validate_value(value: &[u8]) -> Result<(), ApiError> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(ApiError::too_large(
            "value_too_large",
            format!(
                "value is {} bytes, at most {MAX_VALUE_BYTES} are allowed",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// Validates an address `host:port`: a name or IPv4 address (letters, digits, `.`, `-`, `_`) or
/// an IPv6 address in brackets, and a port 1-65535.
pub fn validate_addr(addr: &str) -> Result<(), ApiError> {
    check_addr(addr, false).map_err(|why| {
        let shown: String = addr.chars().take(64).collect();
        ApiError::invalid(
            "invalid_addr",
            format!("address {shown:?} is not host:port: {why}"),
        )
    })
}

/// Checks an address to listen on: as [`validate_addr`], but port 0 (any free port) is allowed.
/// Returns why it is refused.
pub fn check_listen_addr(addr: &str) -> Result<(), &'static str> {
    check_addr(addr, true)
}

/// [`validate_addr`]'s rules; `any_port` also allows port 0.
fn check_addr(addr: &str, any_port: bool) -> Result<(), &'static str> {
    if addr.len() > MAX_ADDR_BYTES {
        return Err("too long");
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err("no port");
    };
    if host.is_empty() {
        return Err("empty host");
    }
    // A name or IPv4 address (letters, digits, '.', '-', '_'), or an IPv6 address in brackets.
    let valid_host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')),
    };
    if !valid_host {
        return Err("the host must be a name, an IPv4 address or an IPv6 address in brackets");
    }
    if !host.starts_with('[') {
        check_name(host)?;
    }
    // Written one way only: `host:07101` names the same port as `host:7101`, and would pass
    // the check that no two members share an address.
    match port.parse::<u16>() {
        Ok(0) if any_port && port == "0" => Ok(()),
        Ok(p) if p > 0 && port.starts_with('0') => Err("the port must not start with 0"),
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(()),
        _ if any_port => Err("the port must be 0 (any free port) to 65535"),
        _ => Err("the port must be 1 to 65535"),
    }
}

/// Checks a host that is not an IPv6 address: an IPv4 address, or a name whose labels (between
/// dots; one trailing dot allowed) are 1 to 63 characters and neither start nor end with `-`.
/// A host whose labels are all numbers (decimal, or hex as `0x7f`) is meant as an IPv4 address
/// (resolvers read "999.2.3.4", "7101" or "0x7f.0.0.1" as one, or fail), never a name: it must
/// be four decimal numbers 0-255.
fn check_name(host: &str) -> Result<(), &'static str> {
    let name = host.strip_suffix('.').unwrap_or(host);
    let numeric = |label: &str| {
        let hex = label
            .strip_prefix("0x")
            .or_else(|| label.strip_prefix("0X"));
        match hex {
            Some(digits) => digits.bytes().all(|b| b.is_ascii_hexdigit()),
            None => label.bytes().all(|b| b.is_ascii_digit()),
        }
    };
    if name.split('.').all(numeric) {
        return match name.parse::<std::net::Ipv4Addr>() {
            Ok(_) => Ok(()),
            Err(_) => Err("a host of numbers must be an IPv4 address (four numbers 0-255)"),
        };
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("each part of a host name between dots must be 1 to 63 characters");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a part of a host name may not start or end with '-'");
        }
    }
    Ok(())
}

/// Deserializes an optional body field that, when present, must hold a value: `null` is
/// refused (`invalid_body`) rather than read as absent, so that a client that meant to unset
/// or reset something is told it cannot. Use with `#[serde(default)]`.
pub(super) fn not_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values() {
        assert!(validate_key("a").is_ok());
        assert!(validate_key("config/datanode/7").is_ok());
        assert!(validate_key(&"k".repeat(MAX_KEY_BYTES)).is_ok());
        assert_eq!(validate_key("").unwrap_err().code(), "invalid_key");
        assert_eq!(
            validate_key(&"k".repeat(MAX_KEY_BYTES + 1))
                .unwrap_err()
                .code(),
            "invalid_key"
        );
        assert_eq!(validate_key("a\nb").unwrap_err().code(), "invalid_key");
        assert!(validate_new_key("a/.b/c..").is_ok());
        for dotted in [".", "..", "a/./b", "a/..", "../a"] {
            assert!(validate_key(dotted).is_ok(), "{dotted} stays addressable");
            assert_eq!(
                validate_new_key(dotted).unwrap_err().code(),
                "invalid_key",
                "{dotted}"
            );
        }
        assert!(validate_value(&vec![0; MAX_VALUE_BYTES]).is_ok());
        assert_eq!(
            validate_value(&vec![0; MAX_VALUE_BYTES + 1])
                .unwrap_err()
                .code(),
            "value_too_large"
        );
    }

    #[test]
    fn addresses() {
        for good in [
            "127.0.0.1:7101",
            "localhost:1",
            "dn-7.example:65535",
            "[::1]:80",
            "10.0.0.255:80",
            "1a.example:80",
            "3com:80",
            "example.com.:80",
            "a_b.example:80",
            "dn-7.rack-2:80",
        ] {
            assert!(validate_addr(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "127.0.0.1",
            ":80",
            "host:0",
            "host:65536",
            "host:+80",
            "host:port",
            "a b:80",
            "http://x:80",
            "::1:80",
            "a:b:c:80",
            "[not-v6]:80",
            "127.0.0.1:7121;2=127.0.0.1:7122",
            "a:1;b=c:2",
            "user@host:80",
            "999.2.3.4:90",
            "1.2.3:80",
            "7101:80",
            "1.2.3.4.5:80",
            "0x7f.0.0.1:80",
            "foo..bar:80",
            "-bad.example:80",
            "bad-.example:80",
            ".example:80",
            "example..:80",
            "host:080",
            "127.0.0.1:07101",
            "010.0.0.1:80",
        ] {
            assert_eq!(
                validate_addr(bad).unwrap_err().code(),
                "invalid_addr",
                "{bad}"
            );
        }
        let long_label = format!("{}.example:80", "a".repeat(64));
        assert_eq!(
            validate_addr(&long_label).unwrap_err().code(),
            "invalid_addr"
        );
        assert!(validate_addr(&format!("{}.example:80", "a".repeat(63))).is_ok());
        assert_eq!(
            validate_addr(&format!("{}:80", "h".repeat(300)))
                .unwrap_err()
                .code(),
            "invalid_addr"
        );
    }

    #[test]
    fn a_listen_address_may_take_any_free_port() {
        assert!(validate_addr("127.0.0.1:0").is_err());
        for good in ["127.0.0.1:0", "[::]:0", "0.0.0.0:7101", "localhost:0"] {
            assert_eq!(check_listen_addr(good), Ok(()), "{good}");
        }
        for bad in [
            "127.0.0.1:00",
            "127.0.0.1:",
            "nope",
            "h:65536",
            "a b:1",
            ":0",
        ] {
            assert!(check_listen_addr(bad).is_err(), "{bad}");
        }
    }
}
