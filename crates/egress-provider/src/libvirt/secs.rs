//! Reads a duration of the config file: an integer number of seconds (`30`), or a string of
//! one or more `<integer><unit>` parts with units `s`, `m`, `h` (`"30s"`, `"5m"`, `"1h30m"`),
//! as the command line's flags take them. Anything else (a negative or fractional number,
//! an unknown unit, an overflow) is a type error naming what is accepted.

use std::fmt;
use std::time::Duration;

use serde::Deserializer;
use serde::de::{self, Visitor};

/// Reads a duration (see the module docs).
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(Secs)
}

struct Secs;

impl Visitor<'_> for Secs {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a duration: whole seconds (30) or a string such as \"30s\", \"5m\", \"1h30m\"")
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

/// `"30"`, `"30s"`, `"5m"`, `"1h30m"` → the duration; `None` for anything else.
fn parse(text: &str) -> Option<Duration> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    let mut num = String::new();
    for c in t.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let unit: u64 = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            _ => return None,
        };
        let n: u64 = num.parse().ok()?;
        num.clear();
        total = total.checked_add(n.checked_mul(unit)?)?;
    }
    // A bare number is seconds; a trailing number after units ("5m3") is refused.
    if num.is_empty() {
        Some(Duration::from_secs(total))
    } else if total == 0 && num.len() == t.len() {
        num.parse().ok().map(Duration::from_secs)
    } else {
        None
    }
}
