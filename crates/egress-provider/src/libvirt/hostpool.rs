//! The host pool of one provider entry: per host, one pooled control connection, dedicated
//! connections for bulk transfers, and a bound on concurrent operations.
//!
//! Guarantees:
//! - **One control connection per host, redialed when dead** (finding M6 at the pool level):
//!   [`HostPool::acquire`] hands out the pooled [`Client`] only while its connection is alive;
//!   after any connection-class failure (the client marks the connection dead itself) the
//!   next acquire dials again. A failed dial leaves no state behind: the next acquire dials
//!   again; its error is classified (Transient, or Permanent for e.g. a host key mismatch).
//! - **Concurrent first users share one dial**, and no lock is held across a dial or any other
//!   `.await`: the dial runs in its own task; waiters await a shared handle to its result.
//!   Dropping an `acquire` future never cancels a dial others wait for.
//! - **Bounded blast radius** (finding H1): each host has a semaphore of
//!   `hosts[].maxConcurrent` permits; a [`HostLease`] holds one until dropped, and waiting for
//!   one has a deadline ([`PoolOptions::permit_wait`]) after which acquire fails Transient
//!   naming the host. A frozen host therefore pins at most `maxConcurrent` workers.
//! - **Every dial is bounded** by [`HostPool::dial_budget`]: `timeouts.dial` for each of its
//!   [`DIAL_PHASES`] phases (TCP connect, SSH handshake, libvirt handshake).
//! - **Bulk transfers never share the control connection**: [`HostLease::bulk`] dials a
//!   dedicated connection, owned and closed by the caller.
//! - **Credentials are loaded once** (finding L19): [`SshConnector`] keeps the key and
//!   known_hosts bytes in a [`CredentialCache`] and reads a file again only when its
//!   length, modification time or inode changed (a `stat` per dial, no read).
//!
//! One piece: the pool, its lease and its connectors share one lifecycle (dial, share, redial,
//! permit) and the pool's private per-host state.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use libvirt_remote::transport::ssh::{self, ClientKey, HostKeySource, SshOptions, SshTarget};
use libvirt_remote::transport::unix;
use libvirt_remote::{Client, ConnectionConfig, OpenOptions, Transport};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::classify::classify;
use super::config::{DEFAULT_SSH_PORT, HostConfig, LibvirtEntry, Timeouts};
use crate::error::{ProviderError, Result};
use crate::sync::lock;

/// How long [`HostPool::acquire`] waits for one of a host's operation slots by default.
// NB: control operations take seconds; a host whose slots stay taken for 30 s is busy with
// imports or frozen. Failing Transient then frees the worker for other hosts (finding H1)
// and the controller retries with backoff.
pub const DEFAULT_PERMIT_WAIT: Duration = Duration::from_secs(30);

/// Phases of a dial, each bounded by `timeouts.dial`: TCP connect, SSH handshake (key
/// exchange, authentication, channel open), libvirt handshake (auth list, open).
pub const DIAL_PHASES: u32 = 3;

/// Extra time a waiter gives a shared dial beyond [`HostPool::dial_budget`] before giving up
/// on it (the dial task enforces the budget itself; this only guards the waiter).
// NB: covers task scheduling on a loaded 2-core box; the dial task's own timeout fires first.
pub const DIAL_WAIT_GRACE: Duration = Duration::from_secs(2);

/// Opens the byte stream to a host's libvirt socket. Implementations must bound their own
/// work (the pool bounds the whole dial as well).
#[async_trait]
pub trait Connector: Send + Sync {
    /// A connected transport to `host`'s libvirt socket, or a classified error naming the
    /// host and what to change.
    async fn connect(&self, host: &HostConfig) -> Result<Transport, ProviderError>;
}

/// Pool settings not carried by the entry.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Deadline for waiting for a host's operation slot.
    pub permit_wait: Duration,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            permit_wait: DEFAULT_PERMIT_WAIT,
        }
    }
}

/// The host pool of one provider entry. Cheap to clone; clones share connections and slots.
#[derive(Clone)]
pub struct HostPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for HostPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPool")
            .field("entry", &self.inner.entry.name)
            .field("hosts", &self.inner.hosts.len())
            .finish_non_exhaustive()
    }
}

struct PoolInner {
    entry: LibvirtEntry,
    connector: Arc<dyn Connector>,
    hosts: HashMap<String, Arc<HostSlot>>,
    opts: PoolOptions,
}

type DialResult = Result<(Client, u64), ProviderError>;
type SharedDial = Shared<BoxFuture<'static, DialResult>>;

struct HostSlot {
    config: HostConfig,
    permits: Arc<Semaphore>,
    control: Mutex<Control>,
    next_generation: AtomicU64,
    dials: AtomicU64,
}

enum Control {
    Idle,
    Dialing { generation: u64, dial: SharedDial },
    Ready { generation: u64, client: Client },
}

/// The whole-dial budget for `timeouts`: `timeouts.dial` × [`DIAL_PHASES`].
pub fn dial_budget(timeouts: &Timeouts) -> Duration {
    timeouts.dial.saturating_mul(DIAL_PHASES)
}

impl HostPool {
    /// A pool for `entry`, dialing through `connector`. Fails Permanent, naming the setting,
    /// when a host name repeats or a host's `maxConcurrent` is 0. Dials nothing.
    pub fn new(
        entry: LibvirtEntry,
        connector: Arc<dyn Connector>,
        opts: PoolOptions,
    ) -> Result<Self> {
        let mut hosts = HashMap::new();
        for h in &entry.hosts {
            if h.max_concurrent == 0 {
                return Err(ProviderError::permanent(format!(
                    "provider entry {}: hosts[{}].maxConcurrent is 0; set it to at least 1",
                    entry.name, h.name
                )));
            }
            let permits = usize::try_from(h.max_concurrent).unwrap_or(usize::MAX);
            let slot = Arc::new(HostSlot {
                config: h.clone(),
                permits: Arc::new(Semaphore::new(permits)),
                control: Mutex::new(Control::Idle),
                next_generation: AtomicU64::new(1),
                dials: AtomicU64::new(0),
            });
            if hosts.insert(h.name.clone(), slot).is_some() {
                return Err(ProviderError::permanent(format!(
                    "provider entry {}: host name {} appears twice in hosts; names must be unique",
                    entry.name, h.name
                )));
            }
        }
        Ok(Self {
            inner: Arc::new(PoolInner {
                entry,
                connector,
                hosts,
                opts,
            }),
        })
    }

    /// The entry this pool serves.
    pub fn entry(&self) -> &LibvirtEntry {
        &self.inner.entry
    }

    /// The configuration of `host`, or Permanent naming the entry's hosts.
    pub fn host(&self, host: &str) -> Result<&HostConfig> {
        self.slot(host).map(|s| &s.config)
    }

    /// How long one dial may take at most (see [`dial_budget`]).
    pub fn dial_budget(&self) -> Duration {
        dial_budget(&self.inner.entry.timeouts)
    }

    /// How many dials (control and bulk) were started for `host` (0 for unknown hosts).
    pub fn dials(&self, host: &str) -> u64 {
        self.inner
            .hosts
            .get(host)
            .map_or(0, |s| s.dials.load(Ordering::Relaxed))
    }

    fn slot(&self, host: &str) -> Result<&Arc<HostSlot>> {
        self.inner.hosts.get(host).ok_or_else(|| {
            let mut names: Vec<&str> = self.inner.hosts.keys().map(String::as_str).collect();
            names.sort_unstable();
            ProviderError::permanent(format!(
                "host {host} is not configured in provider entry {} (hosts: {})",
                self.inner.entry.name,
                names.join(", ")
            ))
        })
    }

    /// Takes one of `host`'s operation slots (waiting at most [`PoolOptions::permit_wait`])
    /// and the pooled control connection (dialing it if there is none or it died). The slot is
    /// released when the lease is dropped.
    pub async fn acquire(&self, host: &str) -> Result<HostLease> {
        let slot = self.slot(host)?.clone();
        let wait = self.inner.opts.permit_wait;
        let permit = match tokio::time::timeout(wait, slot.permits.clone().acquire_owned()).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => {
                return Err(ProviderError::transient(format!(
                    "host {host}: the host pool was shut down"
                )));
            }
            Err(_) => {
                return Err(ProviderError::transient(format!(
                    "host {host} is busy: all {} operation slots (hosts[{host}].maxConcurrent) \
                     stayed taken for {}s; the host may be frozen or importing images",
                    slot.config.max_concurrent,
                    wait.as_secs_f64()
                )));
            }
        };
        let (client, generation) = self.control_of(&slot).await?;
        Ok(HostLease {
            pool: self.clone(),
            slot,
            client,
            generation,
            _permit: permit,
        })
    }

    /// The pooled control connection of `host` without taking an operation slot, for cheap
    /// bounded probes (the host check) that must not queue behind long operations.
    pub async fn control(&self, host: &str) -> Result<Client> {
        let slot = self.slot(host)?.clone();
        self.control_of(&slot).await.map(|(c, _)| c)
    }

    async fn control_of(&self, slot: &Arc<HostSlot>) -> Result<(Client, u64)> {
        let dial = {
            let mut g = lock(&slot.control);
            match &*g {
                Control::Ready { generation, client } if client.connection().is_alive() => {
                    return Ok((client.clone(), *generation));
                }
                Control::Dialing { dial, .. } => dial.clone(),
                Control::Ready { .. } | Control::Idle => {
                    let generation = slot.next_generation.fetch_add(1, Ordering::Relaxed);
                    let dial = self.spawn_control_dial(slot, generation);
                    *g = Control::Dialing {
                        generation,
                        dial: dial.clone(),
                    };
                    dial
                }
            }
        };
        let limit = self.dial_budget().saturating_add(DIAL_WAIT_GRACE);
        match tokio::time::timeout(limit, dial).await {
            Ok(r) => r,
            Err(_) => Err(ProviderError::transient(format!(
                "connecting to host {} ({}) did not complete within {}s",
                slot.config.name,
                slot.config.address,
                limit.as_secs_f64()
            ))),
        }
    }

    fn spawn_control_dial(&self, slot: &Arc<HostSlot>, generation: u64) -> SharedDial {
        let weak: Weak<HostSlot> = Arc::downgrade(slot);
        let dial = self.dial(slot);
        let task = async move {
            let res = dial.await;
            if let Some(slot) = weak.upgrade() {
                let mut g = lock(&slot.control);
                if matches!(&*g, Control::Dialing { generation: current, .. } if *current == generation)
                {
                    *g = match &res {
                        Ok(c) => Control::Ready {
                            generation,
                            client: c.clone(),
                        },
                        Err(_) => Control::Idle,
                    };
                }
            }
            res.map(|c| (c, generation))
        };
        let host = slot.config.name.clone();
        tokio::spawn(task)
            .map(move |joined| match joined {
                Ok(r) => r,
                Err(e) => Err(ProviderError::transient(format!(
                    "connecting to host {host}: the dial task ended unexpectedly: {e}"
                ))),
            })
            .boxed()
            .shared()
    }

    /// A new connection to the host (connector + libvirt handshake), bounded by the dial
    /// budget. Not pooled.
    fn dial(&self, slot: &Arc<HostSlot>) -> impl Future<Output = Result<Client>> + Send + 'static {
        slot.dials.fetch_add(1, Ordering::Relaxed);
        let connector = self.inner.connector.clone();
        let host = slot.config.clone();
        let timeouts = self.inner.entry.timeouts.clone();
        async move {
            let budget = dial_budget(&timeouts);
            let work = async {
                let transport = connector.connect(&host).await?;
                let opts = OpenOptions {
                    open_timeout: timeouts.dial,
                    connection: ConnectionConfig {
                        call_timeout: timeouts.call,
                        ..ConnectionConfig::default()
                    },
                    ..OpenOptions::default()
                };
                Client::open(transport, opts).await.map_err(|e| {
                    classify(
                        &e,
                        &format!("opening libvirt on host {} ({})", host.name, host.address),
                    )
                })
            };
            match tokio::time::timeout(budget, work).await {
                Ok(r) => r,
                Err(_) => Err(ProviderError::transient(format!(
                    "connecting to host {} ({}) did not complete within {}s \
                     ({DIAL_PHASES} × timeouts.dial)",
                    host.name,
                    host.address,
                    budget.as_secs_f64()
                ))),
            }
        }
    }

    /// Kills `host`'s control connection if it is still generation `generation`, so the next acquire
    /// redials. Other holders of the same connection see their calls fail (Transient).
    fn invalidate(&self, slot: &HostSlot, generation: u64) {
        let mut g = lock(&slot.control);
        if let Control::Ready {
            generation: current,
            client,
        } = &*g
            && *current == generation
        {
            client.close();
            *g = Control::Idle;
        }
    }
}

/// One operation's hold on a host: an operation slot and the pooled control client. Dropping
/// it frees the slot; the control connection stays pooled.
pub struct HostLease {
    pool: HostPool,
    slot: Arc<HostSlot>,
    client: Client,
    generation: u64,
    _permit: OwnedSemaphorePermit,
}

impl std::fmt::Debug for HostLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostLease")
            .field("host", &self.slot.config.name)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl HostLease {
    /// The pooled control client (calls carry `timeouts.call` as their deadline).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The host's configuration.
    pub fn host(&self) -> &HostConfig {
        &self.slot.config
    }

    /// The number of the control connection [`HostLease::client`] is (a redial gets a new
    /// one): what per-connection caches key on.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// A dedicated new connection for a bulk transfer (uploads), dialed within the dial
    /// budget. The caller owns it and closes it (`Client::close_by`); it is never pooled.
    pub async fn bulk(&self) -> Result<Client> {
        self.pool.dial(&self.slot).await
    }

    /// Drops the pooled control connection this lease uses (e.g. after a call deadline on a
    /// host that may be frozen) so the next acquire redials. No-op if it was already replaced.
    pub fn invalidate(&self) {
        self.pool.invalidate(&self.slot, self.generation);
    }
}

// ---- connectors ----

/// Dials hosts through SSH (`transport::ssh`) to their libvirt socket, with credentials
/// from a [`CredentialCache`] (read once, reloaded on change).
#[derive(Debug)]
pub struct SshConnector {
    creds: CredentialCache,
    options: SshOptions,
}

impl SshConnector {
    /// A connector whose TCP dial and SSH handshake are each bounded by `timeouts.dial`;
    /// keepalive and ciphers are the SSH layer's defaults.
    pub fn new(timeouts: &Timeouts) -> Self {
        Self {
            creds: CredentialCache::default(),
            options: SshOptions {
                dial_timeout: timeouts.dial,
                handshake_timeout: timeouts.dial,
                ..SshOptions::default()
            },
        }
    }

    /// The credential cache (its [`CredentialCache::reads`] counts file reads).
    pub fn credentials(&self) -> &CredentialCache {
        &self.creds
    }

    async fn target(&self, host: &HostConfig) -> Result<SshTarget> {
        let (addr, port) = parse_address(&host.address).map_err(|why| {
            ProviderError::permanent(format!(
                "hosts[{}].address {:?}: {why}; expected host[:port]",
                host.name, host.address
            ))
        })?;
        let key_path = host.ssh_key_file.as_ref().ok_or_else(|| {
            ProviderError::permanent(format!(
                "hosts[{}].sshKeyFile is not set; the SSH private key is required",
                host.name
            ))
        })?;
        let kh_path = host.known_hosts_file.as_ref().ok_or_else(|| {
            ProviderError::permanent(format!(
                "hosts[{}].knownHostsFile is not set; host keys are never trusted on first use",
                host.name
            ))
        })?;
        let kp = key_path.clone();
        tokio::task::spawn_blocking(move || check_private_key_file(&kp))
            .await
            .map_err(|e| ProviderError::transient(format!("checking the SSH key: {e}")))?
            .map_err(|why| {
                ProviderError::permanent(format!("hosts[{}].sshKeyFile {why}", host.name))
            })?;
        let key = self.creds.load(key_path).await.map_err(|e| {
            ProviderError::permanent(format!(
                "hosts[{}].sshKeyFile {}: cannot read: {e}",
                host.name,
                key_path.display()
            ))
        })?;
        let kh = self.creds.load(kh_path).await.map_err(|e| {
            ProviderError::permanent(format!(
                "hosts[{}].knownHostsFile {}: cannot read: {e}",
                host.name,
                kh_path.display()
            ))
        })?;
        let text = String::from_utf8(kh.to_vec()).map_err(|_| {
            ProviderError::permanent(format!(
                "hosts[{}].knownHostsFile {} is not UTF-8 text",
                host.name,
                kh_path.display()
            ))
        })?;
        let host_keys = HostKeySource::KnownHostsText {
            text,
            origin: format!("known_hosts {}", kh_path.display()),
        };
        Ok(SshTarget::new(
            addr,
            host.user.clone(),
            host_keys,
            ClientKey::from_bytes(key.to_vec()),
        )
        .with_port(port)
        .with_socket_path(host.socket.clone()))
    }
}

#[async_trait]
impl Connector for SshConnector {
    async fn connect(&self, host: &HostConfig) -> Result<Transport, ProviderError> {
        let target = self.target(host).await?;
        ssh::connect(&target, &self.options).await.map_err(|e| {
            classify(
                &e,
                &format!(
                    "connecting to host {} ({}) over SSH",
                    host.name, host.address
                ),
            )
        })
    }
}

/// Dials the host's `socket` on this machine (standalone on the host itself, and tests).
#[derive(Debug, Clone)]
pub struct UnixConnector {
    timeout: Duration,
}

impl UnixConnector {
    /// A connector whose connect is bounded by `timeouts.dial`.
    pub fn new(timeouts: &Timeouts) -> Self {
        Self {
            timeout: timeouts.dial,
        }
    }
}

#[async_trait]
impl Connector for UnixConnector {
    async fn connect(&self, host: &HostConfig) -> Result<Transport, ProviderError> {
        unix::connect(&host.socket, self.timeout)
            .await
            .map_err(|e| {
                classify(
                    &e,
                    &format!(
                        "connecting to host {} at unix socket {}",
                        host.name, host.socket
                    ),
                )
            })
    }
}

/// Splits `host[:port]` (`[v6]:port`, or a bare IPv6 literal) into host and port; the port
/// defaults to 22.
pub fn parse_address(address: &str) -> std::result::Result<(String, u16), String> {
    let address = address.trim();
    if address.is_empty() {
        return Err("the address is empty".into());
    }
    let (host, port) = if let Some(rest) = address.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| "an IPv6 literal opened with [ is not closed".to_owned())?;
        match after {
            "" => (host, None),
            p => (
                host,
                Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| format!("unexpected {p:?} after ]"))?,
                ),
            ),
        }
    } else if address.matches(':').count() == 1 {
        let (h, p) = address.split_once(':').unwrap_or((address, ""));
        (h, Some(p))
    } else {
        (address, None)
    };
    if host.is_empty() {
        return Err("the host part is empty".into());
    }
    let port = match port {
        None => DEFAULT_SSH_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n != 0 => n,
            _ => return Err(format!("port {p:?} is not a number from 1 to 65535")),
        },
    };
    Ok((host.to_owned(), port))
}

// ---- credentials ----

/// Refuses a private key file others may read, as OpenSSH does ("UNPROTECTED PRIVATE KEY
/// FILE"): a key owned by the operator's effective user must have no group or other
/// permission bits (`0600`, `0400`); whoever owns it, a key anyone on the machine may access
/// (any "other" bit) is refused too. A key owned by another user and readable through its
/// group is accepted (a Kubernetes Secret volume: root-owned, mode `0440`, group `fsGroup`),
/// as OpenSSH accepts it. Symbolic links are followed (the file's own mode counts). A file
/// whose metadata cannot be read passes here: reading it reports that. The error names the
/// file and its mode.
pub fn check_private_key_file(path: &Path) -> std::result::Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(path) else {
        return Ok(());
    };
    let mode = m.mode() & 0o7777;
    let euid = rustix::process::geteuid().as_raw();
    let own = m.uid() == euid;
    if mode & 0o007 != 0 || (own && mode & 0o077 != 0) {
        let who = if mode & 0o007 != 0 {
            "any user of this machine"
        } else {
            "its group"
        };
        return Err(format!(
            "{}: permissions {mode:04o} are too open: the private key is accessible by {who}; \
             `chmod 600 {}` (an SSH private key must be readable by its owner only)",
            path.display(),
            path.display()
        ));
    }
    Ok(())
}

/// Bytes of credential files (SSH keys, known_hosts), read once and re-read only when a
/// file's length, modification time or inode changes (finding L19). Each load costs one
/// `stat`, run off the async workers. `Debug` shows the files' paths and sizes, never their
/// bytes (a private key).
#[derive(Debug, Default)]
pub struct CredentialCache {
    files: Mutex<HashMap<PathBuf, Cached>>,
    reads: AtomicU64,
}

#[derive(Clone)]
struct Cached {
    stamp: Stamp,
    bytes: Arc<[u8]>,
}

impl std::fmt::Debug for Cached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cached")
            .field("stamp", &self.stamp)
            .field(
                "bytes",
                &format_args!("<{} bytes, redacted>", self.bytes.len()),
            )
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    dev: u64,
    ino: u64,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            len: m.len(),
            modified: m.modified().ok(),
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

impl CredentialCache {
    /// The file's bytes: from the cache when the file is unchanged, else read anew.
    pub async fn load(&self, path: &Path) -> std::io::Result<Arc<[u8]>> {
        let p = path.to_owned();
        let stamp =
            tokio::task::spawn_blocking(move || std::fs::metadata(p).map(|m| Stamp::of(&m)))
                .await
                .map_err(std::io::Error::other)??;
        if let Some(c) = lock(&self.files).get(path)
            && c.stamp == stamp
        {
            return Ok(c.bytes.clone());
        }
        let p = path.to_owned();
        let (bytes, stamp) = tokio::task::spawn_blocking(move || {
            let bytes = std::fs::read(&p)?;
            // NB: stat again after reading so a change during the read is seen next time.
            let stamp = std::fs::metadata(&p).map(|m| Stamp::of(&m))?;
            Ok::<_, std::io::Error>((bytes, stamp))
        })
        .await
        .map_err(std::io::Error::other)??;
        self.reads.fetch_add(1, Ordering::Relaxed);
        let bytes: Arc<[u8]> = bytes.into();
        lock(&self.files).insert(
            path.to_owned(),
            Cached {
                stamp,
                bytes: bytes.clone(),
            },
        );
        Ok(bytes)
    }

    /// How many times a file was actually read.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_and_without_ports() {
        assert_eq!(parse_address("h1").unwrap(), ("h1".into(), 22));
        assert_eq!(parse_address("h1:2222").unwrap(), ("h1".into(), 2222));
        assert_eq!(parse_address("[::1]:2200").unwrap(), ("::1".into(), 2200));
        assert_eq!(parse_address("[::1]").unwrap(), ("::1".into(), 22));
        assert_eq!(parse_address("fe80::1").unwrap(), ("fe80::1".into(), 22));
        for bad in [
            "", "h1:", "h1:0", "h1:70000", ":22", "[::1", "[::1]x", "h:x",
        ] {
            assert!(parse_address(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_private_key_others_may_read_is_refused_as_openssh_does() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!(
            "eptest-keymode-{}-{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("id_ed25519");
        std::fs::write(&p, b"key").unwrap();
        let set = |mode: u32| {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        for ok in [0o600, 0o400] {
            set(ok);
            assert!(check_private_key_file(&p).is_ok(), "{ok:o}");
        }
        for bad in [0o640, 0o644, 0o604, 0o660, 0o601, 0o610] {
            set(bad);
            let e = check_private_key_file(&p).unwrap_err();
            assert!(
                e.contains(&format!("{bad:04o}"))
                    && e.contains("id_ed25519")
                    && e.contains("too open"),
                "{e}"
            );
        }
        // Followed through a link: the file's mode counts.
        let link = dir.join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(check_private_key_file(&link).is_err());
        set(0o600);
        assert!(check_private_key_file(&link).is_ok());
        // A missing file is left to the read (which names it).
        assert!(check_private_key_file(&dir.join("none")).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn credentials_are_read_once_and_again_only_after_a_change() {
        // finding: L19
        let dir = std::env::temp_dir().join(format!(
            "eptest-creds-{}-{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("key");
        std::fs::write(&p, b"one").unwrap();
        let cache = CredentialCache::default();
        for _ in 0..50 {
            assert_eq!(&*cache.load(&p).await.unwrap(), b"one");
        }
        // Debug never shows a cached file's bytes (a private key): b"one" is [111, 110, 101].
        let shown = format!("{cache:?} {cache:#?}");
        assert!(!shown.contains("111, 110, 101"), "{shown}");
        assert!(shown.contains("<3 bytes, redacted>"), "{shown}");
        assert_eq!(cache.reads(), 1);
        // An atomic replace (new inode), as a Secret update does.
        let tmp = dir.join("key.new");
        std::fs::write(&tmp, b"two!").unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        for _ in 0..10 {
            assert_eq!(&*cache.load(&p).await.unwrap(), b"two!");
        }
        assert_eq!(cache.reads(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
