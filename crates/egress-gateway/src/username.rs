//! The username syntax: `NAME[-session-ID][-ttl-DURATION][-egress-ADDRESS]`, the options in
//! any order, each at most once, after the identity's own username `NAME`.
//!
//! - `session-ID`: a sticky session; `ID` is 1 to 64 letters, digits or `_`.
//! - `ttl-DURATION`: how long the session holds (`90s`, `10m`, `1h30m`, `1d`), within the
//!   pool's bounds; needs a session.
//! - `egress-ADDRESS`: only a member whose egress address is `ADDRESS` (IPv4 or IPv6).
//!
//! How the name is found: the username is an identity's username as a whole, or options are
//! taken off its end one `-KEY-VALUE` at a time (a value holds no `-`) until what is left is
//! an identity's username. So `NAME` itself may contain `-`, even `-session-`, and a username
//! that is exactly an identity's always means that identity without options.
//!
//! Guarantees: pure, never panics, allocation-free until an option is validated; whatever
//! does not lead to a known identity is simply "no identity" (the caller answers as for a
//! wrong password, so a client learns nothing about which part was wrong); option errors are
//! reported only after the password was checked.

use std::net::IpAddr;
use std::time::Duration;

/// Longest session ID.
pub const MAX_SESSION_ID: usize = 64;
/// Most options in one username (`session`, `ttl`, `egress`).
const MAX_OPTIONS: usize = 3;

/// A username split into the identity's name and the raw options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Split<'a> {
    /// The identity's username.
    pub name: &'a str,
    /// `session` value, when given.
    pub session: Option<&'a str>,
    /// `ttl` value, when given.
    pub ttl: Option<&'a str>,
    /// `egress` value, when given.
    pub egress: Option<&'a str>,
    /// An option was given twice.
    pub duplicate: Option<&'static str>,
}

/// Options after validation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Options {
    /// The session ID.
    pub session: Option<String>,
    /// The TTL asked for.
    pub ttl: Option<Duration>,
    /// The egress address asked for.
    pub egress: Option<IpAddr>,
}

/// Why a username's options are refused (the message names the part at fault).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OptionError(pub String);

/// Splits `username`; `None` when no identity (as `is_identity` tells) is found.
pub fn split<'a>(username: &'a str, is_identity: impl Fn(&str) -> bool) -> Option<Split<'a>> {
    let mut s = Split {
        name: username,
        ..Split::default()
    };
    for _ in 0..=MAX_OPTIONS {
        if is_identity(s.name) {
            return Some(s);
        }
        let (rest, value) = s.name.rsplit_once('-')?;
        let (rest, key) = rest.rsplit_once('-')?;
        if value.is_empty() || rest.is_empty() {
            return None;
        }
        let slot = match key {
            "session" => &mut s.session,
            "ttl" => &mut s.ttl,
            "egress" => &mut s.egress,
            _ => return None,
        };
        if slot.is_some() {
            s.duplicate = Some(match key {
                "session" => "session",
                "ttl" => "ttl",
                _ => "egress",
            });
        }
        *slot = Some(value);
        s.name = rest;
    }
    None
}

/// Parses a TTL (`90s`, `10m`, `1h30m`, `1d`): whole numbers with units `s`, `m`, `h`, `d`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    if text.is_empty() || text.len() > 32 {
        return None;
    }
    let mut total: u64 = 0;
    let mut num: Option<u64> = None;
    for c in text.bytes() {
        if c.is_ascii_digit() {
            num = Some(
                num.unwrap_or(0)
                    .checked_mul(10)?
                    .checked_add(u64::from(c - b'0'))?,
            );
            continue;
        }
        let unit: u64 = match c {
            b's' => 1,
            b'm' => 60,
            b'h' => 3600,
            b'd' => 86_400,
            _ => return None,
        };
        total = total.checked_add(num.take()?.checked_mul(unit)?)?;
    }
    num.is_none().then_some(Duration::from_secs(total))
}

impl Split<'_> {
    /// Validates the options against the pool's session settings.
    pub fn options(&self, sessions: &crate::model::Sessions) -> Result<Options, OptionError> {
        if let Some(k) = self.duplicate {
            return Err(OptionError(format!(
                "the username gives -{k}- more than once"
            )));
        }
        let mut o = Options::default();
        if let Some(id) = self.session {
            if !sessions.enabled {
                return Err(OptionError(
                    "sticky sessions are turned off for this pool (no -session- in the username)"
                        .into(),
                ));
            }
            if id.len() > MAX_SESSION_ID
                || !id.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
            {
                return Err(OptionError(format!(
                    "session ID {:?} must be 1 to {MAX_SESSION_ID} letters, digits or _",
                    crate::text::clip(id, 80)
                )));
            }
            o.session = Some(id.to_owned());
        }
        if let Some(t) = self.ttl {
            if o.session.is_none() {
                return Err(OptionError(
                    "-ttl- needs a session (NAME-session-ID-ttl-DURATION)".into(),
                ));
            }
            let d = parse_duration(t).ok_or_else(|| {
                OptionError(format!(
                    "ttl {:?} is not a duration (e.g. 90s, 10m, 1h30m)",
                    crate::text::clip(t, 40)
                ))
            })?;
            if d < Duration::from_secs(1) || d > sessions.max_ttl {
                return Err(OptionError(format!(
                    "ttl {t} is outside 1s to {}s, the pool's maximum",
                    sessions.max_ttl.as_secs()
                )));
            }
            o.ttl = Some(d);
        }
        if let Some(e) = self.egress {
            let ip: IpAddr = e.parse().map_err(|_| {
                OptionError(format!(
                    "egress {:?} is not an IP address",
                    crate::text::clip(e, 60)
                ))
            })?;
            o.egress = Some(crate::target::normalize(ip));
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::Sessions;

    fn ids(u: &str) -> bool {
        ["alice", "pool-web", "team-session-x"].contains(&u)
    }

    #[test]
    fn options_come_off_the_end_until_an_identity_is_left() {
        let s = split("alice", ids).unwrap();
        assert_eq!((s.name, s.session), ("alice", None));
        let s = split("pool-web-session-abc_1-ttl-10m", ids).unwrap();
        assert_eq!(
            (s.name, s.session, s.ttl),
            ("pool-web", Some("abc_1"), Some("10m"))
        );
        let s = split("alice-egress-203.0.113.7-session-s1", ids).unwrap();
        assert_eq!(
            (s.name, s.session, s.egress),
            ("alice", Some("s1"), Some("203.0.113.7"))
        );
        // A name containing an option keyword is still its own identity.
        let s = split("team-session-x", ids).unwrap();
        assert_eq!((s.name, s.session), ("team-session-x", None));
        let s = split("team-session-x-session-y", ids).unwrap();
        assert_eq!((s.name, s.session), ("team-session-x", Some("y")));
        for unknown in [
            "bob",
            "alice-sesion-x",
            "alice-session-",
            "-session-x",
            "alice-session-a-b",
            "",
            "alice-session-a-ttl-1m-egress-1.2.3.4-session-b",
        ] {
            assert!(split(unknown, ids).is_none(), "{unknown}");
        }
    }

    #[test]
    fn options_are_checked_against_the_pool_and_name_the_part_at_fault() {
        let on = Sessions::default();
        let o = split("alice-session-s1-ttl-1h30m", ids)
            .unwrap()
            .options(&on)
            .unwrap();
        assert_eq!(o.session.as_deref(), Some("s1"));
        assert_eq!(o.ttl, Some(Duration::from_secs(5400)));
        let err = |u: &str, s: &Sessions| split(u, ids).unwrap().options(s).unwrap_err().0;
        assert!(err("alice-session-a-session-b", &on).contains("more than once"));
        assert!(err("alice-ttl-10m", &on).contains("needs a session"));
        assert!(err("alice-session-a-ttl-10x", &on).contains("not a duration"));
        assert!(err("alice-session-a-ttl-2d", &on).contains("outside"));
        assert!(err("alice-egress-nope", &on).contains("not an IP"));
        assert!(err(&format!("alice-session-{}", "a".repeat(65)), &on).contains("1 to 64"));
        let off = Sessions {
            enabled: false,
            ..Sessions::default()
        };
        assert!(err("alice-session-a", &off).contains("turned off"));
        let o = split("alice-egress-::ffff:192.0.2.1", ids)
            .unwrap()
            .options(&on)
            .unwrap();
        assert_eq!(o.egress, Some("192.0.2.1".parse().unwrap()));
    }

    #[test]
    fn durations_parse_in_units() {
        assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("1d"), Some(Duration::from_secs(86_400)));
        for bad in ["", "10", "1.5h", "5 m", "1w", "99999999999999999999d"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
