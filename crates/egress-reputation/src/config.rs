//! The `reputation:` section of the provider config file, as written ([`RawReputation`]) and
//! as checked ([`Settings`]).
//!
//! ```yaml
//! reputation:
//!   resolvers: ["127.0.0.1:53"]     # required with zones: the system resolver is never used
//!   interval: 1h
//!   timeout: 5s
//!   concurrency: 32
//!   retireFor: 7d
//!   zones:
//!     - name: zen.spamhaus.org
//!       codes:
//!         - {answer: 127.0.0.2-127.0.0.3, means: listed, label: SBL}
//!         - {answer: 127.0.0.10-127.0.0.11, means: notListed, label: PBL}
//!       otherAnswers: listed
//! ```
//!
//! Guarantees: [`validate`] reports every problem at once, each with its field path under
//! the section (`zones[1].codes[0].answer`) and the bad value; a [`Settings`] it returns has
//! valid zone names (unique), at least one resolver when it has zones, every duration and
//! count within the bounds below, and no code table that could call an error answer
//! (`127.255.255.0/24`) or a non-`127.0.0.0/8` answer a listing. No I/O.
//!
//! One piece: the section as written, its validation and the checked settings describe the
//! same fields; about half the file is the tests that break each rule, kept beside it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use serde::Deserialize;

use crate::codes::{CodeRule, ERROR_RANGE, Meaning, ZoneCodes};
use crate::zone::Zone;

/// Default [`Settings::interval`]: one hour.
// NB: blocklists list and delist on a scale of hours; Spamhaus' free use allows a modest
// daily volume per resolver, and an hourly round of a few thousand addresses stays in it.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(3600);
/// Shortest interval.
pub const MIN_INTERVAL: Duration = Duration::from_secs(60);
/// Longest interval: one week.
pub const MAX_INTERVAL: Duration = Duration::from_secs(7 * 86_400);
/// Default [`Settings::timeout`] of one query (both attempts).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Shortest and longest query timeout.
pub const TIMEOUT_BOUNDS: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));
/// Default [`Settings::concurrency`]: queries in flight at once.
// NB: 32 keeps a local recursive resolver (unbound's default 1024 outgoing slots per thread)
// far from its limits and runs a 10,000-address round against one in seconds
// (docs/benchmarks.md).
pub const DEFAULT_CONCURRENCY: usize = 32;
/// Largest concurrency.
pub const MAX_CONCURRENCY: usize = 512;
/// Default [`Settings::retire_for`]: seven days.
// NB: most blocklists delist within days once the traffic stops (Spamhaus' CSS and XBL
// entries expire on their own in days); a week keeps a listed address out of use until then.
pub const DEFAULT_RETIRE_FOR: Duration = Duration::from_secs(7 * 86_400);
/// Bounds of [`Settings::retire_for`]: one hour to a year.
pub const RETIRE_BOUNDS: (Duration, Duration) =
    (Duration::from_secs(3600), Duration::from_secs(365 * 86_400));
/// Most zones.
pub const MAX_ZONES: usize = 16;
/// Most resolvers.
pub const MAX_RESOLVERS: usize = 4;
/// Most code rules per zone.
pub const MAX_CODES: usize = 64;
/// Longest code label.
pub const MAX_LABEL_LEN: usize = 64;

/// Resolvers known to be shared public services, which Spamhaus and others refuse (they
/// answer `127.255.255.254`): naming one is a warning.
const PUBLIC_RESOLVERS: [&str; 12] = [
    "8.8.8.8",
    "8.8.4.4",
    "1.1.1.1",
    "1.0.0.1",
    "9.9.9.9",
    "149.112.112.112",
    "208.67.222.222",
    "208.67.220.220",
    "2001:4860:4860::8888",
    "2001:4860:4860::8844",
    "2606:4700:4700::1111",
    "2620:fe::fe",
];

/// `reputation:` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawReputation {
    /// The blocklist zones to query.
    #[serde(default)]
    pub zones: Vec<RawZone>,
    /// The DNS resolvers to send the queries to: `IP` or `IP:PORT` (`[IPv6]:PORT`).
    #[serde(default)]
    pub resolvers: Vec<String>,
    /// How often every address is checked.
    #[serde(default, deserialize_with = "dur::option")]
    pub interval: Option<Duration>,
    /// Deadline of one query.
    #[serde(default, deserialize_with = "dur::option")]
    pub timeout: Option<Duration>,
    /// Queries in flight at once.
    #[serde(default)]
    pub concurrency: Option<u64>,
    /// How long an address a pool replaced a member for is kept out of use.
    #[serde(default, deserialize_with = "dur::option")]
    pub retire_for: Option<Duration>,
}

/// One zone as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawZone {
    /// The zone, e.g. `zen.spamhaus.org`.
    pub name: String,
    /// What the zone's answers mean, first match first.
    #[serde(default)]
    pub codes: Vec<RawCode>,
    /// What another `127.0.0.0/8` answer means: `listed` (default) or `failed`.
    #[serde(default)]
    pub other_answers: Option<Meaning>,
}

/// One code rule as written.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawCode {
    /// An answer (`127.0.0.2`), a range (`127.0.0.2-127.0.0.7`) or a CIDR (`127.0.0.0/30`).
    pub answer: String,
    /// `listed`, `notListed` or `failed`.
    pub means: Meaning,
    /// A short label shown with the listing, e.g. `SBL`.
    #[serde(default)]
    pub label: Option<String>,
}

/// A checked zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneSettings {
    /// The zone.
    pub zone: Zone,
    /// Its code table.
    pub codes: ZoneCodes,
}

/// The checked section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The zones, in file order, unique. Empty: no checks.
    pub zones: Vec<ZoneSettings>,
    /// Where queries go (at least one when there are zones).
    pub resolvers: Vec<SocketAddr>,
    /// Time between the starts of two rounds; also the deadline of one round.
    pub interval: Duration,
    /// Deadline of one query, both attempts included.
    pub timeout: Duration,
    /// Queries in flight at once.
    pub concurrency: usize,
    /// How long a replaced member's listed address stays retired.
    pub retire_for: Duration,
}

impl Settings {
    /// Whether any zone is configured (otherwise no check runs).
    pub fn enabled(&self) -> bool {
        !self.zones.is_empty()
    }
}

impl Default for Settings {
    /// No zones: nothing is checked.
    fn default() -> Self {
        Self {
            zones: Vec::new(),
            resolvers: Vec::new(),
            interval: DEFAULT_INTERVAL,
            timeout: DEFAULT_TIMEOUT,
            concurrency: DEFAULT_CONCURRENCY,
            retire_for: DEFAULT_RETIRE_FOR,
        }
    }
}

/// A problem at a field path under `reputation` (`zones[0].name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The path under the section.
    pub path: String,
    /// What is wrong, naming the value.
    pub message: String,
}

fn e(path: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError {
        path: path.into(),
        message: message.into(),
    }
}

/// Checks the section: the settings, or every error; warnings either way.
pub fn validate(raw: &RawReputation) -> (Result<Settings, Vec<FieldError>>, Vec<FieldError>) {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let zones = zones(&raw.zones, &mut errors);
    let resolvers = resolvers(&raw.resolvers, &mut errors, &mut warnings);
    if !raw.zones.is_empty() && raw.resolvers.is_empty() {
        errors.push(e(
            "resolvers",
            "required when zones are set: name the DNS resolver(s) to query, e.g. a \
             recursive resolver of your own such as unbound on 127.0.0.1 (the system resolver \
             is never used: blocklists refuse queries from shared public resolvers)",
        ));
    }
    let interval = bounded(
        "interval",
        raw.interval,
        DEFAULT_INTERVAL,
        (MIN_INTERVAL, MAX_INTERVAL),
        &mut errors,
    );
    let timeout = bounded(
        "timeout",
        raw.timeout,
        DEFAULT_TIMEOUT,
        TIMEOUT_BOUNDS,
        &mut errors,
    );
    let retire_for = bounded(
        "retireFor",
        raw.retire_for,
        DEFAULT_RETIRE_FOR,
        RETIRE_BOUNDS,
        &mut errors,
    );
    if timeout >= interval {
        errors.push(e(
            "timeout",
            format!(
                "{} is not shorter than interval {}",
                fmt_dur(timeout),
                fmt_dur(interval)
            ),
        ));
    }
    let concurrency = match raw.concurrency {
        None => DEFAULT_CONCURRENCY,
        Some(n) if (1..=MAX_CONCURRENCY as u64).contains(&n) => n as usize,
        Some(n) => {
            errors.push(e(
                "concurrency",
                format!("{n} is outside 1..={MAX_CONCURRENCY}"),
            ));
            DEFAULT_CONCURRENCY
        }
    };
    let out = if errors.is_empty() {
        Ok(Settings {
            zones,
            resolvers,
            interval,
            timeout,
            concurrency,
            retire_for,
        })
    } else {
        Err(errors)
    };
    (out, warnings)
}

fn bounded(
    path: &str,
    value: Option<Duration>,
    default: Duration,
    (min, max): (Duration, Duration),
    errors: &mut Vec<FieldError>,
) -> Duration {
    match value {
        None => default,
        Some(v) if v >= min && v <= max => v,
        Some(v) => {
            errors.push(e(
                path,
                format!(
                    "{} is outside {}..={}",
                    fmt_dur(v),
                    fmt_dur(min),
                    fmt_dur(max)
                ),
            ));
            default
        }
    }
}

/// `90s` → `1m30s`, for messages.
pub fn fmt_dur(d: Duration) -> String {
    let mut s = d.as_secs();
    if s == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, len) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
        if s >= len {
            out.push_str(&format!("{}{unit}", s / len));
            s %= len;
        }
    }
    out
}

fn zones(raw: &[RawZone], errors: &mut Vec<FieldError>) -> Vec<ZoneSettings> {
    if raw.len() > MAX_ZONES {
        errors.push(e(
            "zones",
            format!("{} zones; at most {MAX_ZONES}", raw.len()),
        ));
    }
    let mut out: Vec<ZoneSettings> = Vec::new();
    for (i, z) in raw.iter().enumerate().take(MAX_ZONES) {
        let at = format!("zones[{i}]");
        let codes = codes(&at, z, errors);
        match Zone::parse(&z.name) {
            Ok(zone) => {
                if out.iter().any(|o| o.zone == zone) {
                    errors.push(e(format!("{at}.name"), format!("{zone} is listed twice")));
                    continue;
                }
                out.push(ZoneSettings { zone, codes });
            }
            Err(err) => errors.push(e(format!("{at}.name"), err.to_string())),
        }
    }
    out
}

fn codes(at: &str, z: &RawZone, errors: &mut Vec<FieldError>) -> ZoneCodes {
    let mut rules = Vec::new();
    if z.codes.len() > MAX_CODES {
        errors.push(e(
            format!("{at}.codes"),
            format!("{} codes; at most {MAX_CODES}", z.codes.len()),
        ));
    }
    for (j, c) in z.codes.iter().enumerate().take(MAX_CODES) {
        let path = format!("{at}.codes[{j}]");
        if let Some(l) = &c.label
            && (l.is_empty()
                || l.chars().count() > MAX_LABEL_LEN
                || l.chars().any(char::is_control))
        {
            errors.push(e(
                format!("{path}.label"),
                format!("{l:?}: 1 to {MAX_LABEL_LEN} printable characters"),
            ));
        }
        let Some((first, last)) = parse_answer_range(&c.answer) else {
            errors.push(e(
                format!("{path}.answer"),
                format!(
                    "{:?} is not an IPv4 answer, a range A-B or a CIDR",
                    c.answer.chars().take(80).collect::<String>()
                ),
            ));
            continue;
        };
        if first.octets()[0] != 127 || last.octets()[0] != 127 {
            errors.push(e(
                format!("{path}.answer"),
                format!(
                    "{} reaches outside 127.0.0.0/8: blocklist answers lie inside it, and an \
                     answer outside it is always a failed check",
                    c.answer
                ),
            ));
            continue;
        }
        if c.means == Meaning::Listed && last >= ERROR_RANGE.0 {
            errors.push(e(
                format!("{path}.means"),
                format!(
                    "{} reaches into 127.255.255.0/24, the blocklists' error answers (e.g. \
                     127.255.255.254: query through a public resolver refused): they never \
                     mean listed",
                    c.answer
                ),
            ));
            continue;
        }
        rules.push(CodeRule {
            first,
            last,
            means: c.means,
            label: c.label.clone(),
        });
    }
    let other = match z.other_answers {
        None | Some(Meaning::Listed) => Meaning::Listed,
        Some(Meaning::Failed) => Meaning::Failed,
        Some(Meaning::NotListed) => {
            errors.push(e(
                format!("{at}.otherAnswers"),
                "notListed would read any answer the blocklist adds later as clean: use \
                 listed or failed",
            ));
            Meaning::Listed
        }
    };
    ZoneCodes { rules, other }
}

/// `127.0.0.2`, `127.0.0.2-127.0.0.7` or `127.0.0.0/30` → the inclusive range.
fn parse_answer_range(text: &str) -> Option<(Ipv4Addr, Ipv4Addr)> {
    let t = text.trim();
    if let Some((a, b)) = t.split_once('-') {
        let (a, b): (Ipv4Addr, Ipv4Addr) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        return (a <= b).then_some((a, b));
    }
    if let Some((a, len)) = t.split_once('/') {
        let a: Ipv4Addr = a.parse().ok()?;
        let len: u32 = len.parse().ok()?;
        if len > 32 {
            return None;
        }
        let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
        let n = u32::from(a);
        if n & !mask != 0 {
            return None;
        }
        return Some((Ipv4Addr::from(n), Ipv4Addr::from(n | !mask)));
    }
    let a: Ipv4Addr = t.parse().ok()?;
    Some((a, a))
}

fn resolvers(
    raw: &[String],
    errors: &mut Vec<FieldError>,
    warnings: &mut Vec<FieldError>,
) -> Vec<SocketAddr> {
    if raw.len() > MAX_RESOLVERS {
        errors.push(e(
            "resolvers",
            format!("{} resolvers; at most {MAX_RESOLVERS}", raw.len()),
        ));
    }
    let mut out = Vec::new();
    for (i, r) in raw.iter().enumerate().take(MAX_RESOLVERS) {
        let path = format!("resolvers[{i}]");
        let Some(addr) = parse_resolver(r) else {
            errors.push(e(
                path,
                format!(
                    "{:?} is not IP or IP:PORT ([IPv6]:PORT for IPv6 with a port)",
                    r.chars().take(80).collect::<String>()
                ),
            ));
            continue;
        };
        let ip = addr.ip();
        if ip.is_unspecified() || ip.is_multicast() || addr.port() == 0 {
            errors.push(e(
                path,
                format!("{addr} is not an address to send queries to"),
            ));
            continue;
        }
        if PUBLIC_RESOLVERS
            .iter()
            .any(|p| p.parse::<IpAddr>().is_ok_and(|p| p == ip))
        {
            warnings.push(e(
                path,
                format!(
                    "{ip} is a shared public resolver: Spamhaus and other blocklists refuse \
                     its queries (answering 127.255.255.254), so every check there fails; use \
                     a resolver of your own"
                ),
            ));
        }
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    out
}

/// `IP`, `IP:PORT`, `[IPv6]:PORT` → the address (port 53 by default).
fn parse_resolver(text: &str) -> Option<SocketAddr> {
    let t = text.trim();
    if let Ok(ip) = t.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, 53));
    }
    t.parse::<SocketAddr>().ok()
}

/// Durations as the rest of the provider config writes them: whole seconds (`30`) or a
/// string of `<integer><unit>` parts with units `s`, `m`, `h`, `d` (`90s`, `1h30m`, `7d`).
mod dur {
    use std::fmt;
    use std::time::Duration;

    use serde::Deserializer;
    use serde::de::{self, Visitor};

    pub fn option<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        d.deserialize_any(Dur).map(Some)
    }

    struct Dur;

    impl Visitor<'_> for Dur {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a duration: whole seconds (30) or a string such as \"30s\", \"5m\", \"1h30m\", \"7d\"")
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
            Ok(Duration::from_secs(v))
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
            u64::try_from(v)
                .map(Duration::from_secs)
                .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
            parse(v).ok_or_else(|| E::invalid_value(de::Unexpected::Str(v), &self))
        }
    }

    pub(super) fn parse(text: &str) -> Option<Duration> {
        let t = text.trim();
        if t.is_empty() {
            return None;
        }
        if let Ok(n) = t.parse::<u64>() {
            return Some(Duration::from_secs(n));
        }
        let mut total: u64 = 0;
        let mut num: Option<u64> = None;
        for c in t.chars() {
            if let Some(d) = c.to_digit(10) {
                num = Some(
                    num.unwrap_or(0)
                        .checked_mul(10)?
                        .checked_add(u64::from(d))?,
                );
                continue;
            }
            let unit: u64 = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                _ => return None,
            };
            total = total.checked_add(num.take()?.checked_mul(unit)?)?;
        }
        num.is_none().then_some(Duration::from_secs(total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> RawReputation {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn errors(yaml: &str) -> Vec<String> {
        match validate(&parse(yaml)).0 {
            Ok(_) => vec![],
            Err(es) => es
                .into_iter()
                .map(|e| format!("{}: {}", e.path, e.message))
                .collect(),
        }
    }

    #[test]
    fn an_empty_section_checks_nothing() {
        let (s, w) = validate(&RawReputation::default());
        let s = s.unwrap();
        assert!(!s.enabled());
        assert!(w.is_empty());
        assert_eq!(s.interval, DEFAULT_INTERVAL);
    }

    #[test]
    fn a_full_section_is_read_with_its_defaults() {
        let (s, w) = validate(&parse(
            "resolvers: ['127.0.0.1:5353', '::1', '[::1]:54']\n\
             interval: 30m\ntimeout: 3\nconcurrency: 8\nretireFor: 2d\n\
             zones:\n\
             - name: Zen.Spamhaus.org.\n  codes:\n\
             \x20 - {answer: 127.0.0.2-127.0.0.3, means: listed, label: SBL}\n\
             \x20 - {answer: 127.0.0.10/31, means: notListed, label: PBL}\n\
             \x20 - {answer: 127.255.255.254, means: failed, label: open resolver}\n\
             - name: bl.test\n  otherAnswers: failed\n",
        ));
        assert!(w.is_empty(), "{w:?}");
        let s = s.unwrap();
        assert_eq!(s.zones.len(), 2);
        assert_eq!(s.zones[0].zone.as_str(), "zen.spamhaus.org");
        assert_eq!(s.zones[0].codes.rules.len(), 3);
        assert_eq!(s.zones[0].codes.rules[1].last, Ipv4Addr::new(127, 0, 0, 11));
        assert_eq!(s.zones[1].codes.other, Meaning::Failed);
        assert_eq!(
            s.resolvers,
            vec![
                "127.0.0.1:5353".parse().unwrap(),
                "[::1]:53".parse().unwrap(),
                "[::1]:54".parse().unwrap()
            ]
        );
        assert_eq!(s.interval, Duration::from_secs(1800));
        assert_eq!(s.timeout, Duration::from_secs(3));
        assert_eq!(s.concurrency, 8);
        assert_eq!(s.retire_for, Duration::from_secs(2 * 86_400));
    }

    #[test]
    fn zones_without_a_resolver_are_refused_never_sent_to_the_system_resolver() {
        let es = errors("zones: [{name: bl.test}]\n");
        assert_eq!(es.len(), 1, "{es:?}");
        assert!(es[0].starts_with("resolvers: required"), "{es:?}");
    }

    #[test]
    fn every_bad_value_is_named_with_its_path() {
        let es = errors(
            "resolvers: ['dns.example', '0.0.0.0', '127.0.0.1:0']\n\
             interval: 10s\ntimeout: 2m\nconcurrency: 0\nretireFor: 1m\n\
             zones:\n\
             - name: 'not a zone'\n\
             - name: bl.test\n  codes:\n\
             \x20 - {answer: 10.0.0.2, means: listed}\n\
             \x20 - {answer: 127.255.255.0/24, means: listed}\n\
             \x20 - {answer: '127.0.0.9-127.0.0.2', means: listed}\n\
             \x20 - {answer: 127.0.0.2, means: listed, label: ''}\n\
             \x20 otherAnswers: notListed\n\
             - name: BL.test.\n",
        );
        let want = [
            "zones[0].name: \"not a zone\" is not a DNS zone name",
            "zones[1].codes[0].answer: 10.0.0.2 reaches outside 127.0.0.0/8",
            "zones[1].codes[1].means: 127.255.255.0/24 reaches into 127.255.255.0/24",
            "zones[1].codes[2].answer: \"127.0.0.9-127.0.0.2\" is not",
            "zones[1].codes[3].label",
            "zones[1].otherAnswers: notListed",
            "zones[2].name: bl.test is listed twice",
            "resolvers[0]: \"dns.example\" is not IP or IP:PORT",
            "resolvers[1]: 0.0.0.0:53 is not an address",
            "resolvers[2]: 127.0.0.1:0 is not an address",
            "interval: 10s is outside 1m..=7d",
            "timeout: 2m is outside 1s..=1m",
            "retireFor: 1m is outside 1h..=365d",
            "concurrency: 0 is outside 1..=512",
        ];
        for w in want {
            assert!(
                es.iter().any(|e| e.starts_with(w)),
                "missing {w:?} in {es:#?}"
            );
        }
        assert_eq!(es.len(), want.len(), "{es:#?}");
    }

    #[test]
    fn a_public_resolver_is_a_warning() {
        let (s, w) = validate(&parse("resolvers: ['8.8.8.8']\nzones: [{name: bl.test}]\n"));
        assert!(s.is_ok());
        assert_eq!(w.len(), 1);
        assert!(w[0].message.contains("127.255.255.254"), "{w:?}");
    }

    #[test]
    fn durations_take_units_or_seconds() {
        assert_eq!(dur::parse("90"), Some(Duration::from_secs(90)));
        assert_eq!(dur::parse("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(dur::parse("7d"), Some(Duration::from_secs(604_800)));
        for bad in ["", "5m3", "-1s", "1w", "1.5h"] {
            assert_eq!(dur::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn unknown_fields_and_bad_meanings_are_shape_errors() {
        assert!(serde_saphyr::from_str::<RawReputation>("zone: [x]\n").is_err());
        assert!(
            serde_saphyr::from_str::<RawReputation>(
                "zones: [{name: a.b, codes: [{answer: 127.0.0.2, means: bad}]}]\n"
            )
            .is_err()
        );
    }
}
