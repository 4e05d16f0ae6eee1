//! Client authentication: the pool's client credentials, each an accounting identity, checked
//! against the username (with its options, [`crate::username`]) and password a client sends.
//!
//! Guarantees:
//! - A wrong username and a wrong password are the same answer ([`Identities::authenticate`]
//!   returns `None` for both), so a client never learns which part was wrong.
//! - Passwords are kept as SHA-256 digests and compared in constant time (`subtle`), so the
//!   comparison's time does not depend on how much of a password was right.
//! - A `Proxy-Authorization` value is decoded within a bounded size ([`MAX_CREDENTIAL`]).

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::identity::IdentityRt;
use crate::model::Credential;
use crate::username::{self, Split};

/// Longest username or password accepted (SOCKS5's own limit, RFC 1929).
pub const MAX_CREDENTIAL: usize = 255;

fn digest(password: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"egress-gateway client password\0");
    h.update(password);
    h.finalize().into()
}

/// One identity: its password digest and its counters.
#[derive(Debug)]
struct Entry {
    digest: [u8; 32],
    rt: Arc<IdentityRt>,
}

/// A pool's client identities by username.
#[derive(Debug, Default)]
pub struct Identities {
    by_name: HashMap<String, Entry>,
}

impl Identities {
    /// The table for `clients`, reusing the counters in `previous` for usernames kept (so a
    /// credentials change never resets a limit); `make` builds a new identity's counters.
    pub fn build(
        clients: &[Credential],
        previous: Option<&Identities>,
        mut make: impl FnMut(&str) -> Arc<IdentityRt>,
    ) -> Self {
        let mut by_name = HashMap::with_capacity(clients.len());
        for c in clients {
            let rt = previous
                .and_then(|p| p.by_name.get(&c.username))
                .map(|e| Arc::clone(&e.rt))
                .unwrap_or_else(|| make(&c.username));
            by_name.insert(
                c.username.clone(),
                Entry {
                    digest: digest(c.password.as_bytes()),
                    rt,
                },
            );
        }
        Self { by_name }
    }

    /// Every identity's counters.
    pub fn all(&self) -> impl Iterator<Item = &Arc<IdentityRt>> {
        self.by_name.values().map(|e| &e.rt)
    }

    /// Whether `name` is an identity's username.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The identity `username` names (options split off) when `password` is its password;
    /// `None` for an unknown name and for a wrong password alike.
    pub fn authenticate<'u>(
        &self,
        username: &'u str,
        password: &[u8],
    ) -> Option<(Arc<IdentityRt>, Split<'u>)> {
        let given = digest(password);
        let split = username::split(username, |n| self.by_name.contains_key(n));
        // NB: an unknown name still costs a digest comparison, like a known one.
        let (entry, split) = match split.and_then(|s| self.by_name.get(s.name).map(|e| (e, s))) {
            Some(found) => found,
            None => {
                let _ = given.ct_eq(&[0u8; 32]);
                return None;
            }
        };
        bool::from(entry.digest.ct_eq(&given)).then(|| (Arc::clone(&entry.rt), split))
    }
}

/// Decodes a `Proxy-Authorization: Basic ...` value into username and password; `None` when
/// it is not Basic, not base64, not `user:password`, or longer than [`MAX_CREDENTIAL`] each.
pub fn parse_basic(value: &[u8]) -> Option<(String, Vec<u8>)> {
    let value = value.trim_ascii();
    let (scheme, token) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let token = token.trim_ascii();
    if token.len() > 4 * (2 * MAX_CREDENTIAL + 3).div_ceil(3) {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token)
        .ok()?;
    let colon = memchr::memchr(b':', &raw)?;
    let (user, pass) = raw.split_at(colon);
    let pass = pass.get(1..)?;
    if user.is_empty() || user.len() > MAX_CREDENTIAL || pass.len() > MAX_CREDENTIAL {
        return None;
    }
    Some((String::from_utf8(user.to_vec()).ok()?, pass.to_vec()))
}

/// The `Proxy-Authorization` value sending `c` (what the gateway sends a member).
pub fn basic_value(c: &Credential) -> String {
    let token =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.username, c.password));
    format!("Basic {token}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn table() -> Identities {
        let clients = [
            Credential {
                username: "alice".into(),
                password: "pw-a".into(),
            },
            Credential {
                username: "bob".into(),
                password: "pw-b".into(),
            },
        ];
        Identities::build(&clients, None, |n| Arc::new(IdentityRt::new(n)))
    }

    #[test]
    fn a_wrong_name_and_a_wrong_password_are_the_same_refusal() {
        let t = table();
        let (rt, s) = t.authenticate("alice-session-x", b"pw-a").unwrap();
        assert_eq!((rt.name(), s.session), ("alice", Some("x")));
        assert!(t.authenticate("alice", b"pw-b").is_none());
        assert!(t.authenticate("carol", b"pw-a").is_none());
        assert!(t.authenticate("alice", b"").is_none());
    }

    #[test]
    fn counters_survive_a_credentials_change_for_kept_names() {
        let t = table();
        let before = t.authenticate("bob", b"pw-b").unwrap().0;
        let t2 = Identities::build(
            &[Credential {
                username: "bob".into(),
                password: "new".into(),
            }],
            Some(&t),
            |n| Arc::new(IdentityRt::new(n)),
        );
        let after = t2.authenticate("bob", b"new").unwrap().0;
        assert!(Arc::ptr_eq(&before, &after));
        assert!(t2.authenticate("bob", b"pw-b").is_none());
    }

    #[test]
    fn basic_values_decode_within_bounds() {
        let v = basic_value(&Credential {
            username: "u".into(),
            password: "p:q".into(),
        });
        assert_eq!(
            parse_basic(v.as_bytes()),
            Some(("u".into(), b"p:q".to_vec()))
        );
        assert_eq!(
            parse_basic(b"basic dTpw"),
            Some(("u".into(), b"p".to_vec()))
        );
        for bad in [
            &b"Bearer dTpw"[..],
            b"Basic",
            b"Basic !!!",
            b"Basic OnA=",
            b"Basic dXNlcg==",
        ] {
            assert_eq!(parse_basic(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let long = basic_value(&Credential {
            username: "u".repeat(300),
            password: "p".into(),
        });
        assert_eq!(parse_basic(long.as_bytes()), None);
    }
}
