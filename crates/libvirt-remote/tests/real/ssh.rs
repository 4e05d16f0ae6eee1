//! The SSH dialer: the same test bodies through a real OpenSSH `sshd` on 127.0.0.1 (started
//! per test by `support::sshd`, with generated host keys and a strict known_hosts), opening a
//! `direct-streamlocal` channel to the system libvirtd socket.

use libvirt_remote::transport::Transport;
use libvirt_remote::transport::ssh::{self, SshOptions};
use libvirt_remote::{Client, OpenOptions};

use super::Dialer;
use super::tap::{Tap, TapReader};
use crate::support::sshd::Sshd;

/// A running sshd and how to reach libvirtd through it. The sshd dies on drop.
pub struct Ssh {
    sshd: Sshd,
}

impl Ssh {
    /// Starts a fresh sshd (blocking for the few ms it takes; panics with its log on failure).
    pub fn start() -> Self {
        Self {
            sshd: Sshd::start(),
        }
    }

    fn failed(&self, what: &str, e: impl std::fmt::Display) -> ! {
        panic!(
            "{what} through sshd on {} failed: {e}. These tests need the real libvirtd \
             behind a real sshd; they fail rather than skip.\nsshd log:\n{}",
            self.sshd.addr,
            self.sshd.log()
        )
    }
}

impl Dialer for Ssh {
    fn describe(&self) -> String {
        let t = self.sshd.target();
        format!("ssh:{}@{}:{}{}", t.user, t.host, t.port, t.socket_path)
    }

    async fn open(&self) -> Client {
        let t = ssh::connect(&self.sshd.target(), &SshOptions::default())
            .await
            .unwrap_or_else(|e| self.failed("SSH connect", e));
        Client::open(t, OpenOptions::default())
            .await
            .unwrap_or_else(|e| self.failed("libvirt open", e))
    }

    async fn open_tapped(&self) -> (Client, Tap) {
        let t = ssh::connect(&self.sshd.target(), &SshOptions::default())
            .await
            .unwrap_or_else(|e| self.failed("SSH connect", e));
        // The SSH channel's plaintext side: the tap sees libvirt's packets as the client does.
        let (r, w, kill, peer) = t.into_parts();
        let tap = Tap::default();
        let t = Transport::new(
            TapReader::new(r, tap.clone()),
            w,
            kill,
            format!("{peer} (tapped)"),
        );
        let c = Client::open(t, OpenOptions::default())
            .await
            .unwrap_or_else(|e| self.failed("libvirt open", e));
        (c, tap)
    }
}
