//! The host-key policy for one SSH target, read from OpenSSH `known_hosts` text or from
//! explicitly pinned keys.
//!
//! Guarantees: lookup uses exactly the name OpenSSH would (`host` for port 22,
//! `[host]:port` otherwise, lower-cased), through comma-separated patterns with `*`/`?`
//! wildcards and `!` negation, and hashed `|1|salt|hash` names (HMAC-SHA1) (finding APX-4);
//! a presented key is accepted only if it equals a key pinned for that name and no matching
//! `@revoked` line names it; every rejection message names the host, the lookup name and the
//! file and line(s) involved (finding L2); the algorithms a caller should offer are exactly
//! those of the pinned keys (finding L3).
//!
//! NB: why not russh's `check_known_hosts_path` (russh 0.65, `keys/known_hosts.rs`)? It does
//! build `[host]:port`, but it ignores markers (an `@revoked` line is silently skipped, because
//! its first field is taken as the host pattern), supports neither wildcards nor negation,
//! splits fields on single spaces only, skips comment lines without counting them (so its
//! line numbers are off), treats an unreadable file as "host unknown", fails on any
//! same-algorithm key that differs even when another line matches, and reports only a
//! boolean, so it cannot tell us which algorithms are pinned. ssh-key's `KnownHosts` parser
//! drops line numbers and splits on single spaces. We tokenise lines ourselves and leave key
//! decoding to ssh-key (`PublicKey::from_openssh`).

use data_encoding::BASE64;
use hmac::{Hmac, KeyInit, Mac};
use russh::keys::ssh_key::{Algorithm, EcdsaCurve, HashAlg, PublicKey};
use sha1::Sha1;

/// A key taken from the policy's source, with where it came from.
#[derive(Debug, Clone)]
pub(crate) struct SourcedKey {
    pub(crate) key: PublicKey,
    /// e.g. `known_hosts /etc/x line 3` or `pinned key #1`.
    pub(crate) source: String,
}

/// What the configuration says about one host.
#[derive(Debug, Clone)]
pub(crate) struct HostKeyPolicy {
    /// `host:port`, for messages.
    display: String,
    /// The known_hosts lookup name: `host` or `[host]:port`.
    lookup: String,
    /// The file (or "pinned keys") the policy came from, for messages.
    origin: String,
    accepted: Vec<SourcedKey>,
    revoked: Vec<SourcedKey>,
    cert_authority_lines: Vec<usize>,
}

/// The known_hosts name for a host and port, as OpenSSH writes it.
pub(crate) fn lookup_name(host: &str, port: u16) -> String {
    let host = host.to_ascii_lowercase();
    if port == 22 {
        host
    } else {
        format!("[{host}]:{port}")
    }
}

fn fingerprint(key: &PublicKey) -> String {
    format!("{} {}", key.algorithm(), key.fingerprint(HashAlg::Sha256))
}

impl HostKeyPolicy {
    /// Reads the entries of known_hosts `text` that match `host`:`port`. `origin` names the
    /// text in messages (e.g. `known_hosts /root/.ssh/known_hosts`). A line that matches the
    /// host but cannot be parsed is an error naming the line: a corrupted entry for our host
    /// must not be skipped silently (it could be a revocation).
    pub(crate) fn from_known_hosts(
        text: &str,
        origin: &str,
        host: &str,
        port: u16,
    ) -> Result<Self, String> {
        let lookup = lookup_name(host, port);
        let mut policy = Self {
            display: format!("{host}:{port}"),
            lookup,
            origin: origin.to_owned(),
            accepted: Vec::new(),
            revoked: Vec::new(),
            cert_authority_lines: Vec::new(),
        };
        for (index, raw) in text.lines().enumerate() {
            let line_no = index.saturating_add(1);
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split_whitespace();
            let mut first = fields.next().unwrap_or_default();
            let marker = if first.starts_with('@') {
                let m = match first {
                    "@revoked" => Marker::Revoked,
                    "@cert-authority" => Marker::CertAuthority,
                    other => {
                        // An unknown marker on a line we cannot attribute: OpenSSH skips such
                        // lines too, and they cannot vouch for any key.
                        tracing::debug!(%origin, line = line_no, marker = other, "skipping known_hosts line with unknown marker");
                        continue;
                    }
                };
                first = fields.next().unwrap_or_default();
                m
            } else {
                Marker::None
            };
            if !patterns_match(first, &policy.lookup) {
                continue;
            }
            let here = format!("{origin} line {line_no}");
            if marker == Marker::CertAuthority {
                policy.cert_authority_lines.push(line_no);
                continue;
            }
            let (Some(kind), Some(b64)) = (fields.next(), fields.next()) else {
                return Err(format!(
                    "{here} names {} but has no key type and key",
                    policy.lookup
                ));
            };
            let key = PublicKey::from_openssh(&format!("{kind} {b64}"))
                .map_err(|e| format!("{here}: cannot parse the {kind} key: {e}"))?;
            let entry = SourcedKey { key, source: here };
            match marker {
                Marker::Revoked => policy.revoked.push(entry),
                _ => policy.accepted.push(entry),
            }
        }
        Ok(policy)
    }

    /// A policy from keys in OpenSSH public-key format (`ssh-ed25519 AAAA… [comment]`), all
    /// accepted for this host.
    pub(crate) fn from_pinned(keys: &[String], host: &str, port: u16) -> Result<Self, String> {
        let mut accepted = Vec::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            let source = format!("pinned key #{}", i.saturating_add(1));
            let key = PublicKey::from_openssh(k.trim())
                .map_err(|e| format!("{source} for {host}:{port}: cannot parse: {e}"))?;
            accepted.push(SourcedKey { key, source });
        }
        Ok(Self {
            display: format!("{host}:{port}"),
            lookup: lookup_name(host, port),
            origin: "pinned host keys".into(),
            accepted,
            revoked: Vec::new(),
            cert_authority_lines: Vec::new(),
        })
    }

    /// The keys accepted for this host.
    #[cfg(test)]
    pub(crate) fn accepted(&self) -> &[SourcedKey] {
        &self.accepted
    }

    /// Fails unless at least one key is pinned for the host: there is no trust on first use.
    pub(crate) fn ensure_pinned(&self) -> Result<(), String> {
        if !self.accepted.is_empty() {
            return Ok(());
        }
        let mut msg = format!(
            "no host key for {} (looked up as `{}`) in {}; refusing to trust an unknown host \
             (entries for ports other than 22 must be written as [host]:port)",
            self.display, self.lookup, self.origin
        );
        if !self.cert_authority_lines.is_empty() {
            msg.push_str(&format!(
                "; @cert-authority lines {:?} match it, but host certificates are not supported",
                self.cert_authority_lines
            ));
        }
        Err(msg)
    }

    /// The host-key algorithms to offer, most preferred first: exactly those of the pinned
    /// keys (an RSA key is offered as rsa-sha2-512 and rsa-sha2-256, never SHA-1 `ssh-rsa`).
    pub(crate) fn algorithms(&self) -> Vec<Algorithm> {
        let mut out: Vec<Algorithm> = Vec::new();
        let mut add = |a: Algorithm| {
            if !out.contains(&a) {
                out.push(a);
            }
        };
        for k in &self.accepted {
            match k.key.algorithm() {
                Algorithm::Rsa { .. } => {
                    add(Algorithm::Rsa {
                        hash: Some(HashAlg::Sha512),
                    });
                    add(Algorithm::Rsa {
                        hash: Some(HashAlg::Sha256),
                    });
                }
                other => add(other),
            }
        }
        // NB: order by strength as russh's default list does, so the choice does not depend on
        // the order of lines in the file.
        out.sort_by_key(|a| match a {
            Algorithm::Ed25519 => 0,
            Algorithm::Ecdsa {
                curve: EcdsaCurve::NistP256,
            } => 1,
            Algorithm::Ecdsa {
                curve: EcdsaCurve::NistP384,
            } => 2,
            Algorithm::Ecdsa {
                curve: EcdsaCurve::NistP521,
            } => 3,
            Algorithm::Rsa {
                hash: Some(HashAlg::Sha512),
            } => 4,
            Algorithm::Rsa { .. } => 5,
            _ => 6,
        });
        out
    }

    /// A description of what is pinned, for messages: `line 3 ssh-ed25519 SHA256:…`.
    pub(crate) fn describe_pinned(&self) -> String {
        self.accepted
            .iter()
            .map(|k| format!("{} ({})", k.source, fingerprint(&k.key)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `host:port` and the lookup name, for messages.
    pub(crate) fn host_description(&self) -> String {
        format!("{} (known_hosts name `{}`)", self.display, self.lookup)
    }

    /// Accepts `presented` only if it is pinned for this host and not revoked.
    pub(crate) fn verify(&self, presented: &PublicKey) -> Result<(), String> {
        let same = |k: &SourcedKey| k.key.key_data() == presented.key_data();
        if let Some(r) = self.revoked.iter().find(|k| same(k)) {
            return Err(format!(
                "host key of {} is REVOKED: the server presented {}, which {} marks @revoked",
                self.host_description(),
                fingerprint(presented),
                r.source
            ));
        }
        if self.accepted.iter().any(same) {
            return Ok(());
        }
        Err(format!(
            "host key mismatch for {} (possible man-in-the-middle): the server presented {}, \
             but {} pins: {}",
            self.host_description(),
            fingerprint(presented),
            self.origin,
            self.describe_pinned()
        ))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marker {
    None,
    Revoked,
    CertAuthority,
}

/// OpenSSH's `match_hostname`: the comma-separated list matches if any positive pattern
/// matches and no negated (`!`) pattern does. Hashed entries (`|1|salt|hash`) match when the
/// HMAC-SHA1 of the name keyed by the salt equals the hash.
fn patterns_match(patterns: &str, name: &str) -> bool {
    let mut matched = false;
    for p in patterns.split(',') {
        if let Some(hashed) = p.strip_prefix("|1|") {
            if hashed_matches(hashed, name) {
                matched = true;
            }
        } else if let Some(neg) = p.strip_prefix('!') {
            if glob_match(&neg.to_ascii_lowercase(), name) {
                return false;
            }
        } else if glob_match(&p.to_ascii_lowercase(), name) {
            matched = true;
        }
    }
    matched
}

fn hashed_matches(salt_and_hash: &str, name: &str) -> bool {
    let Some((salt, hash)) = salt_and_hash.split_once('|') else {
        return false;
    };
    let (Ok(salt), Ok(hash)) = (
        BASE64.decode(salt.as_bytes()),
        BASE64.decode(hash.as_bytes()),
    ) else {
        return false;
    };
    let Ok(mut mac) = <Hmac<Sha1> as KeyInit>::new_from_slice(&salt) else {
        return false;
    };
    mac.update(name.as_bytes());
    mac.verify_slice(&hash).is_ok()
}

/// Glob matching with `*` (any run) and `?` (one character), over bytes.
fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ni));
                pi = pi.saturating_add(1);
            }
            Some(&c) if c == b'?' || Some(&c) == n.get(ni) => {
                pi = pi.saturating_add(1);
                ni = ni.saturating_add(1);
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp.saturating_add(1);
                    ni = sn.saturating_add(1);
                    star = Some((sp, ni));
                }
                None => return false,
            },
        }
    }
    p.get(pi..)
        .is_some_and(|rest| rest.iter().all(|&c| c == b'*'))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    const ED_A: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEjUQREOcZ53X9pjtckXgSpenLS2Wx4ocaA8tyq5o98w";
    const ED_B: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBuuco1ftYfW9CyXm9RfURtVrc8ai2mMj+oI6vVUicDu";
    const RSA: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQC535DGlpzLc0fxKgdUMYV35/GdlQvO9dQD6+WhMuOU4h3NtWZtiW1K3kaQGka437guHsRo0pC1Q15bd2XqbsYZvh/ajmRLlZ8bJb9KIeqIJwiYllqvAjiJhKPW860FVnJfBv6u/P4pLzKdxS5PqShP9eW80dGrrejC7Bsqp6y8Jw==";
    const ECDSA: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBNj/RqAhNXH2zWEa1WAnXuguhxBq439MJpHiKWW+kateH+LRNhHlLfkUCgD46LLf1sZIX9xxx7XU9PVQRsK4yKc=";
    /// `ssh-keygen -H` output for `[127.0.0.1]:2222 ED_A` and `example.com ED_A`.
    const HASHED_LOCAL_2222: &str = "|1|hvN9YbHcV++VQ/EWU3O91LET7uM=|8PDWsnfDbWiYoyMk7PIL+s19a74=";
    const HASHED_EXAMPLE_COM: &str = "|1|SW3WLeP27mCwbDswDfWYIMFmtPY=|Q54nSUiVALITd3h7XCimFz9jSNE=";

    fn key(s: &str) -> PublicKey {
        PublicKey::from_openssh(s).unwrap()
    }

    fn policy(text: &str, host: &str, port: u16) -> HostKeyPolicy {
        HostKeyPolicy::from_known_hosts(text, "known_hosts test", host, port).unwrap()
    }

    // finding: APX-4
    #[test]
    fn a_non_22_port_is_looked_up_in_brackets_and_the_bare_host_entry_does_not_count() {
        let text = format!("127.0.0.1 {ED_A}\n");
        let p = policy(&text, "127.0.0.1", 2222);
        let err = p.ensure_pinned().unwrap_err();
        assert!(err.contains("`[127.0.0.1]:2222`"), "{err}");
        let p = policy(&text, "127.0.0.1", 22);
        p.ensure_pinned().unwrap();
        p.verify(&key(ED_A)).unwrap();
    }

    // finding: APX-4
    #[test]
    fn a_port_qualified_entry_matches_only_its_port() {
        let text = format!("[127.0.0.1]:2222 {ED_A}\n");
        policy(&text, "127.0.0.1", 2222).verify(&key(ED_A)).unwrap();
        assert!(policy(&text, "127.0.0.1", 2223).ensure_pinned().is_err());
        assert!(policy(&text, "127.0.0.1", 22).ensure_pinned().is_err());
    }

    // finding: APX-4
    #[test]
    fn hashed_entries_written_by_ssh_keygen_match_their_host_only() {
        let text = format!("{HASHED_LOCAL_2222} {ED_A}\n{HASHED_EXAMPLE_COM} {ED_B}\n");
        let p = policy(&text, "127.0.0.1", 2222);
        p.verify(&key(ED_A)).unwrap();
        assert!(p.verify(&key(ED_B)).is_err());
        let p = policy(&text, "example.com", 22);
        assert_eq!(p.accepted().len(), 1);
        p.verify(&key(ED_B)).unwrap();
        assert!(policy(&text, "example.org", 22).ensure_pinned().is_err());
    }

    #[test]
    fn comma_lists_wildcards_negation_and_case_follow_openssh() {
        let text = format!(
            "other,Host.Example.COM {ED_A}\n*.lab,!bad.lab {ED_B}\n[10.0.0.?]:2022 {ECDSA}\n"
        );
        policy(&text, "host.example.com", 22)
            .verify(&key(ED_A))
            .unwrap();
        policy(&text, "vm1.lab", 22).verify(&key(ED_B)).unwrap();
        assert!(policy(&text, "bad.lab", 22).ensure_pinned().is_err());
        policy(&text, "10.0.0.7", 2022).verify(&key(ECDSA)).unwrap();
        assert!(policy(&text, "10.0.0.17", 2022).ensure_pinned().is_err());
    }

    #[test]
    fn tabs_comments_and_blank_lines_are_handled_and_counted() {
        let text = format!("# comment\n\n  h\t{ED_A}  trailing comment\n");
        let p = policy(&text, "h", 22);
        p.verify(&key(ED_A)).unwrap();
        assert_eq!(p.accepted()[0].source, "known_hosts test line 3");
    }

    // finding: L2
    #[test]
    fn a_revoked_key_is_refused_even_if_another_line_pins_it_and_the_message_names_the_line() {
        let text = format!("[h]:2222 {ED_A}\n# revoked below\n@revoked * {ED_A}\n");
        let err = policy(&text, "h", 2222).verify(&key(ED_A)).unwrap_err();
        assert!(err.contains("REVOKED"), "{err}");
        assert!(err.contains("h:2222"), "{err}");
        assert!(err.contains("known_hosts test line 3"), "{err}");
    }

    // finding: L2
    #[test]
    fn a_different_key_is_a_mismatch_naming_host_and_pinned_lines() {
        let text = format!("[h]:2222 {ED_A}\n");
        let err = policy(&text, "h", 2222).verify(&key(ED_B)).unwrap_err();
        assert!(err.contains("mismatch"), "{err}");
        assert!(err.contains("h:2222"), "{err}");
        assert!(err.contains("known_hosts test line 1"), "{err}");
    }

    // finding: L3
    #[test]
    fn offered_algorithms_are_exactly_those_pinned_for_the_host() {
        let text = format!("[h]:2222 {RSA}\nother {ED_A}\n");
        let algs = policy(&text, "h", 2222).algorithms();
        assert_eq!(
            algs,
            vec![
                Algorithm::Rsa {
                    hash: Some(HashAlg::Sha512)
                },
                Algorithm::Rsa {
                    hash: Some(HashAlg::Sha256)
                },
            ]
        );
        let text = format!("[h]:2222 {RSA}\n[h]:2222 {ECDSA}\n[h]:2222 {ED_A}\n");
        let algs = policy(&text, "h", 2222).algorithms();
        assert_eq!(algs.first(), Some(&Algorithm::Ed25519));
        assert_eq!(algs.len(), 4);
    }

    #[test]
    fn a_corrupt_line_for_our_host_is_an_error_but_one_for_another_host_is_ignored() {
        let text = "[h]:2222 ssh-ed25519 not-base64!\nother ssh-ed25519 garbage\n";
        let err = HostKeyPolicy::from_known_hosts(text, "known_hosts test", "h", 2222).unwrap_err();
        assert!(err.contains("line 1"), "{err}");
        assert!(policy(text, "other2", 22).ensure_pinned().is_err());
    }

    #[test]
    fn cert_authority_lines_are_reported_as_unsupported() {
        let text = format!("@cert-authority *.lab {ED_A}\n");
        let err = policy(&text, "vm.lab", 22).ensure_pinned().unwrap_err();
        assert!(err.contains("@cert-authority"), "{err}");
    }

    #[test]
    fn pinned_keys_accept_only_themselves() {
        let p = HostKeyPolicy::from_pinned(&[format!("{ED_A} comment")], "h", 22).unwrap();
        p.verify(&key(ED_A)).unwrap();
        let err = p.verify(&key(ED_B)).unwrap_err();
        assert!(err.contains("pinned key #1"), "{err}");
        assert!(HostKeyPolicy::from_pinned(&["nonsense".into()], "h", 22).is_err());
    }

    #[test]
    fn glob_matching_handles_stars_and_question_marks() {
        assert!(glob_match("*", "anything"));
        assert!(glob_match("a*c", "abbbc"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "abbc"));
        assert!(glob_match("*.lab", "x.y.lab"));
        assert!(!glob_match("*.lab", "x.lab.com"));
        assert!(glob_match("", ""));
        assert!(!glob_match("", "a"));
    }
}
