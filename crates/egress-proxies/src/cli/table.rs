//! Plain text tables in the style of `kubectl get`: a header row, columns padded to the
//! widest cell, two spaces between columns, no borders.
//!
//! Guarantees: a cell never contains a newline or control character (they are replaced by a
//! space, so a hostile string cannot forge rows); widths count characters, not bytes; the
//! last column is not padded (no trailing spaces).
//!
//! NB: hand-written rather than `comfy-table`/`tabled`: borderless left-aligned columns are
//! a few lines, and those crates add terminal-width probing and styling we do not want in
//! output that scripts and tests read.

use std::fmt::Write as _;

/// A table being built: a header and rows of the same number of cells.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| clean(h)).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are empty, extra cells are dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut r: Vec<String> = cells.iter().map(|c| clean(c)).collect();
        r.resize(self.header.len(), String::new());
        self.rows.push(r);
    }

    /// The rendered table, one line per row, each ending in `\n`.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        for r in std::iter::once(&self.header).chain(&self.rows) {
            let n = r.len();
            for (i, (c, w)) in r.iter().zip(&widths).enumerate() {
                if i + 1 == n {
                    out.push_str(c);
                } else {
                    let _ = write!(out, "{c:<w$}  ");
                }
            }
            let trimmed = out.trim_end_matches(' ').len();
            out.truncate(trimmed);
            out.push('\n');
        }
        out
    }
}

/// Replaces control characters (newlines included) with spaces.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `n` bytes in binary units with one decimal (`1.5 GiB`), bytes below 1 KiB.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    // NB: f64 loses precision above 2^53 bytes (8 PiB); one decimal does not need it.
    let mut v = n as f64 / 1024.0;
    let mut unit = "KiB";
    for u in UNITS.iter().skip(1) {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

/// A short human age: `42s`, `5m`, `3h`, `2d`.
pub fn age(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_padded_to_the_widest_cell_without_trailing_spaces() {
        let mut t = Table::new(&["A", "LONGER"]);
        t.row(vec!["wide cell".into(), "x".into()]);
        t.row(vec!["y".into()]);
        assert_eq!(t.render(), "A          LONGER\nwide cell  x\ny\n");
    }

    #[test]
    fn control_characters_cannot_forge_a_row() {
        let mut t = Table::new(&["NAME"]);
        t.row(vec!["a\nb\tc".into()]);
        assert_eq!(t.render(), "NAME\na b c\n");
    }

    #[test]
    fn sizes_and_ages_are_short_and_binary() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(5 << 30), "5.0 GiB");
        assert_eq!(age(std::time::Duration::from_secs(59)), "59s");
        assert_eq!(age(std::time::Duration::from_secs(7200)), "2h");
        assert_eq!(age(std::time::Duration::from_secs(3 * 86400)), "3d");
    }
}
