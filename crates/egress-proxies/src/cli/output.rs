//! How a command prints its result: `-o text|json|yaml|wide` (global), with each command's
//! `--json` kept as an alias of `-o json`.
//!
//! Guarantees:
//! - Under `json` and `yaml`, stdout holds exactly one document, with the config's casing
//!   (camelCase keys, whatever the Rust field names), and nothing else; a failure is printed
//!   as a document too (`{"error": ..., "exitCode": ...}`), so a script always parses stdout.
//! - `text` is the human table; `wide` is that table with more columns (`status`, `check`).
//! - A command that cannot print a format refuses it before doing anything ([`refuse`]: exit
//!   2, naming the format, the command and the formats it takes): no `-o` is ever ignored.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;
use serde_json::Value;

/// An output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// Human tables and lines.
    #[default]
    Text,
    /// One JSON document.
    Json,
    /// One YAML document.
    Yaml,
    /// Human tables with more columns (only commands that print a table take it).
    Wide,
}

impl std::fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
            Self::Yaml => "yaml",
            Self::Wide => "wide",
        })
    }
}

/// Every format: what a command with a table takes.
pub const ALL: &[OutputFormat] = &[
    OutputFormat::Text,
    OutputFormat::Wide,
    OutputFormat::Json,
    OutputFormat::Yaml,
];
/// The formats of a command that prints a result but no table.
pub const NO_TABLE: &[OutputFormat] = &[OutputFormat::Text, OutputFormat::Json, OutputFormat::Yaml];
/// The formats of a command whose output is a file of its own kind (a script, a page).
pub const TEXT_ONLY: &[OutputFormat] = &[OutputFormat::Text];

/// The formats a command takes, and what it prints (for the refusal's message).
#[derive(Debug, Clone, Copy)]
pub struct Accepts {
    /// The command as the user typed it (`check --no-probe`).
    pub command: &'static str,
    /// The formats it can print.
    pub formats: &'static [OutputFormat],
    /// What it prints, as in "`crds --dir` writes YAML files".
    pub prints: &'static str,
}

/// A usage error when `f` is not one of the formats `a` takes: `-o wide: \`version\` prints
/// one line per fact, no table; it takes -o text, json or yaml`.
pub fn refuse(f: OutputFormat, a: Accepts) -> Result<(), super::UsageError> {
    if a.formats.contains(&f) {
        return Ok(());
    }
    let takes = match a.formats {
        [OutputFormat::Text] => "drop -o".to_owned(),
        many => {
            let names: Vec<String> = many.iter().map(ToString::to_string).collect();
            match names.split_last() {
                Some((last, rest)) if !rest.is_empty() => {
                    format!("it takes -o {} or {last}", rest.join(", "))
                }
                Some((last, _)) => format!("it takes -o {last}"),
                None => "drop -o".to_owned(),
            }
        }
    };
    Err(super::UsageError::new(format!(
        "-o {f}: `egress-proxies {}` {}; {takes}",
        a.command, a.prints
    )))
}

impl OutputFormat {
    /// Whether the result is a table for people (text or wide).
    pub fn is_human(self) -> bool {
        matches!(self, Self::Text | Self::Wide)
    }
}

static GLOBAL: OnceLock<OutputFormat> = OnceLock::new();

/// Records the global `-o` (once, at start).
pub(crate) fn set_global(f: OutputFormat) {
    let _ = GLOBAL.set(f);
}

/// Whether a command's `--json` alias was given (so failures print as JSON too).
static JSON_ALIAS: AtomicBool = AtomicBool::new(false);

/// The format in effect: `json` when the command's `--json` alias was given, else `-o`.
/// Commands call it first thing, so a failure after it prints in the same format.
pub(crate) fn format(json_alias: bool) -> OutputFormat {
    if json_alias {
        JSON_ALIAS.store(true, Ordering::SeqCst);
    }
    if JSON_ALIAS.load(Ordering::SeqCst) {
        OutputFormat::Json
    } else {
        GLOBAL.get().copied().unwrap_or_default()
    }
}

/// `value` as the document `f` asks for (camelCase keys), or `None` for the human formats.
pub(crate) fn document<T: Serialize>(value: &T, f: OutputFormat) -> anyhow::Result<Option<String>> {
    let v = camel_keys(serde_json::to_value(value)?);
    Ok(match f {
        OutputFormat::Json => Some(serde_json::to_string_pretty(&v)?),
        OutputFormat::Yaml => Some(serde_saphyr::to_string(&v)?),
        OutputFormat::Text | OutputFormat::Wide => None,
    })
}

/// `value` as the document `f` asks for with its keys as they are (objects whose schema is
/// not ours, such as Kubernetes objects), or `None` for the human formats.
pub(crate) fn document_as_is<T: Serialize>(
    value: &T,
    f: OutputFormat,
) -> anyhow::Result<Option<String>> {
    Ok(match f {
        OutputFormat::Json => Some(serde_json::to_string_pretty(value)?),
        OutputFormat::Yaml => Some(serde_saphyr::to_string(value)?),
        OutputFormat::Text | OutputFormat::Wide => None,
    })
}

/// The failure document printed under `json`/`yaml` (`None` for the human formats).
pub(crate) fn error_document(message: &str, exit_code: u8) -> Option<String> {
    let f = format(false);
    let v = serde_json::json!({ "error": message, "exitCode": exit_code });
    document(&v, f).ok().flatten()
}

/// Prints a failure a command reports itself (with an exit code, not through `run`'s error
/// path): an error document on stdout under `json`/`yaml`, else `error: MESSAGE` on stderr.
pub(crate) fn print_error(message: &str, exit_code: u8) {
    match error_document(message, exit_code) {
        Some(doc) => println!("{doc}"),
        None => eprintln!("error: {message}"),
    }
}

/// Every object key in camelCase (`pool_free_bytes` → `poolFreeBytes`); keys without `_`
/// are kept as they are (so `poolReserveGiB` stays).
fn camel_keys(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| (camel(&k), camel_keys(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(camel_keys).collect()),
        other => other,
    }
}

fn camel(k: &str) -> String {
    let mut out = String::with_capacity(k.len());
    let mut up = false;
    for c in k.chars() {
        if c == '_' {
            up = !out.is_empty();
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_format_the_command_and_what_it_takes() {
        let a = Accepts {
            command: "version",
            formats: NO_TABLE,
            prints: "prints no table",
        };
        assert!(refuse(OutputFormat::Json, a).is_ok());
        assert_eq!(
            refuse(OutputFormat::Wide, a).map_err(|e| e.0),
            Err(
                "-o wide: `egress-proxies version` prints no table; it takes -o text, json or yaml"
                    .to_owned()
            )
        );
        let man = Accepts {
            command: "man",
            formats: TEXT_ONLY,
            prints: "prints a manual page (roff)",
        };
        assert_eq!(
            refuse(OutputFormat::Yaml, man).map_err(|e| e.0),
            Err("-o yaml: `egress-proxies man` prints a manual page (roff); drop -o".to_owned())
        );
        assert!(refuse(OutputFormat::Text, man).is_ok());
    }

    #[test]
    fn snake_case_keys_become_camel_case_at_every_depth_and_others_stay() {
        let v = serde_json::json!({"pool_free_bytes": 1, "poolReserveGiB": 2,
            "entries": [{"instances_error": null}]});
        assert_eq!(
            camel_keys(v),
            serde_json::json!({"poolFreeBytes": 1, "poolReserveGiB": 2,
                "entries": [{"instancesError": null}]})
        );
    }
}
