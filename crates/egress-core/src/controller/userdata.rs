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
//! - Injection-safe: CIDRs are re-parsed, user names and passwords are restricted to
//!   characters that need no quoting in YAML, shell single quotes or the proxies' configs.
//! - The proxy package is installed by the start script only when its binary is missing (no
//!   cloud-init `packages:` key, which refreshes the package index even when nothing needs
//!   installing), so images with the proxy preinstalled boot offline.
//! - Configs are staged under `/etc/egress-proxy/` and installed by the start script after the
//!   package is installed, so a package's own default config never overwrites ours.
//!   Files holding credentials are mode 0600.

use std::fmt::Write as _;

use super::ProxyCredentials;
use crate::model::{ProxyProtocol, ProxySettings, parse_cidr};

/// Where the staged files live in the guest.
pub const STAGE_DIR: &str = "/etc/egress-proxy";
/// Longest user name accepted.
// NB: Linux user names are at most 32 characters (useradd's default limit).
pub const MAX_USERNAME: usize = 32;
/// Longest password accepted.
// NB: long enough for any generated secret; bounds the rendered user-data.
pub const MAX_PASSWORD: usize = 128;
/// Punctuation allowed in passwords besides ASCII letters and digits.
// NB: excludes whitespace, quotes, backslash, `#`, `:`, `$`, backtick, `&`, `|`, `;`, `<`, `>`
// and braces: nothing that YAML, shell single quotes, chpasswd or the two config parsers
// would interpret.
const PASSWORD_PUNCT: &str = "!%*+,-./=?@^_~";

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

fn check_credentials(c: &ProxyCredentials) -> Result<(), UserDataError> {
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
    Ok(())
}

/// Renders the `#cloud-config` user-data for `settings` and `credentials`.
pub fn render(
    settings: &ProxySettings,
    credentials: Option<&ProxyCredentials>,
) -> Result<String, UserDataError> {
    let mut cidrs = Vec::new();
    for (index, c) in settings.allowed_client_cidrs.iter().enumerate() {
        let (ip, len) = parse_cidr(c).ok_or_else(|| UserDataError::BadCidr {
            index,
            value: c.clone(),
        })?;
        cidrs.push(format!("{ip}/{len}"));
    }
    if cidrs.is_empty() && credentials.is_none() {
        return Err(UserDataError::OpenRelay);
    }
    if let Some(c) = credentials {
        check_credentials(c)?;
    }
    let (files, script) = match settings.protocol {
        ProxyProtocol::Http => http(settings.port, &cidrs, credentials),
        ProxyProtocol::Socks5 => socks5(settings.port, &cidrs, credentials),
    };
    let mut out = String::from("#cloud-config\n");
    // NB: no `packages:` key: cloud-init refreshes the package index whenever it is set, which
    // fails (after retries) on an image with the proxy preinstalled and no network; the start
    // script installs the package only when its binary is missing.
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
/// OpenRC (finding L10).
fn start_service(out: &mut String, systemd: &str, openrc: &str) {
    let _ = writeln!(
        out,
        "if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then\n  \
         systemctl enable {systemd}\n  systemctl restart {systemd}\n\
         elif command -v rc-service >/dev/null 2>&1; then\n  \
         rc-update add {openrc} default\n  rc-service {openrc} restart\n\
         fi"
    );
}

fn http(
    port: u16,
    cidrs: &[String],
    creds: Option<&ProxyCredentials>,
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
    let mut script =
        String::from("#!/bin/sh\n# Installs the staged tinyproxy config and starts it.\n");
    install_if_missing(
        &mut script,
        "command -v tinyproxy || [ -x /usr/bin/tinyproxy ] || [ -x /usr/sbin/tinyproxy ]",
        "tinyproxy",
        "tinyproxy",
    );
    let _ = writeln!(
        script,
        "mkdir -p /etc/tinyproxy\ninstall -m 0600 {STAGE_DIR}/tinyproxy.conf /etc/tinyproxy/tinyproxy.conf"
    );
    start_service(&mut script, "tinyproxy", "tinyproxy");
    (
        vec![StagedFile {
            name: "tinyproxy.conf",
            mode: "0600",
            content: conf,
        }],
        script,
    )
}

fn socks5(
    port: u16,
    cidrs: &[String],
    creds: Option<&ProxyCredentials>,
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
    for f in &from {
        let _ = writeln!(
            conf,
            "socks pass {{\n  from: {f} to: 0/0\n  command: connect\n}}"
        );
    }
    conf.push_str("socks block {\n  from: 0/0 to: 0/0\n}\n");

    let mut script = String::from("#!/bin/sh\n# Installs the staged dante config and starts it.\n");
    install_if_missing(
        &mut script,
        "command -v danted || command -v sockd || [ -x /usr/sbin/danted ] || [ -x /usr/sbin/sockd ]",
        "dante-server",
        "dante-server",
    );
    if let Some(c) = creds {
        let _ = writeln!(
            script,
            "if command -v useradd >/dev/null 2>&1; then\n  useradd -M -s /usr/sbin/nologin {u} || true\n\
             else\n  adduser -D -H -s /sbin/nologin {u} || true\nfi\n\
             echo '{u}:{p}' | chpasswd",
            u = c.username,
            p = c.password
        );
    }
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
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn settings(protocol: ProxyProtocol, cidrs: &[&str]) -> ProxySettings {
        ProxySettings {
            port: 8888,
            protocol,
            allowed_client_cidrs: cidrs.iter().map(|s| (*s).to_owned()).collect(),
            credentials_ref: None,
            expected_egress: None,
        }
    }

    fn creds() -> ProxyCredentials {
        ProxyCredentials {
            username: "alice".into(),
            password: "s3cr3t-pw".into(),
        }
    }

    /// The staged file `name`'s content, unindented, from parsed YAML.
    fn file(ud: &str, name: &str) -> String {
        let v: serde_json::Value = serde_saphyr::from_str(ud).unwrap();
        let files = v["write_files"].as_array().unwrap();
        let f = files
            .iter()
            .find(|f| f["path"].as_str().unwrap().ends_with(name))
            .unwrap();
        f["content"].as_str().unwrap().to_owned()
    }

    #[test]
    fn http_user_data_is_valid_cloud_config_allowing_only_the_given_networks() {
        let ud = render(
            &settings(ProxyProtocol::Http, &["10.0.0.0/8", "2001:db8::/32"]),
            None,
        )
        .unwrap();
        assert!(ud.starts_with("#cloud-config\n"));
        let v: serde_json::Value = serde_saphyr::from_str(&ud).unwrap();
        assert!(v.get("packages").is_none(), "no index refresh: {ud}");
        assert!(
            file(&ud, "start.sh").contains("apt-get install -y --no-install-recommends tinyproxy")
        );
        let conf = file(&ud, "tinyproxy.conf");
        assert!(conf.contains("Port 8888\n"), "{conf}");
        assert!(
            conf.contains("Allow 10.0.0.0/8\nAllow 2001:db8::/32\n"),
            "{conf}"
        );
        assert!(conf.contains("DisableViaHeader Yes\n"), "{conf}");
        assert!(!conf.contains("BasicAuth"), "{conf}");
    }

    #[test]
    fn http_with_credentials_requires_basic_auth_in_a_private_file() {
        let ud = render(&settings(ProxyProtocol::Http, &[]), Some(&creds())).unwrap();
        let conf = file(&ud, "tinyproxy.conf");
        assert!(conf.contains("BasicAuth alice s3cr3t-pw\n"), "{conf}");
        assert!(!conf.contains("Allow "), "{conf}");
        let v: serde_json::Value = serde_saphyr::from_str(&ud).unwrap();
        for f in v["write_files"].as_array().unwrap() {
            assert!(["0600", "0700"].contains(&f["permissions"].as_str().unwrap()));
        }
    }

    #[test]
    fn socks5_user_data_passes_only_the_given_networks_and_blocks_the_rest() {
        let ud = render(&settings(ProxyProtocol::Socks5, &["192.168.1.0/24"]), None).unwrap();
        let v: serde_json::Value = serde_saphyr::from_str(&ud).unwrap();
        assert!(v.get("packages").is_none(), "no index refresh: {ud}");
        assert!(file(&ud, "start.sh").contains("apk add --no-cache dante-server"));
        let conf = file(&ud, "danted.conf");
        assert!(conf.contains("internal: 0.0.0.0 port = 8888\n"), "{conf}");
        assert!(
            conf.contains("client pass {\n  from: 192.168.1.0/24 to: 0/0\n}"),
            "{conf}"
        );
        assert!(
            conf.contains("socks block {\n  from: 0/0 to: 0/0\n}"),
            "{conf}"
        );
        assert!(conf.contains("socksmethod: none\n"), "{conf}");
        assert!(
            !conf.contains("from: 0/0 to: 0/0\n  command"),
            "no pass for everyone: {conf}"
        );
    }

    #[test]
    fn socks5_with_credentials_requires_a_username() {
        let ud = render(&settings(ProxyProtocol::Socks5, &[]), Some(&creds())).unwrap();
        let conf = file(&ud, "danted.conf");
        assert!(conf.contains("socksmethod: username\n"), "{conf}");
        let script = file(&ud, "start.sh");
        assert!(
            script.contains("echo 'alice:s3cr3t-pw' | chpasswd"),
            "{script}"
        );
    }

    #[test]
    fn the_start_script_works_on_systemd_and_openrc_images() {
        // finding: L10
        for proto in [ProxyProtocol::Http, ProxyProtocol::Socks5] {
            let ud = render(&settings(proto, &["10.0.0.0/8"]), None).unwrap();
            let v: serde_json::Value = serde_saphyr::from_str(&ud).unwrap();
            assert_eq!(v["runcmd"][0][1], "/etc/egress-proxy/start.sh");
            let script = file(&ud, "start.sh");
            assert!(script.contains("[ -d /run/systemd/system ]"), "{script}");
            assert!(script.contains("systemctl restart"), "{script}");
            assert!(script.contains("rc-update add"), "{script}");
            assert!(script.contains("rc-service"), "{script}");
        }
        let socks = file(
            &render(&settings(ProxyProtocol::Socks5, &["10.0.0.0/8"]), None).unwrap(),
            "start.sh",
        );
        assert!(
            socks.contains("rc-service sockd restart"),
            "Alpine's service: {socks}"
        );
    }

    #[test]
    fn the_package_is_installed_only_when_missing_so_preinstalled_images_boot_offline() {
        for (proto, probe) in [
            (ProxyProtocol::Http, "command -v tinyproxy"),
            (ProxyProtocol::Socks5, "command -v danted"),
        ] {
            let ud = render(&settings(proto, &["10.0.0.0/8"]), None).unwrap();
            let script = file(&ud, "start.sh");
            let check = script.find(&format!("if ! {{ {probe}")).unwrap();
            let install = script.find("apt-get update").unwrap();
            let config = script.find("/etc/egress-proxy/").unwrap();
            assert!(check < install && install < config, "{script}");
            assert!(!ud.contains("packages:"), "{ud}");
        }
    }

    #[test]
    fn an_open_relay_and_unsafe_values_are_refused() {
        assert_eq!(
            render(&settings(ProxyProtocol::Http, &[]), None),
            Err(UserDataError::OpenRelay)
        );
        assert!(matches!(
            render(&settings(ProxyProtocol::Http, &["10.0.0.0/33"]), None),
            Err(UserDataError::BadCidr { index: 0, .. })
        ));
        let s = settings(ProxyProtocol::Socks5, &["10.0.0.0/8"]);
        for (u, p) in [
            ("al ice", "pw"),
            ("alice'", "pw"),
            ("", "pw"),
            ("alice", "p w"),
            ("alice", "p'w"),
            ("alice", ""),
        ] {
            let c = ProxyCredentials {
                username: u.into(),
                password: p.into(),
            };
            let e = render(&s, Some(&c)).unwrap_err();
            assert!(!e.to_string().contains("p'w"), "password never shown: {e}");
        }
    }

    #[test]
    fn credentials_debug_output_redacts_the_password() {
        let d = format!("{:?}", creds());
        assert!(d.contains("alice") && !d.contains("s3cr3t"), "{d}");
    }
}
