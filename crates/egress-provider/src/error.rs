//! The provider's error: a class the controller acts on, a redacted human message that names
//! what to change, and the libvirt code when there was one.
//!
//! Guarantees: every message is passed through [`redact`] when built, so URLs with
//! credentials or query strings never reach status, events or logs (findings L24, D5); the
//! class alone decides retry behaviour: Transient → backoff, Permanent → wait for a change,
//! NotFound → the instance is gone, QuotaExceeded → wait for capacity.

use std::fmt;

/// How the controller must treat a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Retry with backoff; the condition is visible but does not latch.
    Transient,
    /// Retrying with the same spec and config cannot succeed; latch until either changes.
    Permanent,
    /// The instance (or what was asked for) does not exist.
    NotFound,
    /// The host lacks capacity (pool space, limits).
    QuotaExceeded,
}

impl ErrorClass {
    /// A stable label for metrics and event reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transient => "Transient",
            Self::Permanent => "Permanent",
            Self::NotFound => "NotFound",
            Self::QuotaExceeded => "QuotaExceeded",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A classified provider failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{class}: {message}")]
pub struct ProviderError {
    /// What the controller should do.
    pub class: ErrorClass,
    /// A redacted message naming what failed and what to change.
    pub message: String,
    /// The libvirt error code, when the daemon reported one.
    pub libvirt_code: Option<i32>,
}

impl ProviderError {
    /// A failure of `class`; the message is redacted.
    pub fn new(class: ErrorClass, message: impl AsRef<str>) -> Self {
        Self {
            class,
            message: redact(message.as_ref()),
            libvirt_code: None,
        }
    }

    /// A transient failure.
    pub fn transient(message: impl AsRef<str>) -> Self {
        Self::new(ErrorClass::Transient, message)
    }

    /// A permanent failure.
    pub fn permanent(message: impl AsRef<str>) -> Self {
        Self::new(ErrorClass::Permanent, message)
    }

    /// A not-found result.
    pub fn not_found(message: impl AsRef<str>) -> Self {
        Self::new(ErrorClass::NotFound, message)
    }

    /// A capacity failure.
    pub fn quota(message: impl AsRef<str>) -> Self {
        Self::new(ErrorClass::QuotaExceeded, message)
    }

    /// Attaches the libvirt code.
    pub fn with_code(mut self, code: Option<i32>) -> Self {
        self.libvirt_code = code;
        self
    }

    /// Prefixes the message with context (e.g. the step and host).
    pub fn context(mut self, ctx: impl fmt::Display) -> Self {
        self.message = redact(&format!("{ctx}: {}", self.message));
        self
    }

    /// Whether this is [`ErrorClass::NotFound`].
    pub fn is_not_found(&self) -> bool {
        self.class == ErrorClass::NotFound
    }

    /// Whether this is [`ErrorClass::Transient`].
    pub fn is_transient(&self) -> bool {
        self.class == ErrorClass::Transient
    }

    /// Whether this is [`ErrorClass::Permanent`].
    pub fn is_permanent(&self) -> bool {
        self.class == ErrorClass::Permanent
    }
}

/// Result alias.
pub type Result<T, E = ProviderError> = std::result::Result<T, E>;

/// Removes credentials (`user:pass@`), query strings, fragments and path segments that are or
/// look like tokens ([`redact_path`]) from every URL in `s`. Text that is not a URL is
/// returned unchanged.
pub fn redact(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = find_scheme(rest) {
        let (before, from) = rest.split_at(pos);
        out.push_str(before);
        let end = from
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
            .unwrap_or(from.len());
        let (url, after) = from.split_at(end);
        out.push_str(&redact_url(url));
        rest = after;
    }
    out.push_str(rest);
    out
}

fn find_scheme(s: &str) -> Option<usize> {
    let lower = s.to_ascii_lowercase();
    ["http://", "https://", "ftp://"]
        .iter()
        .filter_map(|p| lower.find(p))
        .min()
}

fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let (scheme, rest) = url.split_at(scheme_end + 3);
    let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(auth_end);
    let host = match authority.rfind('@') {
        Some(at) => format!("REDACTED@{}", authority.get(at + 1..).unwrap_or("")),
        None => authority.to_owned(),
    };
    let (path, query) = match path.find(['?', '#']) {
        Some(q) => (path.get(..q).unwrap_or(""), "?REDACTED"),
        None => (path, ""),
    };
    format!("{scheme}{host}{}{query}", redact_path(path))
}

/// Path segments named as secrets by the segment before them (`/token/SECRET/…`).
const SECRET_KEYS: &[&str] = &[
    "token",
    "tokens",
    "access_token",
    "auth",
    "key",
    "keys",
    "apikey",
    "api-key",
    "api_key",
    "secret",
    "secrets",
    "sig",
    "signature",
    "password",
    "credentials",
];

/// `path` with every segment that is, or looks like, a secret replaced by `REDACTED`: one
/// after a segment such as `token` or `key` ([`SECRET_KEYS`]), one holding `=` or a
/// `key:value`-style `:`, and one that reads like a random token (see [`looks_random`]). File
/// names (with an extension), words and hex digests are kept, so a path stays readable.
fn redact_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut after_key = false;
    for (i, seg) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        let secret = !seg.is_empty()
            && (after_key || seg.contains('=') || seg.contains(':') || looks_random(seg));
        out.push_str(if secret { "REDACTED" } else { seg });
        after_key = SECRET_KEYS.contains(&seg.to_ascii_lowercase().as_str());
    }
    out
}

/// Whether a path segment reads like a random token: at least 20 characters of letters,
/// digits, `-`, `_`, `.`, `~`, `%` or `+`, with no file extension, mixing upper- and lowercase
/// letters with digits (base64 and similar); hex digests (one case) and words are not.
fn looks_random(seg: &str) -> bool {
    let ext = seg.rsplit_once('.').is_some_and(|(_, e)| {
        (1..=5).contains(&e.len()) && e.bytes().all(|b| b.is_ascii_alphanumeric())
    });
    seg.len() >= 20
        && !ext
        && seg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~%+".contains(&b))
        && seg.bytes().any(|b| b.is_ascii_uppercase())
        && seg.bytes().any(|b| b.is_ascii_lowercase())
        && seg.bytes().any(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_in_url_path_segments_are_redacted_and_file_names_kept() {
        let m = redact(
            "GET https://mirror.example/token/abc123/images/debian-12.qcow2 failed; \
             https://s3.example/b/AKIAIOSFODNN7EXAMPLEx9Qz2/x.qcow2 and \
             https://h.example/dl/sig=deadbeef/img.raw and \
             https://h.example/user:pw-in-path/img.raw and \
             https://h.example/sha/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef/i.qcow2",
        );
        for secret in [
            "abc123",
            "AKIAIOSFODNN7EXAMPLEx9Qz2",
            "deadbeef",
            "pw-in-path",
        ] {
            assert!(!m.contains(secret), "{secret} left in {m}");
        }
        assert!(
            m.contains("https://mirror.example/token/REDACTED/images/debian-12.qcow2"),
            "{m}"
        );
        assert!(m.contains("/b/REDACTED/x.qcow2"), "{m}");
        assert!(
            m.contains("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
            "a digest is kept: {m}"
        );
        assert_eq!(
            redact(
                "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2"
            ),
            "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2"
        );
    }

    #[test]
    fn credentials_and_queries_are_redacted_from_every_url() {
        // finding: L24, D5
        let m = redact(
            "GET https://bob:s3cret@images.example/x.qcow2?token=abc failed; \
             retry http://a.example/y",
        );
        assert!(
            !m.contains("s3cret") && !m.contains("bob") && !m.contains("abc"),
            "{m}"
        );
        assert!(
            m.contains("https://REDACTED@images.example/x.qcow2?REDACTED"),
            "{m}"
        );
        assert!(m.contains("http://a.example/y"), "{m}");
        let e = ProviderError::transient("fetch HTTPS://u:p@h/i failed");
        assert!(!e.message.contains("u:p"), "{}", e.message);
    }

    #[test]
    fn text_without_urls_is_unchanged() {
        assert_eq!(redact("no url here: 42"), "no url here: 42");
    }
}
