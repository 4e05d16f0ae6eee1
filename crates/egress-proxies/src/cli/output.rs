//! How a command prints its result: `-o text|json|yaml|wide` (global), with each command's
//! `--json` kept as an alias of `-o json`.
//!
//! Guarantees:
//! - Under `json` and `yaml`, stdout holds exactly one document, with the config's casing
//!   (camelCase keys, whatever the Rust field names), and nothing else; a failure is printed
//!   as a document too (`{"error": ..., "exitCode": ...}`), so a script always parses stdout.
//! - `text` is the human table; `wide` is accepted for kubectl habits and prints the same
//!   table (no command has extra columns yet).

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
    /// Human tables (the same as `text` for now).
    Wide,
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
