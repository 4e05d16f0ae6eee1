//! The fleet page's sparklines: inline SVG, one per host, of the last hour's samples.
//!
//! Guarantees: the drawing is a pure function of the samples; it uses only presentation
//! attributes and classes (no `style=`, so the page's strict CSP holds), and stays inside its
//! [`SPARK_W`] × [`SPARK_H`] box whatever the counts.

use std::fmt::Write as _;

use maud::{Markup, html};

use super::history::Sample;

/// Sparkline width (SVG user units = CSS pixels).
pub const SPARK_W: u32 = 120;
/// Sparkline height.
pub const SPARK_H: u32 = 24;

/// A sparkline of ready proxies (line) over host up/down (a strip of cells), oldest first.
pub fn sparkline(samples: &[Sample]) -> Markup {
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
    let cell = (SPARK_W / n).max(1);
    let up = samples.iter().filter(|s| s.up).count();
    let last = samples.last().copied();
    let title = match last {
        Some(l) => format!(
            "ready proxies now {}/{}; host Ready in {up} of {} samples",
            l.ready,
            l.total,
            samples.len()
        ),
        None => "no samples yet".to_owned(),
    };
    html! {
        svg.spark width=(SPARK_W) height=(SPARK_H) viewBox=(format!("0 0 {SPARK_W} {SPARK_H}"))
            role="img" aria-label=(title) {
            title { (title) }
            @for (i, s) in samples.iter().enumerate() {
                rect class=(if s.up { "up" } else { "down" })
                    x=(u32::try_from(i).unwrap_or(0).saturating_mul(cell)) y=(SPARK_H - 4)
                    width=(cell) height="4" {}
            }
            @if samples.len() > 1 {
                polyline points=(points.trim_end()) {}
            } @else if let Some(l) = last {
                circle cx=(x(0)) cy=(y(l.ready)) r="2" {}
            }
        }
    }
}
