//! The fleet page's sparklines: inline SVG, one per host and one per pool, of the last hour's
//! samples.
//!
//! Guarantees: the drawing is a pure function of the samples; it uses only presentation
//! attributes and classes (no `style=`, so the page's strict CSP holds), and stays inside its
//! [`SPARK_W`] × [`SPARK_H`] box whatever the counts.

use std::fmt::Write as _;

use maud::{Markup, html};

use crate::history::Sample;

/// Sparkline width (SVG user units = CSS pixels).
pub const SPARK_W: u32 = 120;
/// Sparkline height.
pub const SPARK_H: u32 = 24;

/// What a sparkline is about, for its title.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// A host: ready proxies over the host's Ready state.
    Host,
    /// A ProxyPool: available members over "all members available".
    Pool,
}

/// A sparkline of ready proxies or available members (line) over up/down (a strip of cells),
/// oldest first.
pub fn sparkline(samples: &[Sample], subject: Subject) -> Markup {
    let n = u32::try_from(samples.len()).unwrap_or(u32::MAX).max(1);
    let top = samples
        .iter()
        .map(|s| s.total.max(s.ready))
        .max()
        .unwrap_or(0)
        .max(1);
    let line_h = SPARK_H - 6;
    let x = |i: usize| -> u32 {
        let i = u32::try_from(i).unwrap_or(u32::MAX);
        if n <= 1 {
            SPARK_W / 2
        } else {
            i.saturating_mul(SPARK_W - 2) / (n - 1) + 1
        }
    };
    let y = |v: u32| -> u32 { 1 + (line_h - 2) - v.min(top).saturating_mul(line_h - 2) / top };
    let mut points = String::new();
    for (i, s) in samples.iter().enumerate() {
        let _ = write!(points, "{},{} ", x(i), y(s.ready));
    }
    // Cell i spans [edge(i), edge(i + 1)): the strip fills the width whatever the count.
    let edge = |i: usize| -> u32 {
        let i = u32::try_from(i).unwrap_or(u32::MAX);
        u32::try_from(u64::from(i) * u64::from(SPARK_W) / u64::from(n)).unwrap_or(SPARK_W)
    };
    let cells: Vec<(&str, u32, u32)> = samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (a, b) = (edge(i), edge(i + 1));
            (
                if s.up { "up" } else { "down" },
                a,
                b.saturating_sub(a).max(1),
            )
        })
        .collect();
    let up = samples.iter().filter(|s| s.up).count();
    let last = samples.last().copied();
    let title = match (last, subject) {
        (Some(l), Subject::Host) => format!(
            "ready proxies now {}/{}; host Ready in {up} of {} samples",
            l.ready,
            l.total,
            samples.len()
        ),
        (Some(l), Subject::Pool) => format!(
            "available members now {}/{}; all available in {up} of {} samples",
            l.ready,
            l.total,
            samples.len()
        ),
        (None, _) => "no samples yet".to_owned(),
    };
    html! {
        svg.spark width=(SPARK_W) height=(SPARK_H) viewBox=(format!("0 0 {SPARK_W} {SPARK_H}"))
            role="img" aria-label=(title) {
            title { (title) }
            @for (class, x, w) in &cells {
                rect class=(class) x=(x) y=(SPARK_H - 4) width=(w) height="4" {}
            }
            @if samples.len() > 1 {
                polyline points=(points.trim_end()) {}
            } @else if let Some(l) = last {
                circle cx=(x(0)) cy=(y(l.ready)) r="2" {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn sample(up: bool, ready: u32, total: u32) -> Sample {
        Sample {
            at_unix: 0,
            up,
            ready,
            total,
        }
    }

    fn numbers(svg: &str, attr: &str) -> Vec<u32> {
        svg.split(&format!(" {attr}=\""))
            .skip(1)
            .map(|r| r.split('"').next().unwrap().parse().unwrap())
            .collect()
    }

    #[test]
    fn the_strip_fills_the_width_and_the_line_stays_in_the_box() {
        for n in [1usize, 2, 7, 61] {
            let samples: Vec<Sample> = (0..n)
                .map(|i| sample(i % 2 == 0, u32::try_from(i).unwrap(), 100))
                .collect();
            let svg = sparkline(&samples, Subject::Host).into_string();
            let xs = numbers(&svg, "x");
            let ws = numbers(&svg, "width");
            // The first width is the svg's own.
            assert_eq!(ws[0], SPARK_W);
            let ws = &ws[1..];
            assert_eq!(xs.len(), n, "{svg}");
            assert_eq!(xs[0], 0);
            assert_eq!(xs[n - 1] + ws[n - 1], SPARK_W, "n={n}: {svg}");
            for i in 1..n {
                assert_eq!(xs[i], xs[i - 1] + ws[i - 1], "n={n}: cells touch");
            }
            if n > 1 {
                let pts = svg
                    .split("points=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap();
                for p in pts.split(' ') {
                    let (x, y) = p.split_once(',').unwrap();
                    let (x, y): (u32, u32) = (x.parse().unwrap(), y.parse().unwrap());
                    assert!(x <= SPARK_W && y < SPARK_H - 4, "{p} out of the box");
                }
            }
        }
    }

    #[test]
    fn counts_above_the_total_are_drawn_at_the_top_not_outside() {
        let svg = sparkline(&[sample(true, 5, 0), sample(true, 0, 0)], Subject::Pool).into_string();
        let pts = svg
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert_eq!(pts, "1,1 119,17");
    }
}
