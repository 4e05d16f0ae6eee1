//! Resolving a Proxy's `image` (a catalogue key, or a URL when URL images are enabled) to
//! a source to fetch, with every check that needs no network (findings M12, M17, L7, L8, L24).
//!
//! Guarantees: a URL image is refused unless `urlImages.enabled`, its host and port are on
//! `urlImages.allowedHosts` ([`host_allowed`]: `host` admits the scheme's default port only,
//! `host:port` that port; its address is checked by the fetcher, before any traffic), and it
//! is https unless a digest is pinned; URLs with credentials (`user:pass@`) are refused, catalogue ones too;
//! a plain-http source always needs a pinned sha256; every message is redacted and names the
//! setting to change. URL images pin a digest with a fragment, `URL#sha256=<64 hex>`; the
//! fragment is never sent. Unpinned sources are identified by their URL (`url-<sha256(url)>`
//! names), so editing a catalogue URL without a pin fetches anew (H4 scenario 1); pinned
//! catalogue entries are identified by key and digest (`img-<key>` names). A catalogue
//! entry's `caFile` travels with its source (the fetcher trusts it besides the system's
//! roots); URL images never carry one, so a private CA widens trust for the operator's own
//! catalogue only.

use std::path::PathBuf;

use reqwest::Url;

use crate::error::{ProviderError, Result, redact};
use crate::libvirt::config::{Firmware, ImageFormat, LibvirtEntry};
use crate::libvirt::names::ImageSource;

/// Where an image comes from, after every offline check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// What to GET (no fragment, no credentials).
    pub url: Url,
    /// The sha256 the bytes must have (64 lowercase hex), when pinned.
    pub pinned: Option<String>,
    /// The declared format, verified against the bytes; `None` for URL images (detected).
    pub declared: Option<ImageFormat>,
    /// Firmware the image boots with (URL images: BIOS).
    pub firmware: Firmware,
    /// The catalogue key, for catalogue images.
    pub key: Option<String>,
    /// Whether this came from a Proxy's URL (untrusted: address policy applies).
    pub untrusted: bool,
    /// The redacted URL for messages and the marker.
    pub display: String,
    /// Extra CA certificates (PEM file) trusted for this source's https downloads: the
    /// catalogue entry's `caFile`; always `None` for URL images, which trust the system's
    /// roots only.
    pub ca_file: Option<PathBuf>,
}

impl Source {
    /// The identity used in volume names: pinned catalogue entries by key, everything else by
    /// URL (finding L8: distinct `img-`/`url-` prefixes, full-strength digests).
    pub fn name_source(&self) -> ImageSource<'_> {
        match (&self.key, &self.pinned) {
            (Some(k), Some(_)) => ImageSource::Catalogue(k),
            _ => ImageSource::Url(self.url.as_str()),
        }
    }

    /// The setting that holds this source's extra CA file, for messages.
    pub fn ca_setting(&self) -> String {
        match &self.key {
            Some(k) => format!("images.{k}.caFile"),
            None => "images.<key>.caFile (catalogue images only)".into(),
        }
    }

    /// The setting that holds this source's URL, for messages.
    pub fn setting(&self) -> String {
        match &self.key {
            Some(k) => format!("images.{k}.url"),
            None => "the Proxy's spec.image".into(),
        }
    }
}

/// Whether `image` is written as a URL rather than a catalogue key.
pub fn is_url(image: &str) -> bool {
    let l = image.trim_start().to_ascii_lowercase();
    l.starts_with("http://") || l.starts_with("https://") || l.contains("://")
}

/// Resolves `image` in `entry`.
pub fn resolve(entry: &LibvirtEntry, image: &str) -> Result<Source> {
    if is_url(image) {
        resolve_url_image(entry, image)
    } else {
        resolve_catalogue(entry, image)
    }
}

fn resolve_catalogue(entry: &LibvirtEntry, key: &str) -> Result<Source> {
    let Some(spec) = entry.images.get(key) else {
        let known: Vec<&str> = entry.images.keys().map(String::as_str).collect();
        return Err(ProviderError::permanent(format!(
            "image {key:?} is not in the catalogue of provider entry {:?} (known keys: {}); \
             add images.{key} or use a known key",
            entry.name,
            if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            }
        )));
    };
    let setting = format!("images.{key}.url");
    let mut url = parse_url(&spec.url, &setting)?;
    url.set_fragment(None);
    let pinned = match &spec.sha256 {
        Some(d) => Some(check_digest(d, &format!("images.{key}.sha256"))?),
        None => None,
    };
    require_https_or_pin(
        &url,
        pinned.is_some(),
        &format!("images.{key}.sha256"),
        &setting,
    )?;
    Ok(Source {
        display: redact(url.as_str()),
        url,
        pinned,
        declared: Some(spec.format),
        firmware: spec.firmware,
        key: Some(key.into()),
        untrusted: false,
        ca_file: spec.ca_file.clone(),
    })
}

fn resolve_url_image(entry: &LibvirtEntry, image: &str) -> Result<Source> {
    let shown = redact(image);
    if !entry.url_images.enabled {
        return Err(ProviderError::permanent(format!(
            "image {shown} is a URL, but URL images are disabled for provider entry {:?}; \
             use a catalogue key, or set urlImages.enabled and urlImages.allowedHosts",
            entry.name
        )));
    }
    let setting = "the Proxy's spec.image";
    let mut url = parse_url(image, setting)?;
    let pinned = match url.fragment() {
        None => None,
        Some(f) => match f.strip_prefix("sha256=") {
            Some(d) => Some(check_digest(d, "the #sha256= fragment of spec.image")?),
            None => {
                return Err(ProviderError::permanent(format!(
                    "image {shown}: the only fragment accepted is #sha256=<64 hex digits>"
                )));
            }
        },
    };
    url.set_fragment(None);
    if !host_allowed(&entry.url_images.allowed_hosts, &url) {
        return Err(ProviderError::permanent(format!(
            "image {shown}: {} is not in urlImages.allowedHosts of provider entry {:?} (an \
             entry without a port admits only the scheme's default port); add it there or use \
             a catalogue key",
            host_port(&url),
            entry.name
        )));
    }
    require_https_or_pin(
        &url,
        pinned.is_some(),
        "a #sha256= fragment on spec.image",
        setting,
    )?;
    Ok(Source {
        display: redact(url.as_str()),
        url,
        pinned,
        declared: None,
        firmware: Firmware::Bios,
        key: None,
        untrusted: true,
        ca_file: None,
    })
}

/// Whether `url`'s host and port are on the allowlist `allowed`. An entry is `host` (a DNS
/// name or an IPv4 literal; `[v6]` for an IPv6 literal), which admits only the URL scheme's
/// default port (443 for https, 80 for http), or `host:port`, which admits that port only.
/// Host names compare case-insensitively.
pub fn host_allowed(allowed: &[String], url: &Url) -> bool {
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    // NB: `Url` drops a port equal to the scheme's default, so `port()` is `None` exactly
    // when the default port is used.
    let port = url.port();
    allowed.iter().any(|entry| match split_host_port(entry) {
        Some((h, p)) => h == host && p == port,
        None => false,
    })
}

/// An allowlist entry as (lower-cased host without brackets, port if given); `None` when it
/// is malformed (such an entry admits nothing; configuration validation refuses it).
pub fn split_host_port(entry: &str) -> Option<(String, Option<u16>)> {
    let e = entry.trim().to_ascii_lowercase();
    let (host, port) = if let Some(rest) = e.strip_prefix('[') {
        let (h, tail) = rest.split_once(']')?;
        match tail {
            "" => (h.to_owned(), None),
            t => (h.to_owned(), Some(t.strip_prefix(':')?)),
        }
    } else {
        match e.split_once(':') {
            None => (e.clone(), None),
            Some((h, p)) => (h.to_owned(), Some(p)),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        None => None,
        Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p != 0)?),
    };
    Some((host, port))
}

/// `host` or `host:port` of `url`, as shown in errors.
fn host_port(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host,
    }
}

fn parse_url(raw: &str, setting: &str) -> Result<Url> {
    let shown = redact(raw);
    let url = Url::parse(raw.trim()).map_err(|e| {
        ProviderError::permanent(format!("{setting} = {shown} is not a valid URL: {e}"))
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ProviderError::permanent(format!(
            "{setting} = {shown}: only http and https URLs are supported"
        )));
    }
    // finding L24: credentials in an image URL end up in logs and errors; refuse them.
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ProviderError::permanent(format!(
            "{setting} = {shown} carries credentials (user:password@); remove them (serve the \
             image without credentials or from a catalogue entry)"
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ProviderError::permanent(format!(
            "{setting} = {shown} has no host"
        )));
    }
    Ok(url)
}

fn check_digest(d: &str, setting: &str) -> Result<String> {
    let ok = d.len() == 64 && d.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if ok {
        Ok(d.to_owned())
    } else {
        Err(ProviderError::permanent(format!(
            "{setting} = {d:?} is not a sha256 digest: expected 64 lowercase hex digits"
        )))
    }
}

fn require_https_or_pin(url: &Url, pinned: bool, pin_setting: &str, setting: &str) -> Result<()> {
    if url.scheme() == "http" && !pinned {
        return Err(ProviderError::permanent(format!(
            "{setting} = {} is plain http without a pinned digest; use https or set {pin_setting}",
            redact(url.as_str())
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_allowlist_admits_a_host_on_its_default_port_or_the_port_it_names() {
        let allowed: Vec<String> = [
            "images.example",
            "mirror.example:8443",
            "192.0.2.10:8080",
            "[2001:db8::1]",
            "[2001:db8::2]:9000",
            "bad:0",
        ]
        .map(String::from)
        .to_vec();
        let ok = |u: &str| host_allowed(&allowed, &Url::parse(u).unwrap());
        assert!(ok("https://images.example/a"));
        assert!(ok("https://IMAGES.example:443/a"), "default port, any case");
        assert!(ok("http://images.example/a"), "http's default port");
        assert!(
            !ok("https://images.example:8443/a"),
            "no port: default only"
        );
        assert!(
            !ok("http://images.example:443/a"),
            "443 is not http's default"
        );
        assert!(ok("https://mirror.example:8443/a"));
        assert!(!ok("https://mirror.example/a"), "only the port named");
        assert!(ok("http://192.0.2.10:8080/a"));
        assert!(!ok("http://192.0.2.10/a"));
        assert!(ok("https://[2001:db8::1]/a"));
        assert!(!ok("https://[2001:db8::1]:444/a"));
        assert!(ok("https://[2001:db8::2]:9000/a"));
        assert!(!ok("https://bad/a"), "a malformed entry admits nothing");
        assert!(!ok("https://other.example/a"));
        assert_eq!(split_host_port("x:65536"), None);
        assert_eq!(split_host_port("[::1]x"), None);
        assert_eq!(
            split_host_port(" X.org:80 "),
            Some(("x.org".into(), Some(80)))
        );
    }
}
