//! `egress-proxies crds [--dir DIR]`: the Proxy, ProxyPool and ProviderHealth
//! CustomResourceDefinitions, generated from the core's types ([`egress_kube::api::crds`]).
//!
//! Guarantees: contacts nothing; the text form is exactly what is committed under
//! `deploy/crds/` (a test in `tests/deploy.rs` compares them), one YAML document per CRD;
//! `-o json|yaml` prints the same CRDs as one `List` document (as `kubectl get -o json` does),
//! which `kubectl apply -f` takes too; `--dir` writes files and takes no `-o json|yaml|wide`
//! (refused, exit 2, before anything is written); an unwritable `--dir` is a usage error
//! (exit 2).

use std::path::PathBuf;

use super::output::{self, Accepts, NO_TABLE, TEXT_ONLY};
use super::{EXIT_OK, UsageError};

/// Arguments of `crds`.
#[derive(Debug, clap::Args)]
pub struct CrdsArgs {
    /// Write one YAML file per CRD into this directory instead of printing.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

impl CrdsArgs {
    /// The `-o` formats: text, json and yaml when printing; text only with `--dir`.
    pub(super) fn accepts(&self) -> Accepts {
        if self.dir.is_some() {
            Accepts {
                command: "crds --dir",
                formats: TEXT_ONLY,
                prints: "writes YAML files (what deploy/crds/ holds); to print the CRDs as \
                         one document, drop --dir",
            }
        } else {
            Accepts {
                command: "crds",
                formats: NO_TABLE,
                prints: "prints YAML documents, no table",
            }
        }
    }
}

/// Prints the CRDs (as YAML documents, or one `List` under `-o json|yaml`), or writes one
/// file per CRD into `--dir`.
pub fn run(a: CrdsArgs) -> anyhow::Result<u8> {
    let fmt = output::format(false);
    if a.dir.is_none() && !fmt.is_human() {
        let list = serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": egress_kube::api::crds(),
        });
        if let Some(doc) = output::document_as_is(&list, fmt)? {
            println!("{doc}");
        }
        return Ok(EXIT_OK);
    }
    let docs = egress_kube::api::crds_yaml()?;
    match a.dir {
        None => {
            for (_, yaml) in docs {
                print!("---\n{yaml}");
            }
        }
        Some(dir) => {
            for (name, yaml) in docs {
                let path = dir.join(name);
                std::fs::write(&path, yaml).map_err(|e| {
                    UsageError::new(format!("cannot write {}: {e}", path.display()))
                })?;
                println!("wrote {}", path.display());
            }
        }
    }
    Ok(EXIT_OK)
}
