//! What a blocklist's answer means, and the [`Verdict`] of one query.
//!
//! Each zone has its own table of answer codes (`reputation.zones[].codes`), looked up first
//! match first, then the rules every zone shares:
//! - `127.255.255.0/24` is the blocklists' error range: Spamhaus answers `127.255.255.252`
//!   (a typing error in the zone name), `127.255.255.254` (the query came through a public or
//!   open resolver) and `127.255.255.255` (too many queries) instead of a listing. Such an
//!   answer is a **failed check**, whatever the zone's table says (the config refuses a table
//!   that would call one `listed`);
//! - any other `127.0.0.0/8` answer the table does not name means what the zone's
//!   `otherAnswers` says (`listed`, RFC 5782's rule, by default);
//! - an answer outside `127.0.0.0/8` is a **failed check** (a resolver that rewrites
//!   NXDOMAIN to an address of its own, a zone that is not a blocklist), never a listing.
//!
//! Guarantees: [`classify`] is pure and total; a query that did not get an authoritative
//! "no" (NXDOMAIN or no `A` record) or a listing code never yields
//! [`Verdict::NotListed`]; a failed check never yields [`Verdict::Listed`]: one error or
//! foreign answer among several answers fails the whole check.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

/// What an answer code means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Meaning {
    /// The address is listed.
    Listed,
    /// The answer does not list the address (e.g. a policy list the user does not act on).
    NotListed,
    /// The check failed: the blocklist refused to answer.
    Failed,
}

/// One row of a zone's code table: answers `first..=last` mean `means`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeRule {
    /// First answer of the range.
    pub first: Ipv4Addr,
    /// Last answer of the range (inclusive).
    pub last: Ipv4Addr,
    /// What those answers mean.
    pub means: Meaning,
    /// A short label shown with the listing or failure (e.g. `SBL`); the answer itself when
    /// absent.
    pub label: Option<String>,
}

impl CodeRule {
    fn contains(&self, a: Ipv4Addr) -> bool {
        self.first <= a && a <= self.last
    }
}

/// A zone's answer-code table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneCodes {
    /// Rules, first match first.
    pub rules: Vec<CodeRule>,
    /// What a `127.0.0.0/8` answer outside the error range that no rule names means:
    /// [`Meaning::Listed`] or [`Meaning::Failed`].
    pub other: Meaning,
}

impl Default for ZoneCodes {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            other: Meaning::Listed,
        }
    }
}

/// The blocklists' error range, `127.255.255.0/24`.
pub const ERROR_RANGE: (Ipv4Addr, Ipv4Addr) = (
    Ipv4Addr::new(127, 255, 255, 0),
    Ipv4Addr::new(127, 255, 255, 255),
);

/// The known error answers and what they say.
const ERROR_CODES: [(u8, &str); 3] = [
    (
        252,
        "the blocklist refused the query: typing error in the zone name",
    ),
    (
        254,
        "the blocklist refused the query: it came through a public or open resolver",
    ),
    (
        255,
        "the blocklist refused the query: too many queries (over quota)",
    ),
];

/// Whether `a` is in the error range `127.255.255.0/24`.
pub fn is_error_answer(a: Ipv4Addr) -> bool {
    ERROR_RANGE.0 <= a && a <= ERROR_RANGE.1
}

impl ZoneCodes {
    /// What answer `a` means in this zone, with its label.
    pub fn meaning(&self, a: Ipv4Addr) -> (Meaning, String) {
        if a.octets()[0] != 127 {
            return (
                Meaning::Failed,
                format!(
                    "answer {a} is outside 127.0.0.0/8: not a blocklist answer (does the resolver \
                     rewrite NXDOMAIN?)"
                ),
            );
        }
        let rule = self.rules.iter().find(|r| r.contains(a));
        if is_error_answer(a) {
            let known = ERROR_CODES
                .iter()
                .find(|(last, _)| a.octets()[3] == *last)
                .map(|(_, what)| *what);
            let label = match (rule.and_then(|r| r.label.as_deref()), known) {
                (Some(l), _) => format!("{a} ({l})"),
                (None, Some(what)) => format!("{a}: {what}"),
                (None, None) => format!("{a}: an error answer of the blocklist"),
            };
            return (Meaning::Failed, label);
        }
        match rule {
            Some(r) => (r.means, r.label.clone().unwrap_or_else(|| a.to_string())),
            None if self.other == Meaning::Failed => (
                Meaning::Failed,
                format!("answer {a} is not in the zone's codes"),
            ),
            None => (self.other, a.to_string()),
        }
    }
}

/// Why a check failed, as a small fixed set (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// No answer within the query's deadline (or the round's).
    Timeout,
    /// The resolver answered REFUSED.
    Refused,
    /// The resolver answered SERVFAIL (or another error code).
    ServFail,
    /// The resolver could not be reached (connection refused, unreachable).
    Network,
    /// The blocklist answered an error code (`127.255.255.x`, or a code the zone's table
    /// calls `failed`).
    ErrorAnswer,
    /// An answer outside `127.0.0.0/8`.
    ForeignAnswer,
    /// Anything else the DNS client reported.
    Other,
}

impl FailureKind {
    /// Every kind, in a fixed order (metric families are present from start).
    pub const ALL: [Self; 7] = [
        Self::Timeout,
        Self::Refused,
        Self::ServFail,
        Self::Network,
        Self::ErrorAnswer,
        Self::ForeignAnswer,
        Self::Other,
    ];

    /// The stable label: `timeout`, `refused`, `servfail`, `network`, `error_answer`,
    /// `foreign_answer`, `other`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Refused => "refused",
            Self::ServFail => "servfail",
            Self::Network => "network",
            Self::ErrorAnswer => "error_answer",
            Self::ForeignAnswer => "foreign_answer",
            Self::Other => "other",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// What one query returned, before classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The `A` records of the answer (as addresses; `AAAA` never asked).
    Answers(Vec<IpAddr>),
    /// NXDOMAIN, or the name exists without an `A` record: not listed.
    NoRecord,
    /// The query failed.
    Failed(FailureKind, String),
}

/// The result of one check of one address in one zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Listed; the answers and their labels, in answer order, deduplicated.
    Listed {
        /// The answers that list the address.
        codes: Vec<Ipv4Addr>,
        /// Their labels (the zone's `label`, else the answer).
        labels: Vec<String>,
    },
    /// Not listed.
    NotListed,
    /// The check failed; nothing is known.
    Failed {
        /// Why, as a metric label.
        kind: FailureKind,
        /// Why, for people.
        detail: String,
    },
}

/// Classifies one query's outcome with the zone's table.
pub fn classify(codes: &ZoneCodes, outcome: Outcome) -> Verdict {
    let answers = match outcome {
        Outcome::NoRecord => return Verdict::NotListed,
        Outcome::Failed(kind, detail) => return Verdict::Failed { kind, detail },
        Outcome::Answers(a) if a.is_empty() => return Verdict::NotListed,
        Outcome::Answers(a) => a,
    };
    let mut listed: Vec<Ipv4Addr> = Vec::new();
    let mut labels: Vec<String> = Vec::new();
    let mut error: Option<String> = None;
    for a in answers {
        let IpAddr::V4(v4) = a else {
            return Verdict::Failed {
                kind: FailureKind::ForeignAnswer,
                detail: format!("answer {a} is not an IPv4 address"),
            };
        };
        let (means, label) = codes.meaning(v4);
        match means {
            // A foreign answer fails the whole check at once.
            Meaning::Failed if v4.octets()[0] != 127 => {
                return Verdict::Failed {
                    kind: FailureKind::ForeignAnswer,
                    detail: label,
                };
            }
            Meaning::Failed => {
                error.get_or_insert(label);
            }
            Meaning::Listed if !listed.contains(&v4) => {
                listed.push(v4);
                labels.push(label);
            }
            Meaning::Listed | Meaning::NotListed => {}
        }
    }
    if let Some(detail) = error {
        return Verdict::Failed {
            kind: FailureKind::ErrorAnswer,
            detail,
        };
    }
    if listed.is_empty() {
        Verdict::NotListed
    } else {
        Verdict::Listed {
            codes: listed,
            labels,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn spamhaus_like() -> ZoneCodes {
        ZoneCodes {
            rules: vec![
                CodeRule {
                    first: Ipv4Addr::new(127, 0, 0, 2),
                    last: Ipv4Addr::new(127, 0, 0, 3),
                    means: Meaning::Listed,
                    label: Some("SBL".into()),
                },
                CodeRule {
                    first: Ipv4Addr::new(127, 0, 0, 10),
                    last: Ipv4Addr::new(127, 0, 0, 11),
                    means: Meaning::NotListed,
                    label: Some("PBL".into()),
                },
            ],
            other: Meaning::Listed,
        }
    }

    #[test]
    fn nxdomain_and_empty_answers_are_not_listed() {
        let c = ZoneCodes::default();
        assert_eq!(classify(&c, Outcome::NoRecord), Verdict::NotListed);
        assert_eq!(classify(&c, Outcome::Answers(vec![])), Verdict::NotListed);
    }

    #[test]
    fn listing_codes_are_listed_with_their_labels() {
        let v = classify(
            &spamhaus_like(),
            Outcome::Answers(vec![v4("127.0.0.2"), v4("127.0.0.4"), v4("127.0.0.2")]),
        );
        assert_eq!(
            v,
            Verdict::Listed {
                codes: vec![Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 4)],
                labels: vec!["SBL".into(), "127.0.0.4".into()],
            }
        );
    }

    #[test]
    fn a_not_listed_code_alone_is_not_a_listing() {
        assert_eq!(
            classify(&spamhaus_like(), Outcome::Answers(vec![v4("127.0.0.10")])),
            Verdict::NotListed
        );
    }

    #[test]
    fn spamhaus_error_answers_are_failures_never_listings() {
        for (code, word) in [
            ("127.255.255.252", "typing error"),
            ("127.255.255.254", "public or open resolver"),
            ("127.255.255.255", "over quota"),
            ("127.255.255.1", "error answer"),
        ] {
            // Even with a listing beside it, and in a zone whose other answers are listings.
            let v = classify(
                &spamhaus_like(),
                Outcome::Answers(vec![v4("127.0.0.2"), v4(code)]),
            );
            match v {
                Verdict::Failed { kind, detail } => {
                    assert_eq!(kind, FailureKind::ErrorAnswer, "{code}");
                    assert!(detail.contains(word), "{code}: {detail}");
                }
                other => panic!("{code}: {other:?}"),
            }
        }
    }

    #[test]
    fn answers_outside_127_8_are_failures_never_listings() {
        for a in ["10.0.0.1", "192.0.2.7", "128.0.0.2", "::1"] {
            let v = classify(
                &ZoneCodes::default(),
                Outcome::Answers(vec![v4("127.0.0.2"), v4(a)]),
            );
            assert!(
                matches!(
                    v,
                    Verdict::Failed {
                        kind: FailureKind::ForeignAnswer,
                        ..
                    }
                ),
                "{a}: {v:?}"
            );
        }
    }

    #[test]
    fn other_answers_follow_the_zone_setting() {
        let mut c = ZoneCodes::default();
        assert!(matches!(
            classify(&c, Outcome::Answers(vec![v4("127.0.0.99")])),
            Verdict::Listed { .. }
        ));
        c.other = Meaning::Failed;
        assert!(matches!(
            classify(&c, Outcome::Answers(vec![v4("127.0.0.99")])),
            Verdict::Failed {
                kind: FailureKind::ErrorAnswer,
                ..
            }
        ));
    }

    #[test]
    fn query_failures_pass_through() {
        let v = classify(
            &ZoneCodes::default(),
            Outcome::Failed(FailureKind::Timeout, "no answer in 5s".into()),
        );
        assert_eq!(
            v,
            Verdict::Failed {
                kind: FailureKind::Timeout,
                detail: "no answer in 5s".into()
            }
        );
    }
}
