//! String formats a CRD schema may declare, checked as the API server checks them: only the
//! formats Kubernetes supports (apiextensions `supportedVersionedFormats`; any other format,
//! such as `int32` or `uint64`, is ignored), each by the rule of kube-openapi's `strfmt`
//! registry: `cidr` and `ipv4` as Go's `net.ParseCIDR` / `ParseIP` with leading zeros allowed
//! (`netutils.ParseCIDRSloppy`), `ipv6` as `ParseIP` of a string with a colon, `uuid*`,
//! `hostname`, `byte` (base64), `hexcolor`, `rgbcolor`, `ssn`, `isbn*`, `creditcard` and
//! `bsonobjectid` by their regular expressions, `date` and `datetime` as RFC 3339 (full-date;
//! date-time with or without seconds' fraction or zone, as strfmt's layouts), `duration` as a
//! Go duration (`1h30m`) or strfmt's `N unit` form, `mac` as `net.ParseMAC`, `email` as an
//! address with a local part and a domain, `uri` as an absolute URI or an absolute path.
//!
//! Approximations (no committed CRD uses them): `email` and `uri` accept what their Go parsers
//! accept in the common cases, not every corner of RFC 5322 / RFC 3986.

use std::net::{Ipv4Addr, Ipv6Addr};

use serde_json::Value;

/// Formats checked (normalized: `-` removed, as go-openapi's registry normalizes names).
const SUPPORTED: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
];

/// The schema's `format` when the API server checks it (as written, for messages).
pub(crate) fn supported(schema: &Value) -> Option<&str> {
    let f = schema.get("format").and_then(Value::as_str)?;
    SUPPORTED.contains(&normalize(f).as_str()).then_some(f)
}

fn normalize(f: &str) -> String {
    f.replace('-', "")
}

fn matches(re: &str, s: &str) -> bool {
    super::regex_match(re, s).unwrap_or(false)
}

/// Whether `s` is a valid `format` value.
pub(crate) fn valid(format: &str, s: &str) -> bool {
    match normalize(format).as_str() {
        "ipv4" => parse_ip_sloppy(s).is_some() && s.contains('.'),
        "ipv6" => parse_ip_sloppy(s).is_some() && s.contains(':'),
        "cidr" => is_cidr_sloppy(s),
        "mac" => is_mac(s),
        "uuid" => matches(
            r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$",
            s,
        ),
        "uuid3" => matches(
            r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$",
            s,
        ),
        "uuid4" => matches(
            r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$",
            s,
        ),
        "uuid5" => matches(
            r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$",
            s,
        ),
        "hostname" => {
            matches(
                r"^([a-zA-Z0-9\p{S}\p{L}]((-?[a-zA-Z0-9\p{S}\p{L}]{0,62})?)|([a-zA-Z0-9\p{S}\p{L}](([a-zA-Z0-9-\p{S}\p{L}]{0,61}[a-zA-Z0-9\p{S}\p{L}])?)(\.)){1,}([a-zA-Z\p{L}]){2,63})$",
                s,
            ) && s.len() <= 255
                && s.split('.').all(|p| p.len() <= 63)
        }
        "bsonobjectid" => matches(r"^[0-9a-fA-F]{24}$", s),
        "isbn10" => matches(r"^(?:[0-9]{9}X|[0-9]{10})$", &s.replace(['-', ' '], "")),
        "isbn13" => matches(r"^(?:[0-9]{13})$", &s.replace(['-', ' '], "")),
        "isbn" => valid("isbn10", s) || valid("isbn13", s),
        "creditcard" => matches(
            r"^(?:4[0-9]{12}(?:[0-9]{3})?|5[1-5][0-9]{14}|6(?:011|5[0-9][0-9])[0-9]{12}|3[47][0-9]{13}|3(?:0[0-5]|[68][0-9])[0-9]{11}|(?:2131|1800|35\d{3})\d{11})$",
            &s.chars().filter(char::is_ascii_digit).collect::<String>(),
        ),
        "ssn" => matches(r"^\d{3}[- ]?\d{2}[- ]?\d{4}$", s),
        "hexcolor" => matches(r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$", s),
        "rgbcolor" => matches(
            r"^rgb\(\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*\)$",
            s,
        ),
        "byte" => matches(
            r"^(?:[A-Za-z0-9+\/]{4})*(?:[A-Za-z0-9+\/]{2}==|[A-Za-z0-9+\/]{3}=|[A-Za-z0-9+\/]{4})$",
            s,
        ),
        "password" => true,
        "date" => {
            matches(r"^\d{4}-\d{2}-\d{2}$", s)
                && time::Date::parse(s, &time::format_description::well_known::Iso8601::DATE)
                    .is_ok()
        }
        "datetime" => is_datetime(s),
        "duration" => is_duration(s),
        "email" => is_email(s),
        "uri" => {
            url::Url::parse(s).is_ok() || (s.starts_with('/') && !s.contains(char::is_whitespace))
        }
        _ => true,
    }
}

/// Go's `net.ParseIP` with leading zeros allowed in IPv4 fields (`netutils.ParseIPSloppy`).
pub(crate) fn parse_ip_sloppy(s: &str) -> Option<std::net::IpAddr> {
    if let Some(v4) = parse_v4_sloppy(s) {
        return Some(v4.into());
    }
    if s.contains('%') {
        return None;
    }
    s.parse::<Ipv6Addr>().ok().map(Into::into)
}

fn parse_v4_sloppy(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() != 4 {
        return None;
    }
    let mut octets = [0u8; 4];
    for (o, p) in octets.iter_mut().zip(&parts) {
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    Some(Ipv4Addr::from(octets))
}

fn is_cidr_sloppy(s: &str) -> bool {
    let Some((addr, bits)) = s.split_once('/') else {
        return false;
    };
    if bits.is_empty() || !bits.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let Ok(n) = bits.parse::<u32>() else {
        return false;
    };
    match parse_ip_sloppy(addr) {
        Some(std::net::IpAddr::V4(_)) => n <= 32,
        Some(std::net::IpAddr::V6(_)) => n <= 128,
        None => false,
    }
}

fn is_mac(s: &str) -> bool {
    let hex2 = |p: &str| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit());
    let hex4 = |p: &str| p.len() == 4 && p.bytes().all(|b| b.is_ascii_hexdigit());
    for sep in [':', '-'] {
        let parts: Vec<&str> = s.split(sep).collect();
        if matches!(parts.len(), 6 | 8 | 20) && parts.iter().all(|p| hex2(p)) {
            return true;
        }
    }
    let parts: Vec<&str> = s.split('.').collect();
    matches!(parts.len(), 3 | 4 | 10) && parts.iter().all(|p| hex4(p))
}

fn is_datetime(s: &str) -> bool {
    use time::format_description::well_known::Rfc3339;
    if time::OffsetDateTime::parse(s, &Rfc3339).is_ok() {
        return true;
    }
    // strfmt's other layouts: no seconds, or no zone.
    matches(
        r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$",
        s,
    )
}

fn is_duration(s: &str) -> bool {
    // Go's time.ParseDuration: [-+]?([0-9]*(\.[0-9]*)?[a-z]+)+, units ns us µs ms s m h.
    let go = r"^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$";
    // strfmt's "N unit" form (1 day, 3 weeks, 10 hours, ...).
    let words = r"^[0-9]+\s*(ns|us|µs|ms|s|m|h|d|w|nanoseconds?|microseconds?|milliseconds?|seconds?|sec|minutes?|mins?|hours?|hrs?|days?|weeks?|wks?)$";
    s == "0" || matches(go, s) || matches(words, s)
}

fn is_email(s: &str) -> bool {
    let addr = match (s.find('<'), s.strip_suffix('>')) {
        (Some(i), Some(rest)) => rest.get(i + 1..).unwrap_or(""),
        _ => s,
    };
    matches(r"^[^\s@<>()\[\],;:]+@[^\s@<>()\[\],;:]+$", addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_kubernetes_formats_are_checked() {
        assert_eq!(supported(&json!({"format": "cidr"})), Some("cidr"));
        assert_eq!(
            supported(&json!({"format": "date-time"})),
            Some("date-time")
        );
        assert_eq!(supported(&json!({"format": "uint32"})), None);
        assert_eq!(supported(&json!({"format": "int64"})), None);
    }

    #[test]
    fn cidrs_and_addresses_parse_as_go_parses_them_sloppily() {
        assert!(valid("cidr", "10.0.0.0/8"));
        assert!(valid("cidr", "10.0.0.1/8"), "host bits may be set");
        assert!(
            valid("cidr", "010.0.0.0/8"),
            "leading zeros are sloppy-allowed"
        );
        assert!(valid("cidr", "2001:db8::/32"));
        assert!(!valid("cidr", "10.0.0.0/33"));
        assert!(!valid("cidr", "10.0.0.0"));
        assert!(!valid("cidr", "example.com/8"));
        assert!(valid("ipv4", "203.0.113.7"));
        assert!(!valid("ipv4", "2001:db8::1"));
        assert!(valid("ipv6", "2001:db8::1"));
        assert!(valid("uuid", "550e8400-e29b-41d4-a716-446655440000"));
        assert!(valid("date-time", "2024-01-02T03:04:05Z"));
        assert!(!valid("date-time", "yesterday"));
        assert!(valid("duration", "1h30m"));
        assert!(valid("mac", "52:54:00:ab:cd:ef"));
        assert!(valid("byte", "aGVsbG8="));
        assert!(!valid("byte", "a"));
    }
}
