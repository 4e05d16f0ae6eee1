//! Renders the guest's cloud-init user-data (`#cloud-config`) for the proxy software from a
//! Proxy's [`ProxySettings`] and credentials: tinyproxy for `http`, dante (`danted`, `sockd`
//! on Alpine) for `socks5`.
//!
//! Guarantees:
//! - Never an open relay: rendering fails unless the settings allow at least one client CIDR
//!   or credentials are given; tinyproxy gets one `Allow` per CIDR (and `BasicAuth` with
//!   credentials), dante passes only those CIDRs and blocks everything else, requiring a
//!   username/password when credentials are given. `DisableViaHeader Yes` hides the proxy.
//! - Works on systemd and OpenRC images (finding L10): the start script uses `systemctl` when
//!   systemd runs, else `rc-update`/`rc-service`, and knows both images' service names.
//! - Client policy: no client CIDR of prefix 0 or shorter than the entry's minimum
//!   (`policy.minClientPrefixV4`/`V6`), and the whole list within the entry's span caps
//!   (`policy.maxClientSpanV4`/`V6`, [`crate::client_span`]: IPv4-mapped and -compatible
//!   IPv6 entries count, and are written, as IPv4; an IPv6 network holding those ranges
//!   admits every IPv4 client and is refused); with credentials, a password of at least
//!   `policy.minPasswordLength` characters, whether client CIDRs are set or not.
//! - Injection-safe: CIDRs are re-parsed, user names and passwords are restricted to
//!   characters that need no quoting in YAML, shell single quotes or the proxies' configs,
//!   and that tinyproxy's `BasicAuth` parser accepts (letters, digits, `-`, `.`, `_`).
//! - SOCKS5 users never are guest system accounts: reserved names are refused here, and the
//!   start script sets a password only on a user it has just created (`useradd` fails for
//!   an existing account, and the script then stops before `chpasswd`).
//! - Destination policy ([`GuestPolicy`]), enforced in the guest: nftables rules (table
//!   `inet egress_proxy`, applied before the proxy starts and again before every service
//!   start on systemd) reject the proxy user's new connections to denied networks and the
//!   host's addresses (the default gateway added at boot) unless the entry lifted them
//!   (`policy.allowedInternalCidrs`), and outside the allowed CIDRs and ports; DNS to the resolvers of `/etc/resolv.conf` stays open. tinyproxy enforces
//!   the domain allowlist (`Filter`, `FilterDefaultDeny`) and the ports for CONNECT
//!   (`ConnectPort`: the allowed ports, else 443, 80 and the operator's health targets'); dante blocks denied networks (also for names, which it resolves) and
//!   passes only allowed domains and CIDRs. If the rules cannot be applied, the proxy is not
//!   started (fail closed).
//! - The proxy package is installed by the start script only when its binary is missing (no
//!   cloud-init `packages:` key, which refreshes the package index even when nothing needs
//!   installing), so images with the proxy preinstalled boot offline.
//! - Configs are staged under `/etc/egress-proxy/` and installed by the start script after the
//!   package is installed, so a package's own default config never overwrites ours.
//!   Files holding credentials are mode 0600.
//!
//! The tinyproxy and dante renderers stay in this one file: they share the checks and the
//! start-script helpers. The firewall script lives in the `firewall` submodule, the tests in
//! `tests.rs`.

use std::fmt::Write as _;

use super::ProxyCredentials;
use crate::model::{ProxyProtocol, ProxySettings, parse_cidr};
use crate::proxy_policy::{GuestPolicy, Net, is_domain_pattern};

mod firewall;

use self::firewall::apply_firewall;
pub use self::firewall::firewall_script;

/// Where the staged files live in the guest.
pub const STAGE_DIR: &str = "/etc/egress-proxy";
/// Longest user name accepted.
// NB: Linux user names are at most 32 characters (useradd's default limit).
pub const MAX_USERNAME: usize = 32;
/// Longest password accepted.
// NB: long enough for any generated secret; bounds the rendered user-data.
pub const MAX_PASSWORD: usize = 128;
/// Punctuation allowed in passwords besides ASCII letters and digits.
// NB: tinyproxy 1.11 parses `BasicAuth` arguments as `[-a-z0-9._]+` (case-insensitive) and
// refuses to start on anything else (checked with the real binary in
// tests/proxy_policy_real.rs); these three also need no quoting in YAML, shell single
// quotes, chpasswd or dante's config.
pub const PASSWORD_PUNCT: &str = "-._";
/// User names a SOCKS5 credential may not take: accounts guest images ship.
// NB: the start script also refuses any existing account; this list makes the common
// cases a clear spec error instead of a proxy that never authenticates.
pub const RESERVED_USERNAMES: &[&str] = &[
    "root",
    "daemon",
    "bin",
    "sys",
    "sync",
    "games",
    "man",
    "lp",
    "mail",
    "news",
    "uucp",
    "proxy",
    "www-data",
    "backup",
    "list",
    "irc",
    "gnats",
    "nobody",
    "nogroup",
    "adm",
    "admin",
    "operator",
    "halt",
    "shutdown",
    "ftp",
    "sshd",
    "messagebus",
    "tinyproxy",
    "danted",
    "sockd",
    "debian",
    "ubuntu",
    "alpine",
    "fedora",
    "centos",
    "ec2-user",
    "cloud-user",
    "postfix",
    "ntp",
    "chrony",
    "polkitd",
    "dnsmasq",
    "syslog",
    "tss",
    "uuidd",
    "tcpdump",
    "landscape",
    "pollinate",
    "lxd",
    "guest",
    "squid",
    "systemd",
];
/// The guest user whose connections the firewall polices, by protocol: tinyproxy runs as
/// `tinyproxy` (its config says so) and dante's connections are made by its unprivileged
/// user (`nobody`, observed with `ss -tnpe` on dante 1.4).
fn proxy_user(protocol: ProxyProtocol) -> &'static str {
    match protocol {
        ProxyProtocol::Http => "tinyproxy",
        ProxyProtocol::Socks5 => "nobody",
    }
}

/// Why user-data could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserDataError {
    /// Neither CIDRs nor credentials: the proxy would be an open relay.
    #[error(
        "spec.proxy: set allowedClientCidrs or credentials: a proxy open to everyone is an open relay"
    )]
    OpenRelay,
    /// A CIDR that does not parse.
    #[error("spec.proxy.allowedClientCidrs[{index}]: {value:?} is not a CIDR")]
    BadCidr {
        /// Position in the list.
        index: usize,
        /// The value.
        value: String,
    },
    /// A client CIDR wider than the entry allows (`/0` never is allowed).
    #[error(
        "spec.proxy.allowedClientCidrs[{index}]: {value:?} is wider than /{min}, the widest \
         client network the provider entry allows (policy.minClientPrefixV4/V6)"
    )]
    WideCidr {
        /// Position in the list.
        index: usize,
        /// The value.
        value: String,
        /// The shortest prefix allowed for its family.
        min: u8,
    },
    /// A list of client networks admitting more than the entry's caps (see
    /// [`crate::client_span`]).
    #[error("{path}: {message}")]
    WideSpan {
        /// The field path.
        path: String,
        /// What the list admits and the cap.
        message: String,
    },
    /// A password shorter than the entry's minimum.
    #[error(
        "credentials password: use at least {min} characters (the provider entry's \
         policy.minPasswordLength)"
    )]
    ShortPassword {
        /// The minimum length.
        min: usize,
    },
    /// A destination domain that is not a pattern (`example.com` or `*.example.com`).
    #[error("allowedDestinations: {0:?} is not a domain pattern")]
    BadDomain(String),
    /// A SOCKS5 user name that names a guest system account.
    #[error("credentials username {0:?} names a guest system account; choose another name")]
    ReservedUsername(String),
    /// A user name with characters outside `[A-Za-z0-9._-]` or too long.
    #[error(
        "credentials username {0:?}: use 1-{MAX_USERNAME} characters of A-Z a-z 0-9 . _ - \
         starting with a letter"
    )]
    BadUsername(String),
    /// A password with unsupported characters or length (the value is never shown).
    #[error(
        "credentials password: use 1-{MAX_PASSWORD} characters of A-Z a-z 0-9 and \
         {PASSWORD_PUNCT}"
    )]
    BadPassword,
}

fn check_credentials(
    c: &ProxyCredentials,
    protocol: ProxyProtocol,
    min_password: Option<usize>,
) -> Result<(), UserDataError> {
    let u = &c.username;
    let ok_user = !u.is_empty()
        && u.len() <= MAX_USERNAME
        && u.starts_with(|ch: char| ch.is_ascii_alphabetic())
        && u.chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-'));
    if !ok_user {
        return Err(UserDataError::BadUsername(u.clone()));
    }
    let p = &c.password;
    let ok_pass = !p.is_empty()
        && p.len() <= MAX_PASSWORD
        && p.chars()
            .all(|ch| ch.is_ascii_alphanumeric() || PASSWORD_PUNCT.contains(ch));
    if !ok_pass {
        return Err(UserDataError::BadPassword);
    }
    if let Some(min) = min_password
        && p.chars().count() < min
    {
        return Err(UserDataError::ShortPassword { min });
    }
    let lower = u.to_ascii_lowercase();
    if protocol == ProxyProtocol::Socks5
        && (RESERVED_USERNAMES.contains(&lower.as_str()) || lower.starts_with("systemd-"))
    {
        return Err(UserDataError::ReservedUsername(u.clone()));
    }
    Ok(())
}

/// Renders the `#cloud-config` user-data for `settings` and `credentials` under `policy`
/// (the entry's policy joined with the Proxy's allowlist).
pub fn render(
    settings: &ProxySettings,
    credentials: Option<&ProxyCredentials>,
    policy: &GuestPolicy,
) -> Result<String, UserDataError> {
    // The client networks: each entry within the entry's minimum prefix, and all of them
    // together within its span caps (IPv4-mapped and -compatible forms counted, and
    // rendered, as IPv4).
    for (index, c) in settings.allowed_client_cidrs.iter().enumerate() {
        let (ip, len) = parse_cidr(c).ok_or_else(|| UserDataError::BadCidr {
            index,
            value: c.clone(),
        })?;
        let n = crate::client_span::normalised(&Net::new(ip, len));
        let min = if n.addr.is_ipv4() {
            policy.min_client_prefix_v4
        } else {
            policy.min_client_prefix_v6
        }
        .max(1);
        if n.len < min {
            return Err(UserDataError::WideCidr {
                index,
                value: c.clone(),
                min,
            });
        }
    }
    let cidrs: Vec<String> = crate::client_span::check(
        "spec.proxy.allowedClientCidrs",
        &settings.allowed_client_cidrs,
        policy.max_client_span_v4,
        policy.max_client_span_v6,
    )
    .map_err(|e| {
        let (path, message) = e.into_iter().next().unwrap_or_default();
        UserDataError::WideSpan { path, message }
    })?
    .iter()
    .map(ToString::to_string)
    .collect();
    if cidrs.is_empty() && credentials.is_none() {
        return Err(UserDataError::OpenRelay);
    }
    if let Some(d) = policy.domains.iter().find(|d| !is_domain_pattern(d)) {
        return Err(UserDataError::BadDomain(d.clone()));
    }
    if let Some(c) = credentials {
        // Whoever is inside the client networks may try the password too: the minimum
        // holds whenever credentials are set.
        check_credentials(c, settings.protocol, Some(policy.min_password_length))?;
    }
    let (mut files, script) = match settings.protocol {
        ProxyProtocol::Http => http(settings.port, &cidrs, credentials, policy),
        ProxyProtocol::Socks5 => socks5(settings.port, &cidrs, credentials, policy),
    };
    files.push(StagedFile {
        name: "firewall.sh",
        mode: "0700",
        content: firewall_script(policy, proxy_user(settings.protocol)),
    });
    let mut out = String::from("#cloud-config\n");
    // NB: no `packages:` key: cloud-init refreshes the package index whenever it is set, which
    // fails (after retries) on an image with the proxy preinstalled and no network; the start
    // script installs the package only when its binary is missing.
    // NB: a SOCKS5 user is a guest account (dante checks the system's passwords): never
    // let a password open an SSH session, which could forward past the guest's policy.
    out.push_str("ssh_pwauth: false\n");
    out.push_str("write_files:\n");
    let mut all = files;
    all.push(StagedFile {
        name: "start.sh",
        mode: "0700",
        content: script,
    });
    for f in &all {
        let _ = writeln!(out, "  - path: {STAGE_DIR}/{}", f.name);
        let _ = writeln!(out, "    permissions: '{}'", f.mode);
        out.push_str("    content: |\n");
        for line in f.content.lines() {
            let _ = writeln!(out, "      {line}");
        }
    }
    let _ = writeln!(out, "runcmd:\n  - [sh, {STAGE_DIR}/start.sh]");
    Ok(out)
}

struct StagedFile {
    name: &'static str,
    mode: &'static str,
    content: String,
}

/// The shell that installs `deb`/`apk` (Debian/Ubuntu or Alpine package name) only when
/// `present` (a shell test) fails, so images with the proxy preinstalled boot offline.
fn install_if_missing(out: &mut String, present: &str, deb: &str, apk: &str) {
    let _ = writeln!(
        out,
        "if ! {{ {present}; }} >/dev/null 2>&1; then\n  \
         if command -v apt-get >/dev/null 2>&1; then\n    \
         export DEBIAN_FRONTEND=noninteractive\n    \
         apt-get update && apt-get install -y --no-install-recommends {deb}\n  \
         elif command -v apk >/dev/null 2>&1; then\n    \
         apk add --no-cache {apk}\n  \
         elif command -v dnf >/dev/null 2>&1; then\n    \
         dnf install -y {deb}\n  \
         fi\n\
         fi"
    );
}

/// The shell that enables and (re)starts `services` (the first that exists) on systemd or
/// OpenRC (finding L10). On systemd a unit already enabled is not enabled again: `systemctl
/// enable` reloads systemd (and runs `update-rc.d` for a unit with an init script), about
/// 6 s of a first boot under TCG, for nothing.
fn start_service(out: &mut String, systemd: &str, openrc: &str) {
    let _ = writeln!(
        out,
        "if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then\n  \
         case \"$(systemctl is-enabled {systemd} 2>/dev/null)\" in\n    \
         enabled) ;;\n    \
         *) systemctl enable {systemd} ;;\n  \
         esac\n  \
         systemctl restart {systemd}\n\
         elif command -v rc-service >/dev/null 2>&1; then\n  \
         rc-update add {openrc} default\n  rc-service {openrc} restart\n\
         fi"
    );
}

/// The tinyproxy filter regex (ERE) of a domain pattern (validated: `[a-z0-9.-]` and `*.`).
fn filter_regex(pattern: &str) -> String {
    match pattern.strip_prefix("*.") {
        Some(suffix) => format!("^.+\\.{}$", suffix.replace('.', "\\.")),
        None => format!("^{}$", pattern.replace('.', "\\.")),
    }
}

fn http(
    port: u16,
    cidrs: &[String],
    creds: Option<&ProxyCredentials>,
    policy: &GuestPolicy,
) -> (Vec<StagedFile>, String) {
    let mut conf = String::new();
    conf.push_str("User tinyproxy\nGroup tinyproxy\n");
    let _ = writeln!(conf, "Port {port}");
    conf.push_str("Timeout 600\nMaxClients 100\nDisableViaHeader Yes\n");
    for c in cidrs {
        let _ = writeln!(conf, "Allow {c}");
    }
    if let Some(c) = creds {
        let _ = writeln!(conf, "BasicAuth {} {}", c.username, c.password);
    }
    // Ports: tinyproxy checks them for CONNECT only; the firewall checks every request.
    // Without a list, CONNECT reaches HTTPS and HTTP (and the operator's health targets)
    // only: tinyproxy without any `ConnectPort` would tunnel to every port.
    let connect = if policy.ports.is_empty() {
        &policy.connect_default
    } else {
        &policy.ports
    };
    for p in connect {
        let _ = writeln!(conf, "ConnectPort {p}");
    }
    let mut files = Vec::new();
    if !policy.domains.is_empty() {
        conf.push_str(
            "FilterType ere\nFilterDefaultDeny Yes\nFilter \"/etc/tinyproxy/egress-filter\"\n",
        );
        let mut filter = String::new();
        for d in &policy.domains {
            let _ = writeln!(filter, "{}", filter_regex(d));
        }
        files.push(StagedFile {
            name: "tinyproxy.filter",
            mode: "0644",
            content: filter,
        });
    }
    let mut script =
        String::from("#!/bin/sh\n# Installs the staged tinyproxy config and starts it.\n");
    install_if_missing(
        &mut script,
        "command -v tinyproxy || [ -x /usr/bin/tinyproxy ] || [ -x /usr/sbin/tinyproxy ]",
        "tinyproxy",
        "tinyproxy",
    );
    install_if_missing(&mut script, "command -v nft", "nftables", "nftables");
    let _ = writeln!(
        script,
        "mkdir -p /etc/tinyproxy\ninstall -m 0600 {STAGE_DIR}/tinyproxy.conf /etc/tinyproxy/tinyproxy.conf"
    );
    if !policy.domains.is_empty() {
        let _ = writeln!(
            script,
            "install -m 0644 {STAGE_DIR}/tinyproxy.filter /etc/tinyproxy/egress-filter"
        );
    }
    apply_firewall(&mut script, "tinyproxy");
    start_service(&mut script, "tinyproxy", "tinyproxy");
    files.insert(
        0,
        StagedFile {
            name: "tinyproxy.conf",
            mode: "0600",
            content: conf,
        },
    );
    (files, script)
}

/// dante's own destination rules, first match wins: the networks the entry lifted passed
/// (when no domain list needs checking too); the host's addresses and the denied networks
/// blocked (dante resolves a requested name to check these); then the allowed domains or
/// CIDRs (or anything) passed for each client network. Ports are left to the firewall
/// (dante takes one port per rule; the rule count would multiply).
fn dante_destination_rules(conf: &mut String, from: &[&str], policy: &GuestPolicy) {
    let pass = |conf: &mut String, to: &str| {
        for f in from {
            let _ = writeln!(
                conf,
                "socks pass {{\n  from: {f} to: {to}\n  command: connect\n}}"
            );
        }
    };
    if policy.domains.is_empty() {
        for l in &policy.lifted {
            if policy.cidrs.is_empty() || policy.cidrs.iter().any(|c| c.contains(l)) {
                pass(conf, &l.to_string());
            }
        }
    }
    let host: Vec<&Net> = policy
        .denied
        .iter()
        .filter(|n| n.len == if n.addr.is_ipv4() { 32 } else { 128 })
        .collect();
    for n in &host {
        let _ = writeln!(conf, "socks block {{\n  from: 0/0 to: {n}\n}}");
    }
    for d in &policy.denied {
        if host.contains(&d) || policy.lifted.iter().any(|l| l.overlaps(d)) {
            continue;
        }
        let _ = writeln!(conf, "socks block {{\n  from: 0/0 to: {d}\n}}");
    }
    if !policy.domains.is_empty() {
        for d in &policy.domains {
            // dante: a leading dot matches every name ending with it.
            pass(conf, d.strip_prefix('*').unwrap_or(d));
        }
    } else if !policy.cidrs.is_empty() {
        for c in &policy.cidrs {
            pass(conf, &c.to_string());
        }
    } else {
        pass(conf, "0/0");
    }
    conf.push_str("socks block {\n  from: 0/0 to: 0/0\n}\n");
}

fn socks5(
    port: u16,
    cidrs: &[String],
    creds: Option<&ProxyCredentials>,
    policy: &GuestPolicy,
) -> (Vec<StagedFile>, String) {
    let mut conf = String::from("logoutput: syslog\n");
    let _ = writeln!(conf, "internal: 0.0.0.0 port = {port}");
    // The outgoing interface is the default route's, found at boot.
    conf.push_str("external: @EXTERNAL@\nclientmethod: none\n");
    conf.push_str(if creds.is_some() {
        "socksmethod: username\n"
    } else {
        "socksmethod: none\n"
    });
    conf.push_str("user.privileged: root\nuser.unprivileged: nobody\n");
    // With credentials only, any client may try, and must authenticate.
    let from: Vec<&str> = if cidrs.is_empty() {
        vec!["0/0"]
    } else {
        cidrs.iter().map(String::as_str).collect()
    };
    for f in &from {
        let _ = writeln!(conf, "client pass {{\n  from: {f} to: 0/0\n}}");
    }
    conf.push_str("client block {\n  from: 0/0 to: 0/0\n}\n");
    dante_destination_rules(&mut conf, &from, policy);

    let mut script = String::from("#!/bin/sh\n# Installs the staged dante config and starts it.\n");
    install_if_missing(
        &mut script,
        "command -v danted || command -v sockd || [ -x /usr/sbin/danted ] || [ -x /usr/sbin/sockd ]",
        "dante-server",
        "dante-server",
    );
    install_if_missing(&mut script, "command -v nft", "nftables", "nftables");
    if let Some(c) = creds {
        // The user must be new: an existing account (a system user, or one the image
        // ships) never gets its password set.
        let _ = writeln!(
            script,
            "if id -u {u} >/dev/null 2>&1; then\n  \
             echo 'egress-proxy: user {u} already exists; refusing to set its password' >&2\n  \
             exit 1\nfi\n\
             if command -v useradd >/dev/null 2>&1; then\n  useradd -M -s /usr/sbin/nologin {u} || exit 1\n\
             else\n  adduser -D -H -s /sbin/nologin {u} || exit 1\nfi\n\
             echo '{u}:{p}' | chpasswd",
            u = c.username,
            p = c.password
        );
        // The proxy's user may never log in over SSH, whatever the image allows (password
        // logins, or a key added later): no session, so no forwarding past the policy.
        let _ = writeln!(
            script,
            "if [ -d /etc/ssh ]; then\n  \
             mkdir -p /etc/ssh/sshd_config.d\n  \
             printf 'DenyUsers {u}\\nMatch User {u}\\n  AllowTcpForwarding no\\n  \
             AllowStreamLocalForwarding no\\n  PermitTunnel no\\n  X11Forwarding no\\n  \
             PermitTTY no\\n  ForceCommand /bin/false\\n' > /etc/ssh/sshd_config.d/00-egress-proxy.conf\n  \
             if ! grep -qi '^Include /etc/ssh/sshd_config.d' /etc/ssh/sshd_config 2>/dev/null; then\n    \
             cat /etc/ssh/sshd_config.d/00-egress-proxy.conf >> /etc/ssh/sshd_config\n  \
             fi\n  \
             (systemctl reload ssh || systemctl reload sshd || rc-service sshd reload) >/dev/null 2>&1 || true\n\
             fi",
            u = c.username
        );
    }
    apply_firewall(&mut script, "danted");
    script.push_str(
        "IFACE=$(ip -o route show default 2>/dev/null | awk '{print $5; exit}')\n\
         [ -n \"$IFACE\" ] || IFACE=eth0\n",
    );
    let _ = writeln!(
        script,
        "sed \"s/@EXTERNAL@/$IFACE/\" {STAGE_DIR}/danted.conf > /etc/danted.conf\n\
         chmod 0600 /etc/danted.conf\n\
         # Alpine's dante-server reads /etc/sockd.conf and runs as the sockd service.\n\
         if [ -e /etc/init.d/sockd ]; then cp /etc/danted.conf /etc/sockd.conf; fi\n\
         if [ -e /etc/init.d/sockd ] && ! [ -d /run/systemd/system ]; then\n  \
         rc-update add sockd default\n  rc-service sockd restart\n  exit 0\nfi"
    );
    start_service(&mut script, "danted", "danted");
    (
        vec![StagedFile {
            name: "danted.conf",
            mode: "0600",
            content: conf,
        }],
        script,
    )
}

#[cfg(test)]
mod tests;
