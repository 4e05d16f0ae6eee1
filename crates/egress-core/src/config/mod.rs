//! The provider configuration file: loading, parsing and validation.
//!
//! The file is a YAML document with the key `providers:`, a list of entries, each with a
//! `name`, a `type` (only `libvirt` today) and the fields of
//! [`egress_provider::libvirt::config::LibvirtEntry`], and an optional `installation: { id }`
//! naming this installation in every ownership mark (see [`installation`] for the default
//! when it is absent), and an optional `reputation:` section, the DNS blocklist checks of the
//! egress addresses (checked by [`egress_reputation::config::validate`], its errors under
//! `reputation.`). See `examples/providers.yaml` for a commented example.
//!
//! Guarantees:
//! - **All errors at once.** A file that parses is validated completely; every violation is
//!   reported, each naming its field path (`providers[0].hosts[1].address`) and the bad value.
//!   A shape error (unknown field, wrong type, missing field) is reported with its field path
//!   alongside every other shape error and every rule violation of the rest of the file
//!   (see [`lenient`]); only a YAML syntax error is reported alone, with the line and column
//!   serde-saphyr gives.
//! - **Redacted.** Every message passes through [`egress_provider::error::redact`], so a URL
//!   carrying credentials never reaches a log or a terminal (finding L24).
//! - **No side effects.** [`load`] reads the one file and nothing else: no host is dialed, no
//!   key file or known_hosts file is opened, no DNS lookup is made. A broken config therefore
//!   never touches a host; [`parse`] does no I/O at all.
//! - A value returned in `Ok` satisfies every rule in [`validate()`]'s documentation, so the
//!   provider may rely on them (e.g. size arithmetic cannot overflow, finding L20).

mod entry;
pub mod installation;
pub mod lenient;
mod validate;

use std::fmt;
use std::path::Path;

use egress_provider::error::redact;
use egress_provider::libvirt::config::LibvirtEntry;
use serde::Deserialize;

pub use validate::{
    MAX_BRIDGE_LEN, MAX_DISK_GIB, MAX_HOST_CONCURRENCY, MAX_IDENT_LEN, MAX_LIBVIRT_NAME_LEN,
    MAX_MEMORY_MIB, MAX_SOCKET_LEN, MAX_TIMEOUT_SECS, MAX_USER_LEN, MAX_VCPUS, MIN_MEMORY_MIB,
    validate,
};

/// Largest configuration file read.
// NB: a config with hundreds of hosts and a long catalogue is tens of KiB; 4 MiB bounds a
// wrong path pointing at an image or a log.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// A loaded, validated provider configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
    /// The provider entries, in file order; names are unique.
    pub providers: Vec<ProviderEntry>,
    /// Warnings: the file is usable, but something is probably unintended.
    pub warnings: Vec<ConfigWarning>,
    /// `installation.id`: this installation's ID, written in every ownership mark; valid per
    /// [`egress_provider::libvirt::mark::valid_installation_id`]. `None` when the file sets
    /// none: the driver then fills in its default ([`installation`]) before building
    /// providers.
    pub installation: Option<String>,
    /// `reputation:`: the DNS blocklist checks of the egress addresses (no zones: none).
    pub reputation: egress_reputation::Settings,
}

impl ProviderConfig {
    /// The entry named `name`, if any.
    pub fn entry(&self, name: &str) -> Option<&ProviderEntry> {
        self.providers.iter().find(|p| p.name() == name)
    }
}

/// One provider entry, by type (the `type:` field of the file).
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderEntry {
    /// `type: libvirt`.
    Libvirt(LibvirtEntry),
}

impl ProviderEntry {
    /// The entry's name.
    pub fn name(&self) -> &str {
        match self {
            Self::Libvirt(e) => &e.name,
        }
    }
}

/// The file as deserialized, before validation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    providers: Vec<ProviderEntry>,
    #[serde(default)]
    installation: Option<RawInstallation>,
    #[serde(default)]
    reputation: Option<egress_reputation::RawReputation>,
}

/// `installation:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInstallation {
    id: String,
}

/// The rule errors of `installation:` (the ID's syntax).
fn validate_installation(raw: Option<&RawInstallation>) -> Vec<ConfigError> {
    match raw {
        Some(i) if !egress_provider::libvirt::mark::valid_installation_id(&i.id) => {
            vec![ConfigError::new(
                "installation.id",
                format!(
                    "{:?} is not a valid installation ID: 1 to {} lowercase letters, digits, \
                     '-' or '.', starting and ending with a letter or digit",
                    i.id.chars().take(80).collect::<String>(),
                    egress_provider::libvirt::mark::MAX_INSTALLATION_ID_LEN
                ),
            )]
        }
        _ => Vec::new(),
    }
}

/// The rule errors and warnings of `reputation:` (paths under `reputation.`), and the
/// settings (the defaults, no zones, when it is absent or has errors).
fn validate_reputation(
    raw: Option<&egress_reputation::RawReputation>,
) -> (
    egress_reputation::Settings,
    Vec<ConfigError>,
    Vec<ConfigWarning>,
) {
    let Some(raw) = raw else {
        return (
            egress_reputation::Settings::default(),
            Vec::new(),
            Vec::new(),
        );
    };
    let at = |p: &str| format!("reputation.{p}");
    let (out, warnings) = egress_reputation::config::validate(raw);
    let warnings = warnings
        .into_iter()
        .map(|w| ConfigWarning::new(at(&w.path), w.message))
        .collect();
    match out {
        Ok(s) => (s, Vec::new(), warnings),
        Err(es) => (
            egress_reputation::Settings::default(),
            es.into_iter()
                .map(|e| ConfigError::new(at(&e.path), e.message))
                .collect(),
            warnings,
        ),
    }
}

/// One violation: the field path and a redacted message naming the bad value and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Field path, e.g. `providers[0].hosts[1].address`; empty for a whole-document error.
    pub path: String,
    /// What is wrong and what is expected (redacted).
    pub message: String,
}

impl ConfigError {
    /// An error at `path`; the message is redacted here.
    pub fn new(path: impl Into<String>, message: impl AsRef<str>) -> Self {
        Self {
            path: path.into(),
            message: redact(message.as_ref()),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Something legal but probably unintended, at a field path (message redacted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    /// Field path.
    pub path: String,
    /// What looks wrong (redacted).
    pub message: String,
}

impl ConfigWarning {
    /// A warning at `path`; the message is redacted here.
    pub fn new(path: impl Into<String>, message: impl AsRef<str>) -> Self {
        Self {
            path: path.into(),
            message: redact(message.as_ref()),
        }
    }
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every error (and warning) of a rejected configuration. `Display` prints a header line
/// naming the origin, then one line per error and one per warning.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors {
    /// Where the text came from (a path, or a caller's label), for the header line.
    pub origin: String,
    /// The violations, in file order; never empty.
    pub errors: Vec<ConfigError>,
    /// Warnings found alongside.
    pub warnings: Vec<ConfigWarning>,
}

impl ConfigErrors {
    fn single(origin: &str, error: ConfigError) -> Self {
        Self {
            origin: origin.to_owned(),
            errors: vec![error],
            warnings: Vec::new(),
        }
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.errors.len();
        write!(
            f,
            "provider config {}: {n} error{}",
            self.origin,
            if n == 1 { "" } else { "s" }
        )?;
        for e in &self.errors {
            write!(f, "\n  error: {e}")?;
        }
        for w in &self.warnings {
            write!(f, "\n  warning: {w}")?;
        }
        Ok(())
    }
}

/// Every error of a file whose typed parse failed with `first`: its shape errors with their
/// paths, then the rule violations of what remains (see [`lenient`]).
fn shape_errors(text: &str, origin: &str, first: &str) -> ConfigErrors {
    let whole = |m: &str| {
        ConfigErrors::single(
            origin,
            // serde-saphyr labels the text `<input>`: name the file instead.
            ConfigError::new(
                "",
                format!(
                    "not a valid provider config: {}",
                    m.replace("<input>", origin)
                ),
            ),
        )
    };
    let collected = match lenient::parse_collecting::<RawFile>(text) {
        Ok(c) if !c.errors.is_empty() => c,
        // A syntax error, or (never expected) a tree that reads where the text did not.
        Ok(_) => return whole(first),
        Err(syntax) => return whole(&syntax),
    };
    // The typed parse stopped at the first of these errors (both walk the file in order):
    // it keeps the line and column serde-saphyr gave.
    let at = lenient::location(first);
    let mut errors: Vec<ConfigError> = collected
        .errors
        .iter()
        .enumerate()
        .map(|(i, e)| match (i, &at) {
            (0, Some(at)) => ConfigError::new(e.path.clone(), format!("{} ({at})", e.message)),
            _ => ConfigError::new(e.path.clone(), &e.message),
        })
        .collect();
    let mut warnings = Vec::new();
    if let Some(raw) = &collected.value {
        let (mut rule_errors, mut w) = validate(&raw.providers);
        rule_errors.extend(validate_installation(raw.installation.as_ref()));
        let (_, rep_errors, rep_warnings) = validate_reputation(raw.reputation.as_ref());
        rule_errors.extend(rep_errors);
        w.extend(rep_warnings);
        errors.extend(
            rule_errors
                .into_iter()
                .filter(|e| !collected.covers(&e.path)),
        );
        warnings = w;
    }
    ConfigErrors {
        origin: origin.to_owned(),
        errors,
        warnings,
    }
}

/// Reads the file at `path` (and nothing else) and [`parse`]s it with the path as origin.
/// Fails with a single error when the file cannot be read, is larger than
/// [`MAX_CONFIG_BYTES`] or is not UTF-8.
pub fn load(path: &Path) -> Result<ProviderConfig, ConfigErrors> {
    let origin = path.display().to_string();
    let read_err = |e: std::io::Error| {
        ConfigErrors::single(&origin, ConfigError::new("", format!("cannot read: {e}")))
    };
    let len = std::fs::metadata(path).map_err(read_err)?.len();
    if len > MAX_CONFIG_BYTES {
        return Err(ConfigErrors::single(
            &origin,
            ConfigError::new(
                "",
                format!("the file is {len} bytes; a provider config is at most {MAX_CONFIG_BYTES}"),
            ),
        ));
    }
    let text = std::fs::read_to_string(path).map_err(read_err)?;
    parse(&text, &origin)
}

/// Parses and validates `text`; `origin` labels it in messages. Does no I/O.
///
/// A YAML syntax error is returned alone with serde-saphyr's line and column. Otherwise every
/// shape error (unknown field, wrong type, missing field, unknown `type:`) with its field
/// path and every rule violation are returned together (rule errors at a field that has a
/// shape error are not repeated). Warnings ride along in `Ok` and in `Err`.
pub fn parse(text: &str, origin: &str) -> Result<ProviderConfig, ConfigErrors> {
    let raw: RawFile = match serde_saphyr::from_str(text) {
        Ok(raw) => raw,
        Err(first) => return Err(shape_errors(text, origin, &first.to_string())),
    };
    let (mut errors, mut warnings) = validate(&raw.providers);
    errors.extend(validate_installation(raw.installation.as_ref()));
    let (reputation, rep_errors, rep_warnings) = validate_reputation(raw.reputation.as_ref());
    errors.extend(rep_errors);
    warnings.extend(rep_warnings);
    if errors.is_empty() {
        Ok(ProviderConfig {
            providers: raw.providers,
            warnings,
            installation: raw.installation.map(|i| i.id),
            reputation,
        })
    } else {
        Err(ConfigErrors {
            origin: origin.to_owned(),
            errors,
            warnings,
        })
    }
}
