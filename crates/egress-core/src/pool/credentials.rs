//! Credentials a pool generates for its members: a user name derived from the pool and a
//! random password, in the form the proxy software in the guest accepts, and the digest
//! members' template hash includes (so new credentials replace the members).
//!
//! Guarantees: the randomness comes from the caller (the operating system's generator in a
//! driver), so this stays pure and testable; the password has [`PASSWORD_LEN`] characters of
//! `A-Z a-z 0-9`, drawn without modulo bias; the user name passes the guest's user-name rules
//! (at most 32 characters, a letter first); the digest does not reveal the password.

use sha2::{Digest, Sha256};

use crate::controller::ProxyCredentials;

/// Characters of a generated password.
// NB: 62^32 ≈ 2^190: far beyond guessing through a proxy's authentication prompt.
pub const PASSWORD_LEN: usize = 32;
/// What a generated password is drawn from (accepted by tinyproxy, dante, YAML and shells
/// without quoting).
const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
/// Longest generated user name (the guest's limit).
const MAX_USERNAME: usize = 32;

/// Generates a pool's credentials; `fill` fills a buffer with random bytes (as many calls as
/// it takes to draw [`PASSWORD_LEN`] unbiased characters).
pub fn generate(pool: &str, mut fill: impl FnMut(&mut [u8])) -> ProxyCredentials {
    // NB: 248 = 4·62; bytes at or above it are redrawn so every character is equally likely.
    let limit = u8::try_from(ALPHABET.len() * 4).unwrap_or(u8::MAX);
    let mut password = String::with_capacity(PASSWORD_LEN);
    let mut buf = [0u8; 64];
    while password.len() < PASSWORD_LEN {
        fill(&mut buf);
        for b in buf {
            if b < limit && password.len() < PASSWORD_LEN {
                let c = ALPHABET
                    .get(usize::from(b) % ALPHABET.len())
                    .copied()
                    .unwrap_or(b'a');
                password.push(char::from(c));
            }
        }
    }
    let mut username = format!("pool-{pool}");
    username.truncate(MAX_USERNAME);
    ProxyCredentials { username, password }
}

/// The digest of `c` that the members' template hash includes.
pub fn digest(c: &ProxyCredentials) -> String {
    let mut h = Sha256::new();
    h.update(b"egress-proxies pool credentials\0");
    h.update(c.username.as_bytes());
    h.update([0]);
    h.update(c.password.as_bytes());
    h.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Bytes of the key [`keyed_digest`] takes (HMAC-SHA-256's block: the key is used as it is).
pub const DIGEST_KEY_LEN: usize = 64;

/// The digest of `c` keyed by an installation's secret `key` (HMAC-SHA-256), for credentials
/// whose password was chosen rather than generated: whoever reads a member's template-hash
/// label (which includes the digest) cannot test password guesses offline without `key`.
pub fn keyed_digest(key: &[u8; DIGEST_KEY_LEN], c: &ProxyCredentials) -> String {
    use hmac::{KeyInit, Mac};
    let mut m = <hmac::Hmac<Sha256> as KeyInit>::new(&(*key).into());
    m.update(b"egress-proxies pool credentials\0");
    m.update(c.username.as_bytes());
    m.update(&[0]);
    m.update(c.password.as_bytes());
    m.finalize()
        .into_bytes()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The standalone file form: one line `username:password`.
pub fn to_file_line(c: &ProxyCredentials) -> String {
    format!("{}:{}\n", c.username, c.password)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_password_is_long_from_the_alphabet_and_redraws_biased_bytes() {
        let mut n = 0u8;
        let c = generate("web", |b| {
            for x in b.iter_mut() {
                *x = n;
                n = n.wrapping_add(1);
            }
        });
        assert_eq!(c.password.len(), PASSWORD_LEN);
        assert!(c.password.bytes().all(|b| ALPHABET.contains(&b)));
        assert_eq!(c.username, "pool-web");
        // Bytes 248..=255 only: nothing usable; then usable ones.
        let mut calls = 0;
        let c2 = generate(&"x".repeat(60), |b| {
            calls += 1;
            b.fill(if calls < 3 { 250 } else { 1 });
        });
        assert_eq!(calls, 3);
        assert_eq!(c2.password, "B".repeat(PASSWORD_LEN));
        assert_eq!(c2.username.len(), 32);
        // The guest's proxy configuration accepts them, credentials alone, for both protocols.
        for protocol in [
            crate::model::ProxyProtocol::Http,
            crate::model::ProxyProtocol::Socks5,
        ] {
            let settings = crate::model::ProxySettings {
                protocol,
                ..Default::default()
            };
            let policy = crate::proxy_policy::GuestPolicy::from_entry(&Default::default());
            for creds in [&c, &c2] {
                let r = crate::controller::userdata::render(&settings, Some(creds), &policy);
                assert!(r.is_ok(), "{protocol:?}: {r:?}");
            }
        }
    }

    #[test]
    fn the_digest_changes_with_the_password_and_does_not_contain_it() {
        let a = ProxyCredentials {
            username: "u".into(),
            password: "p".repeat(32),
        };
        let mut b = a.clone();
        b.password.replace_range(0..1, "q");
        assert_ne!(digest(&a), digest(&b));
        assert!(!digest(&a).contains(&a.password));
        assert_eq!(to_file_line(&a), format!("u:{}\n", a.password));
    }

    #[test]
    fn the_keyed_digest_cannot_be_recomputed_without_the_key() {
        let a = ProxyCredentials {
            username: "u".into(),
            password: "hunter2".into(),
        };
        let k1 = [1u8; DIGEST_KEY_LEN];
        let k2 = [2u8; DIGEST_KEY_LEN];
        // Stable for one key; another key (another installation) or the unkeyed digest (what a
        // guesser without the key computes) never matches.
        assert_eq!(keyed_digest(&k1, &a), keyed_digest(&k1, &a));
        assert_ne!(keyed_digest(&k1, &a), keyed_digest(&k2, &a));
        assert_ne!(keyed_digest(&k1, &a), digest(&a));
        let mut b = a.clone();
        b.password.push('!');
        assert_ne!(keyed_digest(&k1, &a), keyed_digest(&k1, &b));
        assert_eq!(keyed_digest(&k1, &a).len(), 32);
    }
}
