//! `egress-proxies crds [--dir DIR]`: the Proxy and ProviderHealth CustomResourceDefinitions as
//! YAML, generated from the core's types ([`egress_kube::api::crds_yaml`]).
//!
//! Guarantees: contacts nothing; prints exactly what is committed under `deploy/crds/` (a test
//! in `tests/deploy.rs` compares them); an unwritable `--dir` is a usage error (exit 2).

use std::path::PathBuf;

use super::{EXIT_OK, UsageError};

/// Arguments of `crds`.
#[derive(Debug, clap::Args)]
pub struct CrdsArgs {
    /// Write one file per CRD into this directory instead of printing.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Prints the CRDs, or writes one file per CRD into `--dir`.
pub fn run(a: CrdsArgs) -> anyhow::Result<u8> {
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
