//! The SSH transport against a REAL OpenSSH sshd on 127.0.0.1 (started per test by
//! `support::sshd`) and, where a libvirt connection is opened, the REAL libvirtd behind it.
//! Frozen-peer scenarios put `support::relay` between the client and sshd.
//!
//! Needs: root, /usr/sbin/sshd and ssh-keygen (openssh-server), a running libvirtd on
//! /run/libvirt/libvirt-sock. Run: `cargo test -p libvirt-remote --test ssh_transport`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod support;

use std::time::{Duration, Instant};

use libvirt_remote::transport::ssh::{self, ClientKey, HostKeySource, SshOptions, SshTarget};
use libvirt_remote::transport::{self, Transport};
use libvirt_remote::{Client, ConnectionConfig, DeathReason, Error, OpenOptions};
use russh::keys::PublicKey;
use russh::keys::ssh_key::HashAlg;
use support::relay::{ESTABLISHED, Relay, RelayOptions};
use support::sshd::{KeyKind, Sshd, hash_known_hosts, keygen};

/// Slack on top of a configured budget before a timing assertion fails.
// NB: the box is a loaded 2-core machine running tests in parallel; 3 s is generous next to
// the 1 s keepalive ticks used below while still far below any fallback (120 s).
const SLACK: Duration = Duration::from_secs(3);

/// The bound the findings set for killing a blocked connection and failing its callers.
const PROMPTLY: Duration = Duration::from_secs(1);

/// SO_SNDBUF of the client's socket in the blocked-write test (the kernel doubles it).
const CLIENT_SNDBUF: u32 = 16 * 1024;

/// How long a test waits for the kernel to show a state (buffers full, socket shut).
const OBSERVE_BUDGET: Duration = Duration::from_secs(20);
/// How often that state is polled.
const OBSERVE_POLL: Duration = Duration::from_millis(100);

fn options() -> SshOptions {
    SshOptions {
        handshake_timeout: Duration::from_secs(15),
        ..SshOptions::default()
    }
}

/// A target reaching `sshd` through `relay`, with a known_hosts naming the relay's port.
fn through(sshd: &Sshd, relay: &Relay) -> SshTarget {
    let kh = sshd.write_file(
        &format!("known_hosts_relay_{}", relay.port()),
        &format!(
            "[127.0.0.1]:{p} {}\n[127.0.0.1]:{p} {}\n",
            sshd.host_ed25519,
            sshd.host_rsa,
            p = relay.port()
        ),
    );
    SshTarget {
        host_keys: HostKeySource::KnownHostsFile(kh),
        ..sshd.target().with_port(relay.port())
    }
}

fn with_known_hosts(sshd: &Sshd, name: &str, text: &str) -> SshTarget {
    SshTarget {
        host_keys: HostKeySource::KnownHostsFile(sshd.write_file(name, text)),
        ..sshd.target()
    }
}

async fn connect(
    sshd: &Sshd,
    target: &SshTarget,
    opts: &SshOptions,
) -> (Transport, ssh::SessionInfo) {
    ssh::connect_with_info(target, opts)
        .await
        .unwrap_or_else(|e| panic!("SSH connect failed: {e}\nsshd log:\n{}", sshd.log()))
}

async fn open(t: Transport, connection: ConnectionConfig) -> Client {
    Client::open(
        t,
        OpenOptions {
            connection,
            ..OpenOptions::default()
        },
    )
    .await
    .expect("libvirt handshake through SSH")
}

fn refused(r: Result<Transport, Error>) -> Error {
    match r {
        Ok(t) => panic!("expected the connection to be refused, got {t:?}"),
        Err(e) => e,
    }
}

fn fingerprint(openssh: &str) -> String {
    PublicKey::from_openssh(openssh)
        .unwrap()
        .fingerprint(HashAlg::Sha256)
        .to_string()
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + OBSERVE_BUDGET;
    while !cond() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        tokio::time::sleep(OBSERVE_POLL).await;
    }
}

#[tokio::test]
async fn a_client_opened_through_ssh_talks_to_the_real_libvirtd() {
    let sshd = Sshd::start();
    let (t, info) = connect(&sshd, &sshd.target(), &options()).await;
    println!("negotiated by default: {info:?}");
    assert!(t.peer().contains("root@127.0.0.1"), "{}", t.peer());
    assert_eq!(info.host_key_algorithm, "ssh-ed25519");
    // NB: the upload benchmark depends on this default (twice chacha20's throughput here).
    assert_eq!(info.cipher, "aes128-gcm@openssh.com");
    assert_eq!(info.host_key_fingerprint, fingerprint(&sshd.host_ed25519));
    let client = open(t, ConnectionConfig::default()).await;

    let local =
        transport::unix::connect(transport::DEFAULT_SOCKET, transport::DEFAULT_DIAL_TIMEOUT)
            .await
            .expect("libvirtd must run on this machine (bash .ci/setup-host)");
    let local = open(local, ConnectionConfig::default()).await;

    let hostname = client.hostname().await.unwrap();
    assert!(!hostname.is_empty());
    assert_eq!(hostname, local.hostname().await.unwrap());
    let version = client.lib_version().await.unwrap();
    assert_eq!(version, local.lib_version().await.unwrap());
    assert!(version >= 11_000_000, "libvirt {version}");
    client
        .close_by(tokio::time::Instant::now() + Duration::from_secs(2))
        .await;
    local.close();
}

#[tokio::test]
async fn each_preferred_cipher_is_the_one_negotiated_and_carries_libvirt_traffic() {
    let sshd = Sshd::start();
    for cipher in [
        "aes128-gcm@openssh.com",
        "aes256-gcm@openssh.com",
        "chacha20-poly1305@openssh.com",
        "aes256-ctr",
    ] {
        let opts = SshOptions {
            ciphers: vec![cipher.into()],
            ..options()
        };
        let (t, info) = connect(&sshd, &sshd.target(), &opts).await;
        assert_eq!(info.cipher, cipher, "{info:?}");
        let client = open(t, ConnectionConfig::default()).await;
        assert!(!client.hostname().await.unwrap().is_empty());
        client.close();
    }
}

// finding: APX-4
#[tokio::test]
async fn an_entry_for_the_bare_address_does_not_vouch_for_another_port() {
    let sshd = Sshd::start();
    let target = with_known_hosts(
        &sshd,
        "known_hosts_bare",
        &format!(
            "127.0.0.1 {}\n127.0.0.1 {}\n",
            sshd.host_ed25519, sshd.host_rsa
        ),
    );
    let e = refused(ssh::connect(&target, &options()).await);
    let msg = e.to_string();
    assert!(e.is_permanent(), "{msg}");
    assert!(!e.is_connection(), "{msg}");
    assert!(
        msg.contains(&format!("`[127.0.0.1]:{}`", sshd.port)),
        "{msg}"
    );
}

// finding: APX-4
#[tokio::test]
async fn a_port_qualified_entry_vouches_for_its_port() {
    let sshd = Sshd::start();
    let kh = std::fs::read_to_string(&sshd.known_hosts_path).unwrap();
    assert!(kh.contains(&format!("[127.0.0.1]:{} ", sshd.port)), "{kh}");
    let (t, _) = connect(&sshd, &sshd.target(), &options()).await;
    let client = open(t, ConnectionConfig::default()).await;
    assert!(!client.hostname().await.unwrap().is_empty());
    client.close();
}

// finding: APX-4
#[tokio::test]
async fn a_hashed_entry_written_by_ssh_keygen_vouches_for_its_port() {
    let sshd = Sshd::start();
    let path = sshd.write_file(
        "known_hosts_hashed",
        &std::fs::read_to_string(&sshd.known_hosts_path).unwrap(),
    );
    hash_known_hosts(&path);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.contains("127.0.0.1") && text.starts_with("|1|"),
        "{text}"
    );
    let target = SshTarget {
        host_keys: HostKeySource::KnownHostsFile(path),
        ..sshd.target()
    };
    let (t, _) = connect(&sshd, &target, &options()).await;
    let client = open(t, ConnectionConfig::default()).await;
    assert!(!client.hostname().await.unwrap().is_empty());
    client.close();
}

// finding: L3
#[tokio::test]
async fn a_host_pinned_only_by_its_rsa_key_connects_although_the_server_prefers_ed25519() {
    let sshd = Sshd::start();
    let by_file = with_known_hosts(
        &sshd,
        "known_hosts_rsa_only",
        &format!("[127.0.0.1]:{} {}\n", sshd.port, sshd.host_rsa),
    );
    let by_pin = SshTarget {
        host_keys: HostKeySource::Pinned(vec![sshd.host_rsa.clone()]),
        ..sshd.target()
    };
    for target in [by_file, by_pin] {
        let (t, info) = connect(&sshd, &target, &options()).await;
        assert!(info.host_key_algorithm.starts_with("rsa-sha2-"), "{info:?}");
        assert_eq!(info.host_key_fingerprint, fingerprint(&sshd.host_rsa));
        let client = open(t, ConnectionConfig::default()).await;
        assert!(!client.hostname().await.unwrap().is_empty());
        client.close();
    }
}

// finding: L2
#[tokio::test]
async fn a_revoked_host_key_is_a_permanent_error_naming_the_line_and_is_not_retried() {
    let sshd = Sshd::start();
    let relay = Relay::start(sshd.addr).await;
    let name = format!("[127.0.0.1]:{}", relay.port());
    let target = SshTarget {
        host_keys: HostKeySource::KnownHostsFile(sshd.write_file(
            "known_hosts_revoked",
            &format!(
                "# the ed25519 key is pinned, then revoked\n{name} {ed}\n@revoked {name} {ed}\n",
                ed = sshd.host_ed25519
            ),
        )),
        ..through(&sshd, &relay)
    };
    let e = refused(ssh::connect(&target, &options()).await);
    let msg = e.to_string();
    assert!(e.is_permanent(), "{msg}");
    assert!(!e.is_connection(), "{msg}");
    assert!(msg.contains("REVOKED"), "{msg}");
    assert!(
        msg.contains(&format!("127.0.0.1:{}", relay.port())),
        "{msg}"
    );
    assert!(msg.contains("known_hosts_revoked line 3"), "{msg}");
    assert_eq!(relay.accepted(), 1, "one attempt, no retry");
}

// finding: L2
#[tokio::test]
async fn a_host_key_other_than_the_pinned_one_is_a_permanent_mismatch_naming_host_and_line() {
    let sshd = Sshd::start();
    let relay = Relay::start(sshd.addr).await;
    let impostor = keygen(sshd.dir(), "impostor", KeyKind::Ed25519, "");
    let target = SshTarget {
        host_keys: HostKeySource::KnownHostsFile(sshd.write_file(
            "known_hosts_wrong",
            &format!("\n[127.0.0.1]:{} {}\n", relay.port(), impostor.public),
        )),
        ..through(&sshd, &relay)
    };
    let e = refused(ssh::connect(&target, &options()).await);
    let msg = e.to_string();
    assert!(e.is_permanent(), "{msg}");
    assert!(!e.is_connection(), "{msg}");
    assert!(msg.contains("mismatch"), "{msg}");
    assert!(
        msg.contains(&format!("127.0.0.1:{}", relay.port())),
        "{msg}"
    );
    assert!(msg.contains("known_hosts_wrong line 2"), "{msg}");
    assert!(msg.contains(&fingerprint(&sshd.host_ed25519)), "{msg}");
    assert_eq!(relay.accepted(), 1, "one attempt, no retry");
}

#[tokio::test]
async fn a_missing_known_hosts_file_is_a_permanent_error() {
    let sshd = Sshd::start();
    let target = SshTarget {
        host_keys: HostKeySource::KnownHostsFile(sshd.dir().join("does-not-exist")),
        ..sshd.target()
    };
    let e = refused(ssh::connect(&target, &options()).await);
    assert!(e.is_permanent(), "{e}");
    assert!(e.to_string().contains("does-not-exist"), "{e}");
}

// finding: L1
#[tokio::test]
async fn zero_ssh_keepalive_or_inactivity_settings_are_refused_without_a_panic() {
    let sshd = Sshd::start();
    let relay = Relay::start(sshd.addr).await;
    let target = through(&sshd, &relay);
    let cases = [
        (
            "keepalive_interval",
            SshOptions {
                keepalive_interval: Duration::ZERO,
                ..options()
            },
        ),
        (
            "inactivity_timeout",
            SshOptions {
                inactivity_timeout: Duration::ZERO,
                ..options()
            },
        ),
        (
            "keepalive_max",
            SshOptions {
                keepalive_max: 0,
                ..options()
            },
        ),
    ];
    for (field, opts) in cases {
        let e = refused(ssh::connect(&target, &opts).await);
        assert!(e.is_permanent(), "{e}");
        assert!(e.to_string().contains(field), "{field}: {e}");
    }
    assert_eq!(
        relay.accepted(),
        0,
        "invalid settings must fail before dialing"
    );
    // The same target with valid settings connects, so the refusals above were the settings'.
    let (t, _) = connect(&sshd, &target, &options()).await;
    drop(t);
}

#[tokio::test]
async fn client_keys_authenticate_from_files_and_from_bytes_for_ed25519_ecdsa_and_rsa() {
    let sshd = Sshd::start();
    let keys = sshd.client_keys.clone();
    for key in [&keys.ed25519, &keys.ecdsa, &keys.rsa] {
        for client_key in [
            ClientKey::from_file(&key.path),
            ClientKey::from_bytes(key.bytes()),
        ] {
            let target = SshTarget {
                client_key: client_key.clone(),
                ..sshd.target()
            };
            let (t, _) = connect(&sshd, &target, &options()).await;
            let client = open(t, ConnectionConfig::default()).await;
            assert!(
                !client.hostname().await.unwrap().is_empty(),
                "{client_key:?}"
            );
            client.close();
        }
    }
    // sshd logged each key type. (OpenSSH 9.2 refuses SHA-1 `ssh-rsa` signatures by default,
    // so the RSA login also shows that RSA signed with rsa-sha2-*.)
    let log = sshd.log();
    let accepted: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Accepted publickey for root from 127.0.0.1"))
        .collect();
    for kind in ["ED25519", "ECDSA", "RSA"] {
        let n = accepted
            .iter()
            .filter(|l| l.contains(&format!("ssh2: {kind} ")))
            .count();
        assert_eq!(n, 2, "{kind} logins (file + bytes):\n{log}");
    }
}

#[tokio::test]
async fn an_encrypted_client_key_works_with_its_passphrase_and_is_refused_without() {
    let sshd = Sshd::start();
    let key = keygen(
        sshd.dir(),
        "client_encrypted",
        KeyKind::Ed25519,
        "correct horse",
    );
    sshd.authorize(&key);
    let with = SshTarget {
        client_key: ClientKey::from_bytes(key.bytes()).with_passphrase("correct horse"),
        ..sshd.target()
    };
    let (t, _) = connect(&sshd, &with, &options()).await;
    drop(t);
    for bad in [
        ClientKey::from_bytes(key.bytes()),
        ClientKey::from_bytes(key.bytes()).with_passphrase("wrong"),
    ] {
        let target = SshTarget {
            client_key: bad,
            ..sshd.target()
        };
        let e = refused(ssh::connect(&target, &options()).await);
        assert!(e.is_permanent(), "{e}");
        assert!(e.to_string().contains("client key"), "{e}");
    }
}

#[tokio::test]
async fn an_unauthorized_client_key_is_a_permanent_error_naming_user_host_and_port() {
    let sshd = Sshd::start();
    let stranger = keygen(sshd.dir(), "stranger", KeyKind::Ed25519, "");
    let target = SshTarget {
        client_key: ClientKey::from_file(&stranger.path),
        ..sshd.target()
    };
    let e = refused(ssh::connect(&target, &options()).await);
    let msg = e.to_string();
    assert!(e.is_permanent(), "{msg}");
    assert!(msg.contains("authentication failed"), "{msg}");
    assert!(
        msg.contains(&format!("root@127.0.0.1:{}", sshd.port)),
        "{msg}"
    );
}

#[tokio::test]
async fn a_missing_libvirt_socket_is_a_transient_error_naming_the_path() {
    let sshd = Sshd::start();
    let path = "/run/eptest-no-such-libvirt-sock";
    let target = sshd.target().with_socket_path(path);
    let e = refused(ssh::connect(&target, &options()).await);
    let msg = e.to_string();
    assert!(!e.is_permanent(), "{msg}");
    assert!(e.is_connection(), "{msg}");
    assert!(msg.contains(path), "{msg}");
    assert!(msg.contains("connect failed"), "{msg}");
}

// NB: OpenSSH answers a forbidden stream-local channel exactly as an unreachable socket
// ("connect failed"), so the error can only name both causes; it stays transient.
#[tokio::test]
async fn an_sshd_forbidding_stream_local_forwarding_is_an_error_naming_the_setting() {
    let sshd = Sshd::builder().allow_streamlocal_forwarding(false).start();
    let e = refused(ssh::connect(&sshd.target(), &options()).await);
    let msg = e.to_string();
    assert!(msg.contains("AllowStreamLocalForwarding"), "{msg}");
    assert!(msg.contains(transport::DEFAULT_SOCKET), "{msg}");
    assert!(
        sshd.log().contains("refused streamlocal port forward"),
        "sshd did not refuse for the expected reason:\n{}",
        sshd.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_fails_within_the_handshake_deadline_and_its_socket_is_shut() {
    let sshd = Sshd::start();
    let relay = Relay::start(sshd.addr).await;
    relay.freeze();
    let opts = SshOptions {
        handshake_timeout: Duration::from_secs(1),
        ..options()
    };
    let start = Instant::now();
    let e = refused(ssh::connect(&through(&sshd, &relay), &opts).await);
    let took = start.elapsed();
    assert!(!e.is_permanent() && e.is_connection(), "{e}");
    assert!(e.to_string().contains("did not complete within"), "{e}");
    assert!(took < opts.handshake_timeout + SLACK, "took {took:?}");
    eventually("the abandoned TCP socket is shut", || {
        relay
            .client_sockets()
            .iter()
            .all(|s| s.state != ESTABLISHED)
    })
    .await;
}

// finding: M20
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_ssh_peer_is_declared_dead_within_the_ssh_keepalive_budget() {
    let sshd = Sshd::start();
    let relay = Relay::start(sshd.addr).await;
    let opts = SshOptions {
        keepalive_interval: Duration::from_secs(1),
        keepalive_max: 3,
        inactivity_timeout: Duration::from_secs(120),
        ..options()
    };
    let (t, _) = connect(&sshd, &through(&sshd, &relay), &opts).await;
    // NB: libvirt's own keepalive and call deadline are far longer, so only SSH's keepalive
    // can end this connection within the budget.
    let client = open(
        t,
        ConnectionConfig {
            keepalive_interval: Duration::from_secs(120),
            keepalive_count: 5,
            call_timeout: Duration::from_secs(300),
        },
    )
    .await;
    assert!(!client.hostname().await.unwrap().is_empty());

    relay.freeze();
    let start = Instant::now();
    let pending = tokio::spawn({
        let c = client.clone();
        async move { c.hostname().await }
    });
    let budget = opts.keepalive_budget() + SLACK;
    tokio::time::timeout(budget, client.connection().closed())
        .await
        .unwrap_or_else(|_| panic!("connection still alive {budget:?} after the peer froze"));
    println!("declared dead {:?} after the freeze", start.elapsed());

    let r = tokio::time::timeout(PROMPTLY, pending)
        .await
        .expect("the pending call did not fail with the connection")
        .unwrap();
    let e = r.expect_err("a call on a frozen peer cannot succeed");
    assert!(e.is_connection(), "{e}");
    match client.connection().death_reason() {
        Some(DeathReason::Io(why)) => assert!(why.contains("keepalive"), "{why}"),
        other => panic!("expected an SSH keepalive death, got {other:?}"),
    }
}

// finding: M20
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_default_settings_a_frozen_ssh_path_is_declared_dead_within_the_documented_budget()
{
    // The operator's own settings (libvirt keepalive 5 s × (5 + 1), SSH keepalive 10 s ×
    // (3 + 1), inactivity 120 s), a real sshd and the real libvirtd behind a relay that
    // freezes: the first of the budgets to run out is libvirt's, 30 s after the last packet
    // the daemon sent, which is at most the moment of the freeze.
    let sshd = Sshd::start();
    let relay = Relay::start(sshd.addr).await;
    let opts = SshOptions::default();
    let (t, _) = connect(&sshd, &through(&sshd, &relay), &opts).await;
    let cfg = ConnectionConfig::default();
    let client = open(t, cfg.clone()).await;
    assert!(!client.hostname().await.unwrap().is_empty());
    let documented = cfg.keepalive_budget();
    assert_eq!(documented, Duration::from_secs(30), "the documented budget");
    assert!(documented < opts.keepalive_budget());

    relay.freeze();
    let start = Instant::now();
    let budget = documented + SLACK;
    tokio::time::timeout(budget, client.connection().closed())
        .await
        .unwrap_or_else(|_| panic!("connection still alive {budget:?} after the path froze"));
    let took = start.elapsed();
    println!(
        "declared dead {took:?} after the freeze: {:?}",
        client.connection().death_reason()
    );
    assert!(
        matches!(
            client.connection().death_reason(),
            Some(DeathReason::KeepaliveTimeout { .. })
        ),
        "{:?}",
        client.connection().death_reason()
    );
}

// finding: H1
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_connection_whose_writes_are_blocked_on_a_frozen_ssh_peer_returns_at_once() {
    let sshd = Sshd::start();
    let relay = Relay::start_with(
        sshd.addr,
        RelayOptions {
            socket_buffer: Some(4096),
        },
    )
    .await;
    // NB: a small client send buffer too, so the SSH session's own TCP write blocks (the
    // SSH window alone, 2 MiB, would otherwise fit in the kernel's autotuned buffer).
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_send_buffer_size(CLIENT_SNDBUF).unwrap();
    let tcp = sock.connect(relay.addr).await.unwrap();
    let (t, _) = ssh::connect_over(tcp, &through(&sshd, &relay), &options())
        .await
        .unwrap_or_else(|e| panic!("SSH connect failed: {e}\nsshd log:\n{}", sshd.log()));
    let client = open(t, ConnectionConfig::default()).await;
    assert!(!client.hostname().await.unwrap().is_empty());

    relay.freeze();
    // 8 calls carrying 3 MiB each: far more than the SSH window (2 MiB) plus every kernel
    // buffer between here and the frozen relay, so the writers must block.
    let xml = "x".repeat(3 << 20);
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let c = client.clone();
            let xml = xml.clone();
            tokio::spawn(async move {
                let r = c.domain_define_xml(&xml, 0).await;
                (r, Instant::now())
            })
        })
        .collect();

    // Wait until the kernel holds unsent bytes toward the relay that no longer move: the send
    // buffer is full and the peer's window closed.
    let mut last = None;
    let mut stable = 0;
    eventually("the client's send queue fills and stops moving", || {
        let q = relay.client_sockets().first().map(|s| s.tx_queue);
        if q.is_some_and(|q| q > 0) && q == last {
            stable += 1;
        } else {
            stable = 0;
        }
        last = q;
        stable >= 5
    })
    .await;
    assert!(
        calls.iter().all(|c| !c.is_finished()),
        "a call finished on a frozen peer"
    );
    // The kernel holds far less than the SSH window (2 MiB) the session may send, so the
    // session's own TCP write is the one blocked, which is the case H1 is about.
    let queued = last.unwrap();
    assert!(
        queued < 1 << 20,
        "kernel send queue {queued} bytes: the SSH session's write is not blocked"
    );

    let start = Instant::now();
    client.connection().kill();
    let kill_took = start.elapsed();
    assert!(kill_took < PROMPTLY, "kill took {kill_took:?}");

    for call in calls {
        let (r, at) = tokio::time::timeout(PROMPTLY, call)
            .await
            .expect("a blocked call did not fail promptly after kill")
            .unwrap();
        let e = r.expect_err("a call on a killed connection cannot succeed");
        assert!(e.is_connection(), "{e}");
        assert!(at.duration_since(start) < PROMPTLY);
    }
    eventually("the TCP socket to the frozen peer is shut", || {
        relay
            .client_sockets()
            .iter()
            .all(|s| s.state != ESTABLISHED)
    })
    .await;
    println!("kill returned in {kill_took:?}");
}
