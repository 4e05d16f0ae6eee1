//! A real OpenSSH `sshd` (Debian's openssh-server) on 127.0.0.1, with freshly generated host
//! keys (ed25519 and rsa), client keys (ed25519, ecdsa, rsa) in its `AuthorizedKeysFile`,
//! root login by key, stream-local forwarding allowed, and a `known_hosts` file with
//! `[127.0.0.1]:PORT` entries for both host keys.
//!
//! ```ignore
//! let sshd = support::sshd::Sshd::start();          // blocking: call before spawning work
//! let t = transport::ssh::connect(&sshd.target(), &SshOptions::default()).await?;
//! ```
//!
//! [`Sshd::start`] blocks (ssh-keygen, then waiting for the port to accept); it panics with
//! sshd's log when sshd cannot start. Dropping an [`Sshd`] kills the daemon and removes its
//! temporary directory (keys, config, log). Tests run as root (sshd needs it).

use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use libvirt_remote::transport::ssh::{ClientKey, HostKeySource, SshTarget};

/// The sshd binary.
pub const SSHD: &str = "/usr/sbin/sshd";
/// How long sshd may take to accept connections after it is spawned.
// NB: it starts in ~20 ms here; 10 s covers a loaded 2-core box.
pub const START_BUDGET: Duration = Duration::from_secs(10);
/// How often readiness is polled while starting.
const START_POLL: Duration = Duration::from_millis(20);
/// Start attempts (a port picked as free can be taken by a parallel test before sshd binds).
const START_ATTEMPTS: usize = 5;

/// A key type ssh-keygen can generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// `ssh-ed25519`.
    Ed25519,
    /// `ecdsa-sha2-nistp256`.
    Ecdsa,
    /// `ssh-rsa`, 2048 bits (small to keep start-up quick).
    Rsa,
}

impl KeyKind {
    fn keygen_args(self) -> &'static [&'static str] {
        match self {
            Self::Ed25519 => &["-t", "ed25519"],
            Self::Ecdsa => &["-t", "ecdsa", "-b", "256"],
            Self::Rsa => &["-t", "rsa", "-b", "2048"],
        }
    }
}

/// A key pair written by ssh-keygen.
#[derive(Debug, Clone)]
pub struct GeneratedKey {
    /// The private key file (OpenSSH format).
    pub path: PathBuf,
    /// The public key as `type base64` (no comment).
    pub public: String,
}

impl GeneratedKey {
    /// The private key file's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        fs::read(&self.path).unwrap()
    }
}

/// Generates a key pair at `dir/name` with ssh-keygen (empty `passphrase`: unencrypted).
pub fn keygen(dir: &Path, name: &str, kind: KeyKind, passphrase: &str) -> GeneratedKey {
    let path = dir.join(name);
    let out = Command::new("ssh-keygen")
        .args(["-q", "-C", "", "-N", passphrase, "-f"])
        .arg(&path)
        .args(kind.keygen_args())
        .stdin(Stdio::null())
        .output()
        .expect("run ssh-keygen");
    assert!(
        out.status.success(),
        "ssh-keygen {kind:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let public = fs::read_to_string(path.with_extension("pub")).unwrap();
    let public = public
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    GeneratedKey { path, public }
}

/// Rewrites a known_hosts file with hashed host names, with OpenSSH's own `ssh-keygen -H`.
pub fn hash_known_hosts(path: &Path) {
    let out = Command::new("ssh-keygen")
        .arg("-H")
        .arg("-f")
        .arg(path)
        .output()
        .expect("run ssh-keygen -H");
    assert!(
        out.status.success(),
        "ssh-keygen -H failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The client keys sshd authorizes.
#[derive(Debug, Clone)]
pub struct ClientKeys {
    /// ed25519 (the default in [`Sshd::target`]).
    pub ed25519: GeneratedKey,
    /// ecdsa-sha2-nistp256.
    pub ecdsa: GeneratedKey,
    /// rsa 2048.
    pub rsa: GeneratedKey,
}

/// Options for [`Sshd::builder`].
#[derive(Debug, Clone)]
pub struct SshdBuilder {
    streamlocal: bool,
    extra: Vec<String>,
    netns: Option<(String, std::net::Ipv4Addr)>,
}

impl SshdBuilder {
    /// Whether `AllowStreamLocalForwarding` is on (default: yes).
    pub fn allow_streamlocal_forwarding(mut self, yes: bool) -> Self {
        self.streamlocal = yes;
        self
    }

    /// Appends a raw line to sshd_config.
    pub fn config_line(mut self, line: impl Into<String>) -> Self {
        self.extra.push(line.into());
        self
    }

    /// Runs sshd inside network namespace `netns` (it must exist), listening on `ip` (an
    /// address of that namespace the caller can reach) instead of 127.0.0.1.
    pub fn in_netns(mut self, netns: &str, ip: std::net::Ipv4Addr) -> Self {
        self.netns = Some((netns.to_owned(), ip));
        self
    }

    /// Generates keys, starts sshd and waits until it accepts connections.
    pub fn start(self) -> Sshd {
        let listen = self
            .netns
            .as_ref()
            .map_or(std::net::Ipv4Addr::LOCALHOST, |(_, ip)| *ip);
        fs::create_dir_all("/run/sshd").expect("create /run/sshd (sshd's privsep dir)");
        let dir = tempfile::Builder::new()
            .prefix("eptest-sshd-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        let host_ed25519 = keygen(d, "host_ed25519", KeyKind::Ed25519, "");
        let host_rsa = keygen(d, "host_rsa", KeyKind::Rsa, "");
        let client_keys = ClientKeys {
            ed25519: keygen(d, "client_ed25519", KeyKind::Ed25519, ""),
            ecdsa: keygen(d, "client_ecdsa", KeyKind::Ecdsa, ""),
            rsa: keygen(d, "client_rsa", KeyKind::Rsa, ""),
        };
        let authorized = d.join("authorized_keys");
        fs::write(
            &authorized,
            format!(
                "{}\n{}\n{}\n",
                client_keys.ed25519.public, client_keys.ecdsa.public, client_keys.rsa.public
            ),
        )
        .unwrap();
        let pid_file = d.join("sshd.pid");
        let log_path = d.join("sshd.log");
        let config = d.join("sshd_config");
        let mut text = format!(
            "ListenAddress {listen}\n\
             HostKey {}\n\
             HostKey {}\n\
             AuthorizedKeysFile {}\n\
             PidFile {}\n\
             PermitRootLogin yes\n\
             PubkeyAuthentication yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             UsePAM no\n\
             StrictModes no\n\
             AllowStreamLocalForwarding {}\n\
             PrintMotd no\n\
             MaxStartups 100\n\
             LogLevel VERBOSE\n",
            host_ed25519.path.display(),
            host_rsa.path.display(),
            authorized.display(),
            pid_file.display(),
            if self.streamlocal { "yes" } else { "no" },
        );
        for l in &self.extra {
            text.push_str(l);
            text.push('\n');
        }
        fs::write(&config, text).unwrap();

        let mut last_log = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            let log = fs::File::create(&log_path).unwrap();
            let _ = fs::remove_file(&pid_file);
            // NB: nsenter execs sshd in place (no fork), so the pid file names the child.
            let mut cmd = match &self.netns {
                Some((ns, _)) => {
                    let mut c = Command::new("nsenter");
                    c.arg(format!("--net=/run/netns/{ns}")).arg(SSHD);
                    c
                }
                None => Command::new(SSHD),
            };
            let mut child = cmd
                .args(["-D", "-e", "-f"])
                .arg(&config)
                .args(["-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn /usr/sbin/sshd");
            match wait_ready(&mut child, listen, port, &pid_file) {
                Ok(()) => {
                    let addr = SocketAddr::from((listen, port));
                    let known_hosts_path = d.join("known_hosts");
                    fs::write(
                        &known_hosts_path,
                        format!(
                            "[{listen}]:{port} {}\n[{listen}]:{port} {}\n",
                            host_ed25519.public, host_rsa.public
                        ),
                    )
                    .unwrap();
                    return Sshd {
                        port,
                        addr,
                        known_hosts_path,
                        client_key_path: client_keys.ed25519.path.clone(),
                        client_keys,
                        host_pubkeys: vec![host_ed25519.public.clone(), host_rsa.public.clone()],
                        host_ed25519: host_ed25519.public,
                        host_rsa: host_rsa.public,
                        log_path,
                        child,
                        dir,
                    };
                }
                Err(()) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    last_log = fs::read_to_string(&log_path).unwrap_or_default();
                }
            }
        }
        panic!("sshd did not start after {START_ATTEMPTS} attempts; last log:\n{last_log}");
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Ready when sshd wrote its pid file (it does so after binding) and the port accepts.
fn wait_ready(
    child: &mut Child,
    ip: std::net::Ipv4Addr,
    port: u16,
    pid_file: &Path,
) -> Result<(), ()> {
    let deadline = Instant::now() + START_BUDGET;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return Err(());
        }
        let ours = fs::read_to_string(pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            == Some(child.id());
        if ours
            && TcpStream::connect_timeout(&SocketAddr::from((ip, port)), START_POLL * 50).is_ok()
        {
            return Ok(());
        }
        std::thread::sleep(START_POLL);
    }
    Err(())
}

/// A running sshd. Killed, and its directory removed, on Drop.
#[derive(Debug)]
pub struct Sshd {
    /// The port it listens on (127.0.0.1, or the address given to `in_netns`).
    pub port: u16,
    /// `127.0.0.1:port` (or `IP:port` of `in_netns`).
    pub addr: SocketAddr,
    /// known_hosts with `[127.0.0.1]:PORT` lines for the ed25519 and rsa host keys.
    pub known_hosts_path: PathBuf,
    /// The ed25519 client key (authorized for root).
    pub client_key_path: PathBuf,
    /// Every authorized client key.
    pub client_keys: ClientKeys,
    /// The host public keys as `type base64`: ed25519, then rsa.
    pub host_pubkeys: Vec<String>,
    /// The ed25519 host public key.
    pub host_ed25519: String,
    /// The rsa host public key.
    pub host_rsa: String,
    log_path: PathBuf,
    child: Child,
    dir: tempfile::TempDir,
}

impl Sshd {
    /// Starts sshd with the defaults (stream-local forwarding allowed).
    pub fn start() -> Self {
        Self::builder().start()
    }

    /// Options for a customised sshd.
    pub fn builder() -> SshdBuilder {
        SshdBuilder {
            streamlocal: true,
            extra: Vec::new(),
            netns: None,
        }
    }

    /// The temporary directory holding keys, config and log (removed on Drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The known_hosts name of this server: `[127.0.0.1]:PORT` (`[IP]:PORT` in a namespace).
    pub fn known_hosts_name(&self) -> String {
        format!("[{}]:{}", self.addr.ip(), self.port)
    }

    /// Writes a file in the temporary directory and returns its path.
    pub fn write_file(&self, name: &str, contents: &str) -> PathBuf {
        let p = self.dir().join(name);
        fs::write(&p, contents).unwrap();
        p
    }

    /// Adds a public key to the AuthorizedKeysFile (sshd reads it at each login).
    pub fn authorize(&self, key: &GeneratedKey) {
        use std::io::Write;
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(self.dir().join("authorized_keys"))
            .unwrap();
        writeln!(f, "{}", key.public).unwrap();
    }

    /// A target for root on this sshd, trusting [`Self::known_hosts_path`] and using the
    /// ed25519 client key from its file, reaching the system libvirtd socket.
    pub fn target(&self) -> SshTarget {
        SshTarget::new(
            self.addr.ip().to_string(),
            "root",
            HostKeySource::KnownHostsFile(self.known_hosts_path.clone()),
            ClientKey::from_file(&self.client_key_path),
        )
        .with_port(self.port)
    }

    /// What sshd logged so far (LogLevel VERBOSE).
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
