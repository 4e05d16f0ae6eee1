//! The shapes of single fields: safe identifiers, libvirt object names, absolute paths,
//! image URLs and SHA-256 digests.
//!
//! Guarantees: pure; a URL is echoed only redacted (no userinfo reaches a message).

use std::path::Path;

use egress_provider::error::redact;

use super::{MAX_IDENT_LEN, Report};

/// A safe identifier: lowercase letters, digits and `-`, starting with a letter.
pub(super) fn ident(r: &mut Report, p: &str, s: &str) {
    let ok = !s.is_empty()
        && s.len() <= MAX_IDENT_LEN
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        r.err(
            p,
            format!(
                "{s:?} is not a safe identifier: 1 to {MAX_IDENT_LEN} of a-z 0-9 -, starting with \
                 a letter (it becomes part of domain and volume names)"
            ),
        );
    }
}

/// A libvirt object name (pool, network, bridge).
// Closes finding L12.
pub(super) fn libvirt_name(r: &mut Report, p: &str, s: &str, max: usize) {
    let ok = !s.is_empty()
        && s.len() <= max
        && !s.starts_with(['-', '.'])
        && !s
            .chars()
            .any(|c| c == '/' || c.is_whitespace() || c.is_control());
    if !ok {
        r.err(
            p,
            format!(
                "{s:?} is not a valid name: 1 to {max} bytes, no `/`, whitespace or control \
                 characters, not starting with - or ."
            ),
        );
    }
}

pub(super) fn abs_path(r: &mut Report, p: &str, v: Option<&Path>, what: &str) {
    match v {
        None => r.err(
            p,
            format!("missing: the absolute path of {what} is required"),
        ),
        Some(f) if !f.is_absolute() => r.err(
            p,
            format!(
                "{:?} is relative: give an absolute path",
                f.display().to_string()
            ),
        ),
        Some(_) => {}
    }
}

/// Checks an image URL, returning its (lowercase) scheme when it has a usable one.
// Closes finding L24.
pub(super) fn image_url(r: &mut Report, p: &str, u: &str) -> Option<String> {
    let parsed = match url::Url::parse(u) {
        Ok(x) => x,
        Err(e) => {
            r.err(p, format!("{u:?} is not a URL: {e}"));
            return None;
        }
    };
    let scheme = parsed.scheme().to_owned();
    if scheme != "http" && scheme != "https" {
        r.err(
            p,
            format!("{u:?}: scheme {scheme:?} is not supported; use https:// or http://"),
        );
        return None;
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        r.err(p, format!("{u:?} has no host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        // NB: the message is redacted by ConfigError::new; the rule is stated without the
        // credentials.
        r.err(
            p,
            format!(
                "{} carries credentials (user:password@): they would end up in logs and on \
                 hosts; serve the image without them",
                redact(u)
            ),
        );
    }
    Some(scheme)
}

pub(super) fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}
