//! Which exposition format a scrape gets: OpenMetrics text when its `Accept` header prefers
//! it, else the Prometheus text format (version 0.0.4), the default of every Prometheus
//! client. Both are written by the prometheus-client crate's own encoders.
//!
//! Guarantees: any header (missing, malformed, huge) yields a format; no panic. A media
//! range with `q=0` is refused, as RFC 9110 says; ties go to OpenMetrics only when it is
//! named explicitly.

/// An exposition format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MetricsFormat {
    /// The Prometheus text format, version 0.0.4.
    #[default]
    Prometheus,
    /// OpenMetrics text 1.0.0.
    OpenMetrics,
}

/// `Content-Type` of an OpenMetrics text exposition.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

impl MetricsFormat {
    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Self::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }

    /// The format an `Accept` header asks for: OpenMetrics when
    /// `application/openmetrics-text` has a higher quality than `text/plain` (and than any
    /// wildcard standing for it), else the Prometheus text format.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Self::Prometheus;
        };
        let (mut om, mut text) = (None::<f32>, None::<f32>);
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(Some(1.0), |(_, v)| v.trim().parse::<f32>().ok())
                .filter(|q| q.is_finite())
                .unwrap_or(0.0);
            let slot = match media.as_str() {
                "application/openmetrics-text" => &mut om,
                "text/plain" | "text/*" | "*/*" => &mut text,
                _ => continue,
            };
            *slot = Some(slot.map_or(q, |s| s.max(q)));
        }
        match (om, text) {
            (Some(o), t) if o > 0.0 && o >= t.unwrap_or(0.0) => Self::OpenMetrics,
            _ => Self::Prometheus,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MetricsFormat::{self, OpenMetrics, Prometheus};

    #[test]
    fn the_accept_header_picks_the_format_by_quality() {
        let prometheus_scraper = "application/openmetrics-text;version=1.0.0,\
            application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        for (accept, want) in [
            (None, Prometheus),
            (Some(""), Prometheus),
            (Some("*/*"), Prometheus),
            (Some("text/plain"), Prometheus),
            (Some("text/plain;version=0.0.4"), Prometheus),
            (Some(prometheus_scraper), OpenMetrics),
            (Some("application/openmetrics-text"), OpenMetrics),
            (
                Some("Application/OpenMetrics-Text; version=1.0.0"),
                OpenMetrics,
            ),
            (
                Some("application/openmetrics-text;q=0.2, text/plain;q=0.9"),
                Prometheus,
            ),
            (Some("application/openmetrics-text;q=0"), Prometheus),
            (Some("application/openmetrics-text;q=bogus"), Prometheus),
            (Some(";;;,,=q;"), Prometheus),
        ] {
            assert_eq!(MetricsFormat::negotiate(accept), want, "{accept:?}");
        }
    }
}
