//! The provider registry: one [`Provider`] per entry of a loaded [`ProviderConfig`], with
//! the entry's configuration beside it so the reconciler can read defaults, limits, hosts and
//! the catalogue.
//!
//! Every command and driver builds its registry with [`open`], naming the
//! [`Installation`] it acts as.
//!
//! Guarantees:
//! - Building the registry does no I/O: no host is dialed, no key file read (connections are
//!   made on first use by the host pool). A config that built once builds the same way again.
//! - Each handle carries a digest of its entry's configuration, so a latched Permanent failure
//!   can be released when the provider config changes.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use egress_provider::error::ProviderError;
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{HostConfig, LibvirtEntry};
use egress_provider::libvirt::hostpool::{
    Connector, HostPool, PoolOptions, SshConnector, UnixConnector, check_private_key_file,
};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::provider::Provider;
use libvirt_remote::transport::Transport;
use sha2::{Digest, Sha256};

use crate::config::installation::Installation;
use crate::config::{ConfigErrors, ProviderConfig, ProviderEntry};

/// The `address` that means "the libvirt socket on this machine, without SSH".
pub const LOCAL_ADDRESS: &str = "local";

/// One provider entry, ready to use.
#[derive(Clone)]
pub struct ProviderHandle {
    /// The entry's configuration, as loaded.
    pub config: Arc<LibvirtEntry>,
    /// The provider serving it.
    pub provider: Arc<dyn Provider>,
    /// Hex sha256 of the entry's configuration; changes whenever the entry changes.
    pub config_digest: String,
}

impl fmt::Debug for ProviderHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderHandle")
            .field("entry", &self.config.name)
            .field("config_digest", &self.config_digest)
            .finish_non_exhaustive()
    }
}

impl ProviderHandle {
    /// A handle for `provider` serving `config` (tests build fake-backed providers this way).
    pub fn new(config: LibvirtEntry, provider: Arc<dyn Provider>) -> Self {
        let config_digest = digest(&config);
        Self {
            config: Arc::new(config),
            provider,
            config_digest,
        }
    }

    /// The host named `name` in this entry.
    pub fn host(&self, name: &str) -> Option<&HostConfig> {
        self.config.hosts.iter().find(|h| h.name == name)
    }
}

/// Why [`open`] built no providers.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The installation ID could not be resolved (an unreadable or invalid ID file), as a
    /// config error at `installation.id`.
    #[error("{0}")]
    Installation(#[source] ConfigErrors),
    /// The providers could not be built from the config (e.g. an SSH key readable by others).
    #[error("cannot build the providers: {0}")]
    Build(#[source] ProviderError),
}

/// The providers of `cfg` acting as `installation`: its ID resolved
/// ([`Installation::id`]: the config's `installation.id`, else the kind's own default) and
/// written into every mark they make. Every command and driver opens its providers here, so
/// two of them given one config and one installation act as one installation.
///
/// No host is dialed; the only I/O is a standalone installation's ID file.
pub fn open(cfg: &ProviderConfig, installation: &Installation) -> Result<Providers, OpenError> {
    open_with(cfg, installation, &BuildOptions::default())
}

/// [`open`] with build options other than the defaults.
pub fn open_with(
    cfg: &ProviderConfig,
    installation: &Installation,
    opts: &BuildOptions,
) -> Result<Providers, OpenError> {
    let id = installation.id(cfg).map_err(OpenError::Installation)?;
    let cfg = ProviderConfig {
        installation: id,
        ..cfg.clone()
    };
    Providers::from_config(&cfg, opts).map_err(OpenError::Build)
}

/// Every provider entry by name.
#[derive(Debug, Clone, Default)]
pub struct Providers {
    entries: BTreeMap<String, ProviderHandle>,
    /// The config's `reputation:` settings (the defaults, no zones, when built from handles).
    reputation: Arc<egress_reputation::Settings>,
}

/// Options for building real providers from a config.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// Image download options.
    pub fetch: FetchOptions,
    /// Host check options.
    pub check: CheckOptions,
    /// Host pool options.
    pub pool: PoolOptions,
}

impl Providers {
    /// Builds a libvirt provider for every entry of `cfg`, each as the installation
    /// `cfg.installation` when set. Hosts whose `address` is
    /// [`LOCAL_ADDRESS`] are reached through their `socket` on this machine, others over SSH.
    /// Refuses (Permanent) a config whose SSH private key file, for a host reached over SSH,
    /// is readable by others ([`check_private_key_file`]: OpenSSH's rule), naming the field,
    /// the file and its mode, so an operator never starts on an exposed key.
    fn from_config(cfg: &ProviderConfig, opts: &BuildOptions) -> Result<Self, ProviderError> {
        let mut handles = Vec::new();
        for (i, entry) in cfg.providers.iter().enumerate() {
            let ProviderEntry::Libvirt(e) = entry;
            for (j, h) in e.hosts.iter().enumerate() {
                if h.address == LOCAL_ADDRESS {
                    continue;
                }
                if let Some(k) = &h.ssh_key_file
                    && let Err(why) = check_private_key_file(k)
                {
                    return Err(ProviderError::permanent(format!(
                        "providers[{i}].hosts[{j}].sshKeyFile {why}"
                    )));
                }
            }
            let connector = Arc::new(DispatchConnector {
                ssh: SshConnector::new(&e.timeouts),
                unix: UnixConnector::new(&e.timeouts),
            });
            let pool = HostPool::new(e.clone(), connector, opts.pool.clone())?;
            // The entry's own `timeouts.check` bounds each call of its hosts' checks.
            let check = CheckOptions {
                call_timeout: e.timeouts.check,
                ..opts.check.clone()
            };
            let mut provider = LibvirtProvider::new(pool, opts.fetch.clone(), check);
            // The installation's ID in every mark it writes; others' marks are foreign.
            if let Some(id) = &cfg.installation {
                provider = provider.with_installation(id)?;
            }
            handles.push(ProviderHandle::new(e.clone(), Arc::new(provider)));
        }
        Ok(Self::from_handles(handles).with_reputation(cfg.reputation.clone()))
    }

    /// Every provider consults `retired` (the process's retired addresses: one registry for
    /// the whole process, handed to the providers of every config load) before it hands out
    /// a declared egress address.
    pub fn with_retired_ref(
        &self,
        retired: &Arc<egress_provider::libvirt::retired::RetiredAddresses>,
    ) {
        for h in self.entries.values() {
            h.provider.use_retired(Arc::clone(retired));
        }
    }

    /// These providers with the config's `reputation:` settings.
    pub fn with_reputation(mut self, settings: egress_reputation::Settings) -> Self {
        self.reputation = Arc::new(settings);
        self
    }

    /// The config's `reputation:` settings (no zones: no checks).
    pub fn reputation(&self) -> &egress_reputation::Settings {
        &self.reputation
    }

    /// A registry of ready-made handles (later duplicates of a name replace earlier ones).
    pub fn from_handles(handles: impl IntoIterator<Item = ProviderHandle>) -> Self {
        Self {
            entries: handles
                .into_iter()
                .map(|h| (h.config.name.clone(), h))
                .collect(),
            reputation: Arc::default(),
        }
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&ProviderHandle> {
        self.entries.get(name)
    }

    /// Every entry, by name.
    pub fn iter(&self) -> impl Iterator<Item = &ProviderHandle> {
        self.entries.values()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Hex sha256 of an entry's configuration.
// NB: the Debug form covers every field (all config types derive Debug) and is stable within
// one build, which is all a latch release needs.
fn digest(e: &LibvirtEntry) -> String {
    let d = Sha256::digest(format!("{e:?}").as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Picks the unix connector for [`LOCAL_ADDRESS`] hosts and SSH for the rest.
struct DispatchConnector {
    ssh: SshConnector,
    unix: UnixConnector,
}

#[async_trait]
impl Connector for DispatchConnector {
    async fn connect(&self, host: &HostConfig) -> Result<Transport, ProviderError> {
        if host.address == LOCAL_ADDRESS {
            self.unix.connect(host).await
        } else {
            self.ssh.connect(host).await
        }
    }
}
