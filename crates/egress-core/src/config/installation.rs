//! This installation's ID: the value written into every ownership mark so that two
//! installations sharing a host never collect or adopt each other's instances.
//!
//! Where the ID comes from, first match wins:
//! 1. `installation.id` in the provider config (any driver);
//! 2. standalone: the file [`FILE_NAME`] next to the provider config file, read if it
//!    exists, else created once with a fresh random ID ([`resolve_persisted`],
//!    [`fill_standalone`]);
//! 3. Kubernetes: derived from the cluster's identity (the UID of its `kube-system`
//!    namespace) and the namespace and name of the installation's leader-election Lease
//!    ([`derive_kubernetes`]) — unique per cluster, stable for the installation's life, so
//!    nothing needs persisting. Releases before derived it from the Lease alone
//!    ([`legacy_kubernetes`]), the same in two clusters installed with the same defaults.
//!
//! Which of these applies is an [`Installation`]: every command and driver names its own
//! and hands it to [`crate::providers::open`], so the `gc` command and the standalone
//! operator it cleans up after cannot compute two different IDs from one config.
//!
//! Guarantees: every ID returned satisfies
//! [`egress_provider::libvirt::mark::valid_installation_id`]; the persisted file is read with
//! a size bound and a file that does not hold a valid ID is an error (never silently
//! replaced: replacing it would make every instance of this installation foreign); two
//! processes creating the file at once end with one ID (`create_new`, the loser reads it).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use egress_provider::libvirt::mark::{MAX_INSTALLATION_ID_LEN, valid_installation_id};

/// Name of the file holding a standalone installation's ID in its state directory.
pub const FILE_NAME: &str = "installation-id";

/// Largest ID file read (an ID and a newline fit many times over).
const MAX_FILE_BYTES: u64 = 256;

/// Why the installation ID could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum InstallationError {
    /// The ID file could not be read or created.
    #[error("installation ID file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The ID file exists but does not hold a valid ID.
    #[error(
        "installation ID file {path} does not hold a valid installation ID (1 to {max} \
         lowercase letters, digits, '-' or '.'); fix it or set installation.id in the provider \
         config — it is never replaced automatically, as every instance would become foreign",
        max = MAX_INSTALLATION_ID_LEN
    )]
    Invalid {
        /// The file.
        path: PathBuf,
    },
}

/// The ID for a standalone installation: `configured` when set, else the one in `file`,
/// else a fresh random ID written to `file` (created, never overwritten).
pub fn resolve_persisted(
    configured: Option<&str>,
    file: &Path,
) -> Result<String, InstallationError> {
    if let Some(id) = configured {
        return Ok(id.to_owned());
    }
    let io = |source| InstallationError::Io {
        path: file.to_owned(),
        source,
    };
    match read_id(file) {
        Ok(id) => return Ok(id),
        Err(InstallationError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let id = format!("i-{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(file)
    {
        Ok(mut f) => {
            f.write_all(format!("{id}\n").as_bytes()).map_err(io)?;
            f.sync_all().map_err(io)?;
            Ok(id)
        }
        // Another process created it first: its ID wins.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_id(file),
        Err(e) => Err(io(e)),
    }
}

fn read_id(file: &Path) -> Result<String, InstallationError> {
    let io = |source| InstallationError::Io {
        path: file.to_owned(),
        source,
    };
    let f = std::fs::File::open(file).map_err(io)?;
    let mut text = String::new();
    f.take(MAX_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(io)?;
    let id = text.strip_suffix('\n').unwrap_or(&text);
    if valid_installation_id(id) {
        Ok(id.to_owned())
    } else {
        Err(InstallationError::Invalid {
            path: file.to_owned(),
        })
    }
}

/// The ID of a Kubernetes installation: `configured` when set, else `k8s-` and the first 32
/// hex digits of the SHA-256 of `CLUSTER/namespace/name`, where CLUSTER is the UID of the
/// cluster's `kube-system` namespace (unique per cluster, stable for its life) and
/// `namespace/name` the installation's leader-election Lease — so two clusters installed
/// with the same defaults never share an ID. Without the cluster's UID (`None`: it could not
/// be read) the ID is [`legacy_kubernetes`], the same in every cluster: the driver warns, and
/// hosts shared between clusters then need `installation.id` set.
pub fn derive_kubernetes(
    configured: Option<&str>,
    cluster_uid: Option<&str>,
    namespace: &str,
    release: &str,
) -> String {
    if let Some(id) = configured {
        return id.to_owned();
    }
    let Some(cluster) = cluster_uid else {
        return legacy_kubernetes(namespace, release);
    };
    hashed(&format!("{cluster}/{namespace}/{release}"))
}

/// The ID releases before the cluster-bound one derived: from `namespace/name` of the Lease
/// alone (the same in two clusters installed with the same defaults). VMs created under it
/// are another installation's to a release deriving [`derive_kubernetes`]'s ID: to keep
/// them, set `installation.id` to this value (the driver logs it when it differs).
pub fn legacy_kubernetes(namespace: &str, release: &str) -> String {
    hashed(&format!("{namespace}/{release}"))
}

fn hashed(text: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(text.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("k8s-{hex}")
}

/// The directory a standalone installation keeps [`FILE_NAME`] in: the provider config
/// file's directory, or (running on the embedded default config) the parent of the manifest
/// directory.
pub fn standalone_dir(config_path: Option<&Path>, proxies_dir: &Path) -> PathBuf {
    let dir = config_path.unwrap_or(proxies_dir).parent();
    dir.filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

/// Who a process acts as: where its installation ID comes from when the provider config
/// sets no `installation.id` (which always wins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installation {
    /// A standalone installation (the `standalone` driver and the `gc` command): the ID
    /// kept in [`FILE_NAME`] in [`standalone_dir`] of these two paths, created once.
    Standalone {
        /// The provider config file; `None` when running on the embedded default config.
        config_path: Option<PathBuf>,
        /// The manifest directory (its parent keeps the ID when there is no config file).
        proxies_dir: PathBuf,
    },
    /// A Kubernetes installation: derived from its cluster's identity and its
    /// leader-election Lease ([`derive_kubernetes`]); nothing is written.
    Kubernetes {
        /// The UID of the cluster's `kube-system` namespace (`None`: it could not be read,
        /// and the ID is [`legacy_kubernetes`]).
        cluster_uid: Option<String>,
        /// The Lease's namespace.
        lease_namespace: String,
        /// The Lease's name.
        lease_name: String,
    },
    /// A command that writes no ownership mark (`check`, `images`): the config's own ID when
    /// it sets one, none otherwise; nothing is read or created on disk.
    ConfigOnly,
}

impl Installation {
    /// This installation's ID under `cfg` (`None` only for [`Installation::ConfigOnly`]
    /// with a config that sets none). A standalone ID file is created on first use; a
    /// failure is a config error at `installation.id`.
    pub fn id(
        &self,
        cfg: &crate::config::ProviderConfig,
    ) -> Result<Option<String>, crate::config::ConfigErrors> {
        match self {
            Self::Standalone {
                config_path,
                proxies_dir,
            } => {
                let mut c = crate::config::ProviderConfig {
                    providers: Vec::new(),
                    warnings: Vec::new(),
                    installation: cfg.installation.clone(),
                    reputation: egress_reputation::Settings::default(),
                };
                fill_standalone(&mut c, &standalone_dir(config_path.as_deref(), proxies_dir))?;
                Ok(c.installation)
            }
            Self::Kubernetes {
                cluster_uid,
                lease_namespace,
                lease_name,
            } => Ok(Some(derive_kubernetes(
                cfg.installation.as_deref(),
                cluster_uid.as_deref(),
                lease_namespace,
                lease_name,
            ))),
            Self::ConfigOnly => Ok(cfg.installation.clone()),
        }
    }
}

/// Fills `cfg.installation` for a standalone driver keeping its ID in `dir` (see
/// [`standalone_dir`]): kept when the config sets it, else [`resolve_persisted`] with
/// [`FILE_NAME`] in `dir`. A failure is returned as a config error at `installation.id`.
pub fn fill_standalone(
    cfg: &mut crate::config::ProviderConfig,
    dir: &Path,
) -> Result<(), crate::config::ConfigErrors> {
    let file = dir.join(FILE_NAME);
    let id = resolve_persisted(cfg.installation.as_deref(), &file).map_err(|e| {
        crate::config::ConfigErrors {
            origin: file.display().to_string(),
            errors: vec![crate::config::ConfigError::new(
                "installation.id",
                e.to_string(),
            )],
            warnings: Vec::new(),
        }
    })?;
    cfg.installation = Some(id);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn dir(test: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "ep-installation-{test}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_standalone_id_is_created_once_then_read_back_unchanged() {
        let d = dir("persist");
        let f = d.join(FILE_NAME);
        let first = resolve_persisted(None, &f).unwrap();
        assert!(valid_installation_id(&first), "{first}");
        assert_eq!(resolve_persisted(None, &f).unwrap(), first);
        assert_eq!(resolve_persisted(Some("site-a"), &f).unwrap(), "site-a");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), format!("{first}\n"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn standalone_keeps_its_id_next_to_the_config_or_above_the_manifests() {
        assert_eq!(
            standalone_dir(Some(Path::new("/etc/ep/providers.yaml")), Path::new("/x/p")),
            Path::new("/etc/ep")
        );
        assert_eq!(
            standalone_dir(None, Path::new("/var/lib/ep/proxies")),
            Path::new("/var/lib/ep")
        );
        let d = dir("fill");
        let mut cfg = crate::config::parse(
            include_str!("../../../../examples/providers.yaml"),
            "example",
        )
        .unwrap();
        fill_standalone(&mut cfg, &d).unwrap();
        let id = cfg.installation.clone().unwrap();
        let mut again = cfg.clone();
        again.installation = None;
        fill_standalone(&mut again, &d).unwrap();
        assert_eq!(again.installation, Some(id));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn each_installation_kind_takes_its_id_from_its_own_place_and_the_config_wins() {
        let d = dir("kinds");
        let mut cfg = crate::config::parse(
            include_str!("../../../../examples/providers.yaml"),
            "example",
        )
        .unwrap();
        cfg.installation = None;
        let standalone = Installation::Standalone {
            config_path: Some(d.join("providers.yaml")),
            proxies_dir: PathBuf::from("/elsewhere/proxies"),
        };
        let id = standalone.id(&cfg).unwrap().unwrap();
        assert_eq!(
            std::fs::read_to_string(d.join(FILE_NAME)).unwrap(),
            format!("{id}\n"),
            "kept beside the config file"
        );
        assert_eq!(standalone.id(&cfg).unwrap().unwrap(), id, "read back");
        let kube = Installation::Kubernetes {
            cluster_uid: Some("c1".into()),
            lease_namespace: "egress".into(),
            lease_name: "ep".into(),
        };
        assert_eq!(
            kube.id(&cfg).unwrap(),
            Some(derive_kubernetes(None, Some("c1"), "egress", "ep"))
        );
        assert_eq!(Installation::ConfigOnly.id(&cfg).unwrap(), None);
        cfg.installation = Some("site-a".into());
        for i in [&standalone, &kube, &Installation::ConfigOnly] {
            assert_eq!(i.id(&cfg).unwrap().as_deref(), Some("site-a"), "{i:?}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_corrupt_id_file_is_an_error_never_replaced() {
        let d = dir("corrupt");
        let f = d.join(FILE_NAME);
        std::fs::write(&f, "Not An ID\n").unwrap();
        assert!(matches!(
            resolve_persisted(None, &f),
            Err(InstallationError::Invalid { .. })
        ));
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "Not An ID\n");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_kubernetes_id_is_unique_per_cluster_and_stable_per_namespace_and_release() {
        let c1 = Some("5b2b1d5e-0000-4000-8000-000000000001");
        let c2 = Some("5b2b1d5e-0000-4000-8000-000000000002");
        let a = derive_kubernetes(None, c1, "egress", "ep");
        assert!(valid_installation_id(&a), "{a}");
        assert_eq!(a, derive_kubernetes(None, c1, "egress", "ep"));
        // Two clusters with the same defaults: two IDs.
        assert_ne!(a, derive_kubernetes(None, c2, "egress", "ep"));
        assert_ne!(a, derive_kubernetes(None, c1, "egress2", "ep"));
        assert_ne!(a, derive_kubernetes(None, c1, "egress", "ep2"));
        assert_eq!(
            derive_kubernetes(Some("site-a"), c1, "egress", "ep"),
            "site-a"
        );
        // The legacy ID (no cluster UID) is what earlier releases derived.
        let legacy = derive_kubernetes(None, None, "egress", "ep");
        assert_eq!(legacy, legacy_kubernetes("egress", "ep"));
        assert_eq!(
            legacy,
            "k8s-".to_owned()
                + &{
                    use sha2::Digest;
                    let d = sha2::Sha256::digest(b"egress/ep");
                    d.iter()
                        .take(16)
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                }
        );
        assert_ne!(legacy, a);
    }
}
