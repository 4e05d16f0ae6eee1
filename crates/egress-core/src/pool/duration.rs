//! Durations in a pool's spec: strings of one or more `<integer><unit>` parts with units
//! `s`, `m`, `h` and `d` (`"30s"`, `"5m"`, `"1h30m"`, `"7d"`), as Kubernetes users write
//! them; a day is 24 hours.
//!
//! Guarantees: never panics; an overflow, an empty string, a bare number, a sign, a fraction
//! or an unknown unit is `None` (validation turns it into an error naming the field).

use std::time::Duration;

/// Parses `"1h30m"`-style durations; `None` for anything else.
pub fn parse_duration(text: &str) -> Option<Duration> {
    if text.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    let mut num: Option<u64> = None;
    for c in text.chars() {
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
    // A trailing number without a unit ("5m3", "30") is refused: say which unit is meant.
    num.is_none().then_some(Duration::from_secs(total))
}

/// The canonical spelling of `d` in whole seconds (`"1h30m"`, `"0s"`).
pub fn format_duration(d: Duration) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_units_and_anything_else_is_refused() {
        let secs = |t: &str| parse_duration(t).map(|d| d.as_secs());
        assert_eq!(secs("30s"), Some(30));
        assert_eq!(secs("5m"), Some(300));
        assert_eq!(secs("1h30m"), Some(5400));
        assert_eq!(secs("7d"), Some(604_800));
        assert_eq!(secs("0s"), Some(0));
        for bad in [
            "",
            "30",
            "5m3",
            "-5m",
            "1.5h",
            "5 m",
            "m",
            "1w",
            "99999999999999999999d",
        ] {
            assert_eq!(secs(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_canonical_spelling_reads_back_as_the_same_duration() {
        for s in [0, 1, 59, 60, 61, 3600, 5400, 86_400, 90_061, u64::MAX] {
            let d = Duration::from_secs(s);
            assert_eq!(parse_duration(&format_duration(d)), Some(d), "{s}");
        }
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
    }
}
