//! SSH transport: an SSH connection (russh) to a libvirt host, then a `direct-streamlocal`
//! channel to the host's libvirt socket, returned as a [`Transport`].
//!
//! Guarantees:
//! - **Strict host keys, no trust on first use.** The server's key must equal a key pinned
//!   for the configured address: OpenSSH `known_hosts` text looked up as `host` (port 22) or
//!   `[host]:port`, including comma lists, wildcards, negation and hashed names (finding
//!   APX-4), or explicitly pinned keys. Only the host-key algorithms of the pinned keys are
//!   offered, so a host pinned only by RSA negotiates RSA instead of failing on the ed25519
//!   key the server prefers (finding L3). An unknown host, a mismatch and a `@revoked` key
//!   are permanent errors ([`Error::is_permanent`]) naming `host:port` and the file and line
//!   (finding L2).
//!
//!   NB: we match known_hosts ourselves (`ssh/known_hosts.rs`) because russh 0.65's
//!   `check_known_hosts_path` ignores `@revoked` (the marker is taken as the host pattern),
//!   has no wildcards or negation, splits on single spaces, miscounts lines after comments,
//!   treats an unreadable file as an unknown host, and returns only a boolean, so it cannot
//!   tell which algorithms are pinned. Key decoding is left to ssh-key.
//! - **Bounded setup.** Dialing has [`SshOptions::dial_timeout`]; key exchange,
//!   authentication and the channel open together have [`SshOptions::handshake_timeout`].
//!   If setup fails, times out or its future is dropped, the TCP socket is shut at once.
//! - **A dead peer is noticed.** SSH keepalives ([`SshOptions::keepalive_interval`] ×
//!   [`SshOptions::keepalive_max`]) and an inactivity timeout are always set; zero or
//!   inconsistent values are rejected with an error naming the field, never a panic
//!   (finding L1). When the SSH session ends for a reason (keepalive timeout, disconnect), the
//!   channel's reader gets an I/O error saying so instead of a plain end of file (finding M20).
//! - **Killing never waits on the peer.** The transport's kill switch first shuts the TCP
//!   socket we dialed ourselves (so a russh write blocked on a full send buffer fails at
//!   once), then drops the session handle (finding H1). Dropping the transport does the same.
//! - Authentication is by private key (ed25519, ecdsa, rsa; RSA signs with rsa-sha2-512 or
//!   -256, never SHA-1); a refusal is permanent and names `user@host:port`. A refused channel
//!   names the socket and the possible causes. OpenSSH answers "connect failed" both when the
//!   socket is unreachable and when stream-local forwarding is forbidden, so that case is
//!   transient (libvirtd may be restarting); an explicit "administratively prohibited" is
//!   permanent.
//! - [`connect_over`] runs the same over a TCP stream the caller dialed.
//!
//! One piece: dialing, host-key verification, authentication and the channel stream share the
//! session's kill switch and error classification; known_hosts matching is already its own module,
//! and the file ends with its tests.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::{Stream, StreamExt};
use russh::client::{self, AuthResult, DisconnectReason, Handle, Handler, Msg};
use russh::keys::ssh_key::HashAlg;
use russh::keys::{PrivateKey, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use russh::{ChannelMsg, ChannelOpenFailure, ChannelReadHalf, ChannelWriteHalf, Preferred};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::{DEFAULT_SOCKET, KillSwitch, PacketSink, Transport};
use crate::error::{Error, Result};

mod known_hosts;

use known_hosts::HostKeyPolicy;

/// The SSH port used when none is configured.
pub const DEFAULT_PORT: u16 = 22;

/// Default deadline for the TCP connect.
// NB: Linux retransmits a SYN after 1 s and 3 s; 10 s survives two losses on a bad link while
// bounding an unreachable host well below a reconcile deadline.
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Default deadline for key exchange + authentication + channel open, after the dial.
// NB: well under a second on loopback (RSA host and client keys included); sshd's own
// reverse DNS (`UseDNS`) and a loaded host can add seconds. 20 s bounds a wedged sshd.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);

/// Default interval after which a silent server is sent an SSH keepalive.
// NB: OpenSSH users commonly set ServerAliveInterval 10–30 s. With the default count a frozen
// host is declared dead within 40 s, on the order of libvirt's own keepalive budget (30 s),
// and an idle NAT mapping is refreshed well within typical 60 s+ timeouts.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// Default number of unanswered keepalives after which the session is closed (OpenSSH's
/// ServerAliveCountMax default is also 3). Death is declared after interval × (count + 1).
pub const DEFAULT_KEEPALIVE_MAX: u32 = 3;

/// Default time without any progress (nothing read, nothing written) after which the session
/// is closed. This is what bounds a write blocked on a full send buffer, where keepalives
/// cannot be sent.
// NB: must exceed the keepalive interval (keepalive replies reset it on a healthy idle
// connection); 120 s is 3× the default keepalive budget, so keepalive reports first when it
// can, yet a stuck write is still bounded far below the seed's 15-minute wedge.
pub const DEFAULT_INACTIVITY_TIMEOUT: Duration = Duration::from_secs(120);

/// Ciphers offered by default on a CPU with AES and carry-less multiplication instructions
/// (AES-NI and PCLMULQDQ on x86-64, the crypto extension on aarch64), most preferred first.
// NB: measured (russh 0.65 + aws-lc-rs, 1 GiB through a direct-streamlocal channel to OpenSSH
// 9.2 on loopback, CPU seconds of the client per GiB; docs/benchmarks.md): aes128-gcm is
// the cheapest by far with AES-NI (its encryption is 6–13 % of the client's perf samples,
// chacha20-poly1305's ~40 %; ~1.0 against ~1.5 CPU-s per GiB); aes256-gcm costs a little
// more than aes128-gcm; aes*-ctr with an HMAC is several times slower. russh's own order starts with chacha20-poly1305 and omits
// aes128-gcm.
pub const DEFAULT_CIPHERS: &[&str] = &[
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
];

/// Ciphers offered by default on a CPU without those instructions: ChaCha20-Poly1305 first,
/// since AES-GCM in software is several times slower (and table-based AES leaks timing).
pub const CHACHA_FIRST_CIPHERS: &[&str] = &[
    "chacha20-poly1305@openssh.com",
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
];

/// The default cipher order for the CPU this runs on: [`DEFAULT_CIPHERS`] where AES-GCM
/// runs in hardware, else [`CHACHA_FIRST_CIPHERS`].
pub fn default_ciphers() -> &'static [&'static str] {
    if hardware_aes_gcm() {
        DEFAULT_CIPHERS
    } else {
        CHACHA_FIRST_CIPHERS
    }
}

/// Whether this CPU runs AES-GCM in hardware (AES rounds and the GHASH multiplication).
fn hardware_aes_gcm() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// Where the host keys trusted for a target come from.
#[derive(Clone)]
pub enum HostKeySource {
    /// An OpenSSH `known_hosts` file (read at each connect).
    KnownHostsFile(PathBuf),
    /// The text of a `known_hosts` file; `origin` names it in error messages.
    KnownHostsText {
        /// The file's contents.
        text: String,
        /// A name for messages, e.g. the Secret it came from.
        origin: String,
    },
    /// Public keys in OpenSSH format (`ssh-ed25519 AAAA… [comment]`), all accepted for the
    /// target, whatever its address.
    Pinned(Vec<String>),
}

impl std::fmt::Debug for HostKeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::KnownHostsFile(p) => f.debug_tuple("KnownHostsFile").field(p).finish(),
            Self::KnownHostsText { origin, .. } => f
                .debug_struct("KnownHostsText")
                .field("origin", origin)
                .finish_non_exhaustive(),
            Self::Pinned(k) => f.debug_tuple("Pinned").field(&k.len()).finish(),
        }
    }
}

/// The client's private key: OpenSSH (or PEM/PKCS#8/PuTTY) text, from a file or memory,
/// optionally encrypted. `Debug` never shows the key or the passphrase.
#[derive(Clone)]
pub struct ClientKey {
    source: KeyBytes,
    passphrase: Option<String>,
}

#[derive(Clone)]
enum KeyBytes {
    File(PathBuf),
    Memory(Arc<[u8]>),
}

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("ClientKey");
        match &self.source {
            KeyBytes::File(p) => d.field("file", p),
            KeyBytes::Memory(b) => d.field("bytes", &b.len()),
        };
        d.field("passphrase", &self.passphrase.is_some()).finish()
    }
}

impl ClientKey {
    /// A key read from `path` at each connect.
    pub fn from_file(path: impl Into<PathBuf>) -> Self {
        Self {
            source: KeyBytes::File(path.into()),
            passphrase: None,
        }
    }

    /// A key held in memory (e.g. from a Kubernetes Secret).
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            source: KeyBytes::Memory(bytes.into().into()),
            passphrase: None,
        }
    }

    /// The passphrase that decrypts the key.
    pub fn with_passphrase(mut self, passphrase: impl Into<String>) -> Self {
        self.passphrase = Some(passphrase.into());
        self
    }

    fn describe(&self) -> String {
        match &self.source {
            KeyBytes::File(p) => format!("client key {}", p.display()),
            KeyBytes::Memory(_) => "in-memory client key".into(),
        }
    }

    /// Reads and decodes the key. Errors are permanent: retrying cannot fix a bad key.
    async fn load(&self) -> Result<PrivateKey> {
        let what = self.describe();
        let bytes: Arc<[u8]> = match &self.source {
            KeyBytes::File(p) => read_file(p.clone())
                .await
                .map_err(|e| Error::setup(format!("cannot read {what}: {e}"), true))?
                .into(),
            KeyBytes::Memory(b) => b.clone(),
        };
        let passphrase = self.passphrase.clone();
        // NB: decrypting a key runs bcrypt-pbkdf (tens of ms per round set); keep it off the
        // async workers.
        let decoded = tokio::task::spawn_blocking(move || {
            let text = std::str::from_utf8(&bytes).map_err(|e| e.to_string())?;
            russh::keys::decode_secret_key(text, passphrase.as_deref()).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| Error::setup(format!("decoding {what} failed: {e}"), false))?;
        decoded.map_err(|e| {
            let hint = if self.passphrase.is_none() {
                " (if it is encrypted, a passphrase is needed)"
            } else {
                ""
            };
            Error::setup(format!("cannot decode {what}: {e}{hint}"), true)
        })
    }
}

/// Reads a (small) file off the async workers.
async fn read_file(path: PathBuf) -> std::io::Result<Vec<u8>> {
    tokio::task::spawn_blocking(move || std::fs::read(path))
        .await
        .map_err(std::io::Error::other)?
}

/// Which host to reach, as whom, and what to trust.
#[derive(Debug, Clone)]
pub struct SshTarget {
    /// Host name or IP literal (without brackets), dialed as given and looked up in
    /// known_hosts lower-cased.
    pub host: String,
    /// SSH port.
    pub port: u16,
    /// Remote user.
    pub user: String,
    /// Path of libvirt's unix socket on the host.
    pub socket_path: String,
    /// Trusted host keys.
    pub host_keys: HostKeySource,
    /// The private key to authenticate with.
    pub client_key: ClientKey,
}

impl SshTarget {
    /// A target on port 22 reaching the system libvirtd socket.
    pub fn new(
        host: impl Into<String>,
        user: impl Into<String>,
        host_keys: HostKeySource,
        client_key: ClientKey,
    ) -> Self {
        Self {
            host: host.into(),
            port: DEFAULT_PORT,
            user: user.into(),
            socket_path: DEFAULT_SOCKET.into(),
            host_keys,
            client_key,
        }
    }

    /// The same target on another port.
    pub fn with_port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// The same target with another libvirt socket path.
    pub fn with_socket_path(mut self, path: impl Into<String>) -> Self {
        self.socket_path = path.into();
        self
    }

    /// The name this target is looked up under in known_hosts: `host`, or `[host]:port` when
    /// the port is not 22.
    pub fn known_hosts_name(&self) -> String {
        known_hosts::lookup_name(&self.host, self.port)
    }

    fn describe(&self) -> String {
        format!("{}@{}:{}", self.user, self.host, self.port)
    }

    async fn policy(&self) -> Result<HostKeyPolicy> {
        let policy = match &self.host_keys {
            HostKeySource::KnownHostsFile(path) => {
                let text = read_file(path.clone()).await.and_then(|b| {
                    String::from_utf8(b).map_err(|e| {
                        std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
                    })
                });
                let text = text.map_err(|e| {
                    Error::setup(
                        format!(
                            "cannot read known_hosts {} for {}: {e}",
                            path.display(),
                            self.describe()
                        ),
                        true,
                    )
                })?;
                HostKeyPolicy::from_known_hosts(
                    &text,
                    &format!("known_hosts {}", path.display()),
                    &self.host,
                    self.port,
                )
            }
            HostKeySource::KnownHostsText { text, origin } => {
                HostKeyPolicy::from_known_hosts(text, origin, &self.host, self.port)
            }
            HostKeySource::Pinned(keys) => HostKeyPolicy::from_pinned(keys, &self.host, self.port),
        }
        .map_err(|m| Error::setup(m, true))?;
        policy.ensure_pinned().map_err(|m| Error::setup(m, true))?;
        Ok(policy)
    }
}

/// Tunables of the SSH layer. Every duration and count must be non-zero; see
/// [`validate`](Self::validate).
#[derive(Debug, Clone)]
pub struct SshOptions {
    /// Deadline for the TCP connect.
    pub dial_timeout: Duration,
    /// Deadline for key exchange, authentication and channel open together.
    pub handshake_timeout: Duration,
    /// Send an SSH keepalive after this long without hearing from the server.
    pub keepalive_interval: Duration,
    /// Close the session after this many unanswered keepalives.
    pub keepalive_max: u32,
    /// Close the session after this long without any progress (must exceed
    /// `keepalive_interval`).
    pub inactivity_timeout: Duration,
    /// Ciphers to offer, most preferred first, by SSH name (e.g. `aes128-gcm@openssh.com`,
    /// `aes256-gcm@openssh.com`, `chacha20-poly1305@openssh.com`, `aes256-ctr`). Defaults to
    /// [`default_ciphers`] (AES-GCM first where the CPU has AES instructions, ChaCha20-Poly1305
    /// first elsewhere); empty means russh's own order (chacha20-poly1305 first, no
    /// aes128-gcm).
    pub ciphers: Vec<String>,
}

impl Default for SshOptions {
    fn default() -> Self {
        Self {
            dial_timeout: DEFAULT_DIAL_TIMEOUT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            keepalive_interval: DEFAULT_KEEPALIVE_INTERVAL,
            keepalive_max: DEFAULT_KEEPALIVE_MAX,
            inactivity_timeout: DEFAULT_INACTIVITY_TIMEOUT,
            ciphers: default_ciphers().iter().map(|c| (*c).to_owned()).collect(),
        }
    }
}

impl SshOptions {
    /// Checks every value; a zero duration or count, an inactivity timeout not above the
    /// keepalive interval, or an unknown or unencrypted cipher is an error naming the field
    /// (finding L1).
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, why: String| {
            Err(Error::setup(
                format!("invalid SSH setting {field}: {why}"),
                true,
            ))
        };
        for (field, d) in [
            ("dial_timeout", self.dial_timeout),
            ("handshake_timeout", self.handshake_timeout),
            ("keepalive_interval", self.keepalive_interval),
            ("inactivity_timeout", self.inactivity_timeout),
        ] {
            if d.is_zero() {
                return bad(field, format!("{d:?} must be greater than zero"));
            }
        }
        if self.keepalive_max == 0 {
            // NB: russh reads 0 as "never give up", which would hide a dead peer.
            return bad("keepalive_max", "0 must be greater than zero".into());
        }
        if self.inactivity_timeout <= self.keepalive_interval {
            return bad(
                "inactivity_timeout",
                format!(
                    "{:?} must be greater than keepalive_interval ({:?}), or an idle healthy \
                     connection would be closed",
                    self.inactivity_timeout, self.keepalive_interval
                ),
            );
        }
        for c in &self.ciphers {
            if let Err(why) = cipher_name(c) {
                return bad("ciphers", why);
            }
        }
        Ok(())
    }

    /// How long a silent server survives before the session is closed:
    /// `keepalive_interval × (keepalive_max + 1)`.
    pub fn keepalive_budget(&self) -> Duration {
        self.keepalive_interval
            .saturating_mul(self.keepalive_max.saturating_add(1))
    }

    fn russh_config(&self, policy: &HostKeyPolicy) -> Result<client::Config> {
        let mut preferred = Preferred {
            key: policy.algorithms().into(),
            ..Preferred::default()
        };
        if !self.ciphers.is_empty() {
            let names = self
                .ciphers
                .iter()
                .map(|c| cipher_name(c).map_err(|why| Error::setup(why, true)))
                .collect::<Result<Vec<_>>>()?;
            preferred.cipher = names.into();
        }
        Ok(client::Config {
            preferred,
            keepalive_interval: Some(self.keepalive_interval),
            keepalive_max: usize::try_from(self.keepalive_max).unwrap_or(usize::MAX),
            inactivity_timeout: Some(self.inactivity_timeout),
            nodelay: true,
            ..client::Config::default()
        })
    }
}

fn cipher_name(name: &str) -> std::result::Result<russh::cipher::Name, String> {
    let known = || {
        russh::cipher::ALL_CIPHERS
            .iter()
            .map(|n| n.as_ref())
            .filter(|n| *n != "none" && *n != "clear")
            .collect::<Vec<_>>()
            .join(", ")
    };
    if name == "none" || name == "clear" {
        return Err(format!("`{name}` is not encrypted (known: {})", known()));
    }
    russh::cipher::Name::try_from(name)
        .map_err(|()| format!("unknown cipher `{name}` (known: {})", known()))
}

/// The algorithms a session negotiated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionInfo {
    /// Key exchange, e.g. `curve25519-sha256`.
    pub kex: String,
    /// Host-key algorithm, e.g. `ssh-ed25519` or `rsa-sha2-512`.
    pub host_key_algorithm: String,
    /// The server's host key fingerprint (`SHA256:…`).
    pub host_key_fingerprint: String,
    /// Cipher, e.g. `chacha20-poly1305@openssh.com`.
    pub cipher: String,
    /// MAC client → server (`none` with AEAD ciphers).
    pub client_mac: String,
    /// MAC server → client.
    pub server_mac: String,
}

/// Opens an SSH session to `target`, then a `direct-streamlocal` channel to its libvirt
/// socket. See the module docs for the guarantees.
pub async fn connect(target: &SshTarget, opts: &SshOptions) -> Result<Transport> {
    connect_with_info(target, opts).await.map(|(t, _)| t)
}

/// Like [`connect`], also returning the negotiated algorithms.
pub async fn connect_with_info(
    target: &SshTarget,
    opts: &SshOptions,
) -> Result<(Transport, SessionInfo)> {
    // NB: everything that can be refused without the network is checked before dialing.
    let prepared = Prepared::new(target, opts).await?;
    let tcp = tokio::time::timeout(
        opts.dial_timeout,
        TcpStream::connect((target.host.as_str(), target.port)),
    )
    .await
    .map_err(|_| {
        Error::setup(
            format!(
                "connecting to {}:{} timed out after {:?}",
                target.host, target.port, opts.dial_timeout
            ),
            false,
        )
    })?
    .map_err(|e| {
        Error::setup(
            format!("cannot connect to {}:{}: {e}", target.host, target.port),
            false,
        )
    })?;
    establish(prepared, tcp, target, opts).await
}

/// Like [`connect_with_info`] over a TCP stream the caller dialed (e.g. inside a network
/// namespace, or with its own socket options). `target.host` and `target.port` are still
/// what the host key is looked up under. The stream is shut on any failure.
pub async fn connect_over(
    tcp: TcpStream,
    target: &SshTarget,
    opts: &SshOptions,
) -> Result<(Transport, SessionInfo)> {
    let kill = KillSwitch::noop();
    kill.push_socket(&tcp)?;
    let guard = KillOnDrop(Some(kill));
    let prepared = Prepared::new(target, opts).await?;
    drop(guard.disarm());
    establish(prepared, tcp, target, opts).await
}

/// What is loaded and checked before the network is touched.
struct Prepared {
    policy: HostKeyPolicy,
    key: Arc<PrivateKey>,
    config: Arc<client::Config>,
}

impl Prepared {
    async fn new(target: &SshTarget, opts: &SshOptions) -> Result<Self> {
        opts.validate()?;
        let policy = target.policy().await?;
        let key = Arc::new(target.client_key.load().await?);
        let config = Arc::new(opts.russh_config(&policy)?);
        Ok(Self {
            policy,
            key,
            config,
        })
    }
}

async fn establish(
    prepared: Prepared,
    tcp: TcpStream,
    target: &SshTarget,
    opts: &SshOptions,
) -> Result<(Transport, SessionInfo)> {
    let Prepared {
        policy,
        key,
        config,
    } = prepared;
    let who = target.describe();
    let _ = tcp.set_nodelay(true);
    let kill = KillSwitch::noop();
    // NB: the socket's shutdown is registered before russh owns the stream, and runs first.
    kill.push_socket(&tcp)?;
    let setup_guard = KillOnDrop(Some(kill.clone()));

    let shared = Arc::new(SessionShared::default());
    let handler = Verifier {
        policy,
        shared: shared.clone(),
        keepalive: (opts.keepalive_interval, opts.keepalive_max),
    };
    let establish = async {
        let mut handle = client::connect_stream(config, tcp, handler)
            .await
            .map_err(|e| classify_handshake(e, target))?;
        authenticate(&mut handle, target, key, &who).await?;
        let channel = handle
            .channel_open_direct_streamlocal(target.socket_path.clone())
            .await
            .map_err(|e| classify_channel(&e, target))?;
        Ok::<_, Error>((handle, channel))
    };
    let (handle, channel) = tokio::time::timeout(opts.handshake_timeout, establish)
        .await
        .map_err(|_| {
            Error::setup(
                format!(
                    "SSH handshake with {who} did not complete within {:?}",
                    opts.handshake_timeout
                ),
                false,
            )
        })??;

    // NB: the handle must live as long as the channel (dropping it ends the session); the
    // kill switch owns it and drops it after the socket is shut.
    let handle_slot: Handle<Verifier> = handle;
    kill.push(move || drop(handle_slot));
    drop(setup_guard.disarm());

    let info = shared.info();
    let peer = format!("ssh:{who}{}", target.socket_path);
    tracing::debug!(%peer, cipher = %info.cipher, kex = %info.kex, host_key = %info.host_key_algorithm, "SSH channel open");
    // NB: split, not `into_stream`: the write half takes whole packets as shared buffers.
    let (read_half, write_half) = channel.split();
    let last = Arc::new(KillOnLastDrop(kill.clone()));
    let reader = SshReader {
        data: channel_data(read_half),
        pending: Bytes::new(),
        shared: shared.clone(),
        _kill: last.clone(),
    };
    let sink = SshSink {
        half: write_half,
        shared,
        kill: last,
    };
    Ok((Transport::with_sink(reader, sink, kill, peer), info))
}

async fn authenticate(
    handle: &mut Handle<Verifier>,
    target: &SshTarget,
    key: Arc<PrivateKey>,
    who: &str,
) -> Result<()> {
    let algorithm = key.algorithm();
    let hash = if algorithm.clone().is_rsa() {
        match handle.best_supported_rsa_hash().await {
            Ok(Some(Some(h))) => Some(h),
            Ok(Some(None)) => {
                return Err(Error::setup(
                    format!(
                        "sshd at {who} accepts only SHA-1 (ssh-rsa) signatures for RSA keys; \
                         refusing to authenticate with SHA-1"
                    ),
                    true,
                ));
            }
            // NB: no server-sig-algs extension: every OpenSSH since 7.2 sends it; SHA-256 is
            // what such servers most likely accept.
            Ok(None) => Some(HashAlg::Sha256),
            Err(e) => {
                return Err(Error::setup(
                    format!("SSH session with {who} failed during authentication: {e}"),
                    false,
                ));
            }
        }
    } else {
        None
    };
    let fp = key.public_key().fingerprint(HashAlg::Sha256);
    let result = handle
        .authenticate_publickey(target.user.clone(), PrivateKeyWithHashAlg::new(key, hash))
        .await
        .map_err(|e| {
            Error::setup(
                format!("SSH session with {who} failed during authentication: {e}"),
                false,
            )
        })?;
    match result {
        AuthResult::Success => Ok(()),
        AuthResult::Failure {
            remaining_methods,
            partial_success,
        } => Err(Error::setup(
            format!(
                "SSH authentication failed for {who}: the server refused the {} key {fp} \
                 (partial success: {partial_success}; methods it still accepts: {:?})",
                algorithm.as_str(),
                &*remaining_methods
            ),
            true,
        )),
    }
}

fn classify_handshake(e: HandlerError, target: &SshTarget) -> Error {
    let who = target.describe();
    match e {
        HandlerError::HostKey(msg) => Error::setup(msg, true),
        HandlerError::Ssh(russh::Error::NoCommonAlgo { kind, ours, theirs }) => {
            let what = match kind {
                russh::AlgorithmKind::Key => format!(
                    "sshd at {who} offers none of the host-key algorithms pinned for {} \
                     (pinned: {ours:?}; server offers: {theirs:?}); the pinned key cannot be \
                     this server's",
                    target.known_hosts_name()
                ),
                other => format!(
                    "no common SSH {other:?} algorithm with {who} (ours: {ours:?}; theirs: \
                     {theirs:?})"
                ),
            };
            Error::setup(what, true)
        }
        HandlerError::Ssh(e) => {
            Error::setup(format!("SSH handshake with {who} failed: {e}"), false)
        }
    }
}

fn classify_channel(e: &russh::Error, target: &SshTarget) -> Error {
    let who = target.describe();
    let path = &target.socket_path;
    match e {
        russh::Error::ChannelOpenFailure(ChannelOpenFailure::AdministrativelyProhibited) => {
            Error::setup(
                format!(
                    "sshd at {who} refused a stream-local channel to {path} (administratively \
                     prohibited: is AllowStreamLocalForwarding enabled for this user?)"
                ),
                true,
            )
        }
        // NB: OpenSSH (checked with 9.2) answers "connect failed" both when the socket
        // cannot be reached and when stream-local forwarding is forbidden, so the message
        // names both causes. Transient: a restarting libvirtd is the common case.
        russh::Error::ChannelOpenFailure(ChannelOpenFailure::ConnectFailed) => Error::setup(
            format!(
                "sshd at {who} could not open a stream-local channel to the libvirt socket \
                 {path}: connect failed (is libvirtd running and the path right? does sshd \
                 allow it: AllowStreamLocalForwarding, DisableForwarding, restrict in \
                 authorized_keys?)"
            ),
            false,
        ),
        russh::Error::ChannelOpenFailure(f) => Error::setup(
            format!("sshd at {who} refused a stream-local channel to {path}: {f:?}"),
            false,
        ),
        other => Error::setup(
            format!("opening a channel to {path} through {who} failed: {other}"),
            false,
        ),
    }
}

/// Runs the kill switch if setup is abandoned (error, timeout, or the future dropped).
struct KillOnDrop(Option<KillSwitch>);

impl KillOnDrop {
    /// Setup succeeded: keep the connection.
    fn disarm(mut self) -> Option<KillSwitch> {
        self.0.take()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(k) = self.0.take() {
            k.kill();
        }
    }
}

/// What the session task tells the stream: negotiated names, and why it ended.
#[derive(Default)]
struct SessionShared {
    info: Mutex<SessionInfo>,
    ended: Mutex<Option<String>>,
}

impl SessionShared {
    fn info(&self) -> SessionInfo {
        match self.info.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn set_info(&self, f: impl FnOnce(&mut SessionInfo)) {
        let mut g = match self.info.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut g);
    }

    fn ended(&self) -> Option<String> {
        match self.ended.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn set_ended(&self, why: String) {
        let mut g = match self.ended.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        g.get_or_insert(why);
    }
}

#[derive(Debug)]
enum HandlerError {
    Ssh(russh::Error),
    HostKey(String),
}

impl From<russh::Error> for HandlerError {
    fn from(e: russh::Error) -> Self {
        Self::Ssh(e)
    }
}

/// The russh handler: verifies the host key against the policy and records session events.
struct Verifier {
    policy: HostKeyPolicy,
    shared: Arc<SessionShared>,
    keepalive: (Duration, u32),
}

impl Handler for Verifier {
    type Error = HandlerError;

    async fn check_server_key(
        &mut self,
        server_public_key: &PublicKeyOrCertificate,
    ) -> std::result::Result<bool, Self::Error> {
        match server_public_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => {
                self.policy.verify(key).map_err(HandlerError::HostKey)?;
                let fp = key.fingerprint(HashAlg::Sha256).to_string();
                self.shared.set_info(|i| i.host_key_fingerprint = fp);
                Ok(true)
            }
            PublicKeyOrCertificate::Certificate(_) => Err(HandlerError::HostKey(format!(
                "{} presented a host certificate; host certificates are not supported (pin \
                 its plain host key instead)",
                self.policy.host_description()
            ))),
        }
    }

    async fn kex_done(
        &mut self,
        _shared_secret: Option<&[u8]>,
        names: &russh::Names,
        _session: &mut client::Session,
    ) -> std::result::Result<(), Self::Error> {
        self.shared.set_info(|i| {
            i.kex = names.kex.as_ref().to_owned();
            i.host_key_algorithm = names.key.to_string();
            i.cipher = names.cipher.as_ref().to_owned();
            i.client_mac = names.client_mac.as_ref().to_owned();
            i.server_mac = names.server_mac.as_ref().to_owned();
        });
        Ok(())
    }

    async fn disconnected(
        &mut self,
        reason: DisconnectReason<Self::Error>,
    ) -> std::result::Result<(), Self::Error> {
        match reason {
            DisconnectReason::ReceivedDisconnect(info) => {
                self.shared.set_ended(format!(
                    "the server disconnected ({:?}: {})",
                    info.reason_code, info.message
                ));
                Ok(())
            }
            DisconnectReason::Error(e) => {
                let why = match &e {
                    HandlerError::Ssh(russh::Error::KeepaliveTimeout) => format!(
                        "SSH keepalive timeout: no answer to {} keepalives sent every {:?}",
                        self.keepalive.1, self.keepalive.0
                    ),
                    HandlerError::Ssh(russh::Error::InactivityTimeout) => {
                        "SSH inactivity timeout: no progress reading or writing".to_owned()
                    }
                    HandlerError::Ssh(other) => format!("SSH session failed: {other}"),
                    HandlerError::HostKey(m) => m.clone(),
                };
                self.shared.set_ended(why);
                Err(e)
            }
        }
    }
}

/// Runs the kill switch when the last half of the channel (reader or sink) is dropped.
struct KillOnLastDrop(KillSwitch);

impl Drop for KillOnLastDrop {
    fn drop(&mut self) {
        self.0.kill();
    }
}

/// Why the session ended, as the I/O error a channel operation reports.
fn session_error(shared: &SessionShared) -> Option<std::io::Error> {
    shared.ended().map(|why| {
        std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            format!("SSH session ended: {why}"),
        )
    })
}

type ChannelData = Pin<Box<dyn Stream<Item = Bytes> + Send>>;

/// The data messages of the channel, in order, until its end of file or close.
fn channel_data(half: ChannelReadHalf) -> ChannelData {
    Box::pin(
        futures_util::stream::unfold(half, |mut half| async move {
            loop {
                match half.wait().await {
                    Some(ChannelMsg::Data { data }) => return Some((data, half)),
                    Some(ChannelMsg::Eof) | None => return None,
                    // NB: nothing else on a direct-streamlocal channel carries the stream.
                    Some(_) => {}
                }
            }
        })
        .fuse(),
    )
}

/// The channel's inbound bytes. A read that hits the end of the channel because the SSH
/// session died reports why, as an error.
struct SshReader {
    data: ChannelData,
    pending: Bytes,
    shared: Arc<SessionShared>,
    _kill: Arc<KillOnLastDrop>,
}

impl AsyncRead for SshReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        while self.pending.is_empty() {
            match std::task::ready!(self.data.as_mut().poll_next(cx)) {
                Some(b) => self.pending = b,
                None => {
                    return Poll::Ready(match session_error(&self.shared) {
                        Some(e) => Err(e),
                        None => Ok(()),
                    });
                }
            }
        }
        let n = self.pending.len().min(buf.remaining());
        let chunk = self.pending.split_to(n);
        buf.put_slice(&chunk);
        Poll::Ready(Ok(()))
    }
}

/// The channel's outbound side: each packet is handed to the SSH session as the same
/// reference-counted buffer (`data_bytes`), cut into SSH packets without being copied first.
struct SshSink {
    half: ChannelWriteHalf<Msg>,
    shared: Arc<SessionShared>,
    kill: Arc<KillOnLastDrop>,
}

impl PacketSink for SshSink {
    fn send(&mut self, packet: Bytes) -> BoxFuture<'_, std::io::Result<()>> {
        Box::pin(async move {
            self.half.data_bytes(packet).await.map_err(|e| {
                session_error(&self.shared).unwrap_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::BrokenPipe,
                        format!("SSH channel closed: {e}"),
                    )
                })
            })
        })
    }

    fn flush(&mut self) -> BoxFuture<'_, std::io::Result<()>> {
        // NB: the session task writes out whatever it holds on every turn of its loop.
        Box::pin(std::future::ready(Ok(())))
    }

    fn into_async_write(self: Box<Self>) -> Box<dyn AsyncWrite + Send + Unpin> {
        Box::new(SshWriter {
            inner: Box::pin(self.half.make_writer()),
            shared: self.shared,
            _kill: self.kill,
        })
    }
}

/// The channel's outbound side as a byte writer (copies each SSH packet's worth).
struct SshWriter {
    inner: Pin<Box<dyn AsyncWrite + Send>>,
    shared: Arc<SessionShared>,
    _kill: Arc<KillOnLastDrop>,
}

impl AsyncWrite for SshWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.inner.as_mut().poll_write(cx, buf) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(session_error(&self.shared).unwrap_or(e))),
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.inner.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.inner.as_mut().poll_shutdown(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn err_of(o: SshOptions) -> Error {
        o.validate().unwrap_err()
    }

    // finding: L1
    #[test]
    fn zero_or_inconsistent_ssh_settings_are_errors_naming_the_field() {
        let e = err_of(SshOptions {
            keepalive_interval: Duration::ZERO,
            ..SshOptions::default()
        });
        assert!(e.is_permanent());
        assert!(e.to_string().contains("keepalive_interval"), "{e}");
        let e = err_of(SshOptions {
            inactivity_timeout: Duration::ZERO,
            ..SshOptions::default()
        });
        assert!(e.to_string().contains("inactivity_timeout"), "{e}");
        let e = err_of(SshOptions {
            keepalive_max: 0,
            ..SshOptions::default()
        });
        assert!(e.to_string().contains("keepalive_max"), "{e}");
        let e = err_of(SshOptions {
            inactivity_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(10),
            ..SshOptions::default()
        });
        assert!(e.to_string().contains("inactivity_timeout"), "{e}");
        for field in ["dial_timeout", "handshake_timeout"] {
            let mut o = SshOptions::default();
            match field {
                "dial_timeout" => o.dial_timeout = Duration::ZERO,
                _ => o.handshake_timeout = Duration::ZERO,
            }
            assert!(err_of(o).to_string().contains(field));
        }
        SshOptions::default().validate().unwrap();
    }

    #[test]
    fn ciphers_are_checked_by_name_and_unencrypted_ones_refused() {
        let ok = SshOptions {
            ciphers: vec![
                "aes128-gcm@openssh.com".into(),
                "aes256-gcm@openssh.com".into(),
                "chacha20-poly1305@openssh.com".into(),
            ],
            ..SshOptions::default()
        };
        ok.validate().unwrap();
        for bad in ["none", "clear", "rot13"] {
            let e = err_of(SshOptions {
                ciphers: vec![bad.into()],
                ..SshOptions::default()
            });
            assert!(e.to_string().contains("ciphers"), "{e}");
            assert!(e.to_string().contains("aes128-gcm@openssh.com"), "{e}");
        }
    }

    #[test]
    fn the_default_order_puts_aes_gcm_first_only_where_the_cpu_runs_it_in_hardware() {
        let order = default_ciphers();
        assert_eq!(order.len(), 3);
        let aes_first = order.first() == Some(&"aes128-gcm@openssh.com");
        assert_eq!(aes_first, hardware_aes_gcm(), "{order:?}");
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            aes_first,
            std::arch::is_x86_feature_detected!("aes")
                && std::arch::is_x86_feature_detected!("pclmulqdq")
        );
        for o in [DEFAULT_CIPHERS, CHACHA_FIRST_CIPHERS] {
            let opts = SshOptions {
                ciphers: o.iter().map(|c| (*c).to_owned()).collect(),
                ..SshOptions::default()
            };
            opts.validate().unwrap();
        }
    }

    #[test]
    fn the_keepalive_budget_counts_the_interval_that_detects_the_last_miss() {
        let o = SshOptions {
            keepalive_interval: Duration::from_secs(2),
            keepalive_max: 3,
            ..SshOptions::default()
        };
        assert_eq!(o.keepalive_budget(), Duration::from_secs(8));
    }

    #[test]
    fn debug_output_never_shows_key_material() {
        let k = ClientKey::from_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----secret".to_vec())
            .with_passphrase("hunter2");
        let s = format!("{k:?}");
        assert!(!s.contains("secret") && !s.contains("hunter2"), "{s}");
    }
}
