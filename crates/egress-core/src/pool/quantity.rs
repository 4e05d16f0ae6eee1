//! `maxSurge` / `maxUnavailable` values: a count (`1`) or a percentage of `replicas`
//! (`"25%"`), resolved with a Deployment's rounding so users' intuition holds: a surge
//! percentage rounds up, an unavailability percentage rounds down.
//!
//! Guarantees: no panic and no overflow on any input (checked and saturating arithmetic);
//! a percentage parses only as `0%`..=`100%` with whole digits.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A count of members, or a percentage of `replicas`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOrPercent {
    /// A number of members.
    Count(u32),
    /// A percentage of `replicas` (0..=100).
    Percent(u8),
}

/// How a percentage becomes a count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// Up (`maxSurge`).
    Up,
    /// Down (`maxUnavailable`).
    Down,
}

impl IntOrPercent {
    /// The count this value stands for with `replicas` members wanted.
    pub fn resolve(self, replicas: u32, rounding: Rounding) -> u32 {
        match self {
            Self::Count(n) => n,
            Self::Percent(p) => {
                let num = u64::from(replicas) * u64::from(p);
                let n = match rounding {
                    Rounding::Up => num.div_ceil(100),
                    Rounding::Down => num / 100,
                };
                u32::try_from(n).unwrap_or(u32::MAX)
            }
        }
    }

    /// Whether the value is a literal zero (`0` or `"0%"`).
    pub fn is_zero(self) -> bool {
        matches!(self, Self::Count(0) | Self::Percent(0))
    }

    /// Parses `"25%"` or `"3"`; `None` for anything else (a percentage above 100, a sign, a
    /// fraction).
    pub fn parse(s: &str) -> Option<Self> {
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if let Some(p) = s.strip_suffix('%') {
            if !digits(p) {
                return None;
            }
            let v: u8 = p.parse().ok()?;
            (v <= 100).then_some(Self::Percent(v))
        } else if digits(s) {
            s.parse().ok().map(Self::Count)
        } else {
            None
        }
    }
}

impl fmt::Display for IntOrPercent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Count(n) => write!(f, "{n}"),
            Self::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl Serialize for IntOrPercent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Count(n) => s.serialize_u32(*n),
            Self::Percent(_) => s.serialize_str(&self.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for IntOrPercent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(V)
    }
}

struct V;

impl Visitor<'_> for V {
    type Value = IntOrPercent;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a count of members (1) or a percentage of replicas (\"25%\", at most 100%)")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<IntOrPercent, E> {
        u32::try_from(v)
            .map(IntOrPercent::Count)
            .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<IntOrPercent, E> {
        u32::try_from(v)
            .map(IntOrPercent::Count)
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<IntOrPercent, E> {
        IntOrPercent::parse(v).ok_or_else(|| E::invalid_value(de::Unexpected::Str(v), &self))
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for IntOrPercent {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "IntOrPercent".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // NB: the bounds sit on the int-or-string node itself, where the API server applies
        // `minimum` to integers and `pattern` to strings. Inside an `anyOf` they bounded
        // nothing: a structural schema may not type the branches, and an untyped branch
        // accepts every value of the other kind (-1 passed the `pattern` branch, "abc" the
        // `minimum` one).
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            "minimum": 0,
            "pattern": "^(100|[1-9]?[0-9])%$"
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn percentages_round_like_a_deployment_surge_up_and_unavailable_down() {
        let p = IntOrPercent::Percent(25);
        assert_eq!(p.resolve(10, Rounding::Up), 3);
        assert_eq!(p.resolve(10, Rounding::Down), 2);
        assert_eq!(IntOrPercent::Percent(10).resolve(1000, Rounding::Up), 100);
        assert_eq!(IntOrPercent::Percent(1).resolve(1, Rounding::Up), 1);
        assert_eq!(IntOrPercent::Percent(1).resolve(1, Rounding::Down), 0);
        assert_eq!(
            IntOrPercent::Percent(100).resolve(u32::MAX, Rounding::Up),
            u32::MAX
        );
        assert_eq!(IntOrPercent::Count(4).resolve(2, Rounding::Down), 4);
    }

    #[test]
    fn counts_and_percentages_parse_and_anything_else_is_refused_naming_what_is_accepted() {
        for (y, want) in [
            ("1", IntOrPercent::Count(1)),
            ("\"3\"", IntOrPercent::Count(3)),
            ("\"25%\"", IntOrPercent::Percent(25)),
            ("\"100%\"", IntOrPercent::Percent(100)),
            ("\"0%\"", IntOrPercent::Percent(0)),
        ] {
            let got: IntOrPercent = serde_saphyr::from_str(y).unwrap();
            assert_eq!(got, want, "{y}");
        }
        for bad in [
            "-1", "\"101%\"", "\"2.5%\"", "\"%\"", "\"+3\"", "\"ten\"", "1.5",
        ] {
            let err = serde_saphyr::from_str::<IntOrPercent>(bad).unwrap_err();
            assert!(
                err.to_string().contains("percentage of replicas"),
                "{bad}: {err}"
            );
        }
        assert_eq!(
            serde_json::to_string(&IntOrPercent::Percent(10)).unwrap(),
            "\"10%\""
        );
        assert_eq!(serde_json::to_string(&IntOrPercent::Count(2)).unwrap(), "2");
    }
}
