//! Tests of the user-data renderers: the rendered tinyproxy and dante configs, the start
//! script and the refusals.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]
use super::*;

fn settings(protocol: ProxyProtocol, cidrs: &[&str]) -> ProxySettings {
    ProxySettings {
        port: 8888,
        protocol,
        allowed_client_cidrs: cidrs.iter().map(|s| (*s).to_owned()).collect(),
        credentials_ref: None,
        expected_egress: None,
        allowed_destinations: Default::default(),
    }
}

fn pol() -> GuestPolicy {
    GuestPolicy::from_entry(&Default::default())
}

fn creds() -> ProxyCredentials {
    ProxyCredentials {
        username: "alice".into(),
        password: "s3cr3t-pw-16chars".into(),
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
        &pol(),
    )
    .unwrap();
    assert!(ud.starts_with("#cloud-config\n"));
    let v: serde_json::Value = serde_saphyr::from_str(&ud).unwrap();
    assert!(v.get("packages").is_none(), "no index refresh: {ud}");
    assert!(file(&ud, "start.sh").contains("apt-get install -y --no-install-recommends tinyproxy"));
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
fn connect_defaults_to_ports_443_and_80() {
    let ud = render(
        &settings(ProxyProtocol::Http, &["10.0.0.0/8"]),
        None,
        &pol(),
    )
    .unwrap();
    let conf = file(&ud, "tinyproxy.conf");
    let ports: Vec<&str> = conf
        .lines()
        .filter_map(|l| l.strip_prefix("ConnectPort "))
        .collect();
    assert_eq!(ports, ["443", "80"], "{conf}");
    // The operator's health targets are added; an allowlist replaces the default.
    let mut p = pol();
    p.connect_default.push(8080);
    let conf = file(
        &render(&settings(ProxyProtocol::Http, &["10.0.0.0/8"]), None, &p).unwrap(),
        "tinyproxy.conf",
    );
    assert!(
        conf.contains("ConnectPort 443\nConnectPort 80\nConnectPort 8080\n"),
        "{conf}"
    );
    p.ports = vec![8443];
    let conf = file(
        &render(&settings(ProxyProtocol::Http, &["10.0.0.0/8"]), None, &p).unwrap(),
        "tinyproxy.conf",
    );
    assert!(conf.contains("ConnectPort 8443\n") && !conf.contains("ConnectPort 443\n"));
}

#[test]
fn http_with_credentials_requires_basic_auth_in_a_private_file() {
    let ud = render(&settings(ProxyProtocol::Http, &[]), Some(&creds()), &pol()).unwrap();
    let conf = file(&ud, "tinyproxy.conf");
    assert!(
        conf.contains("BasicAuth alice s3cr3t-pw-16chars\n"),
        "{conf}"
    );
    assert!(!conf.contains("Allow "), "{conf}");
    let v: serde_json::Value = serde_saphyr::from_str(&ud).unwrap();
    for f in v["write_files"].as_array().unwrap() {
        assert!(["0600", "0700"].contains(&f["permissions"].as_str().unwrap()));
    }
}

#[test]
fn socks5_user_data_passes_only_the_given_networks_and_blocks_the_rest() {
    let ud = render(
        &settings(ProxyProtocol::Socks5, &["192.168.1.0/24"]),
        None,
        &pol(),
    )
    .unwrap();
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
    let ud = render(
        &settings(ProxyProtocol::Socks5, &[]),
        Some(&creds()),
        &pol(),
    )
    .unwrap();
    let conf = file(&ud, "danted.conf");
    assert!(conf.contains("socksmethod: username\n"), "{conf}");
    let script = file(&ud, "start.sh");
    assert!(
        script.contains("echo 'alice:s3cr3t-pw-16chars' | chpasswd"),
        "{script}"
    );
}

#[test]
fn the_start_script_works_on_systemd_and_openrc_images() {
    // finding: L10
    for proto in [ProxyProtocol::Http, ProxyProtocol::Socks5] {
        let ud = render(&settings(proto, &["10.0.0.0/8"]), None, &pol()).unwrap();
        let v: serde_json::Value = serde_saphyr::from_str(&ud).unwrap();
        assert_eq!(v["runcmd"][0][1], "/etc/egress-proxy/start.sh");
        let script = file(&ud, "start.sh");
        assert!(script.contains("[ -d /run/systemd/system ]"), "{script}");
        assert!(script.contains("systemctl restart"), "{script}");
        assert!(script.contains("rc-update add"), "{script}");
        assert!(script.contains("rc-service"), "{script}");
    }
    let socks = file(
        &render(
            &settings(ProxyProtocol::Socks5, &["10.0.0.0/8"]),
            None,
            &pol(),
        )
        .unwrap(),
        "start.sh",
    );
    assert!(
        socks.contains("rc-service sockd restart"),
        "Alpine's service: {socks}"
    );
}

/// Runs `start_service(unit, unit)`'s shell with a stub `systemctl` whose `is-enabled`
/// answers `state` (exit 0) or `disabled` (exit 1, `state` empty), on a "booted with systemd"
/// directory of its own; returns the stub's calls.
fn run_start_service(unit: &str, state: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    let sd = dir.path().join("run-systemd-system");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&sd).unwrap();
    let log = dir.path().join("calls.log");
    let answer = if state.is_empty() {
        "echo disabled; exit 1".to_owned()
    } else {
        format!("echo {state}; exit 0")
    };
    let stub = bin.join("systemctl");
    std::fs::write(
        &stub,
        format!(
            "#!/bin/sh\necho \"systemctl $*\" >> '{}'\n\
             if [ \"$1\" = is-enabled ]; then {answer}; fi\nexit 0\n",
            log.display()
        ),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&stub)
        .status()
        .unwrap();
    let mut script = String::new();
    start_service(&mut script, unit, unit);
    let script = script.replace("/run/systemd/system", sd.to_str().unwrap());
    let out = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(&script)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{script}: {out:?}");
    std::fs::read_to_string(&log).unwrap_or_default()
}

#[test]
fn a_service_already_enabled_is_only_restarted() {
    // `systemctl enable` reloads systemd (and runs update-rc.d for tinyproxy's init script):
    // seconds of every first boot under TCG when the image already enables the service.
    assert_eq!(
        run_start_service("tinyproxy", "enabled"),
        "systemctl is-enabled tinyproxy\nsystemctl restart tinyproxy\n"
    );
    for state in ["", "disabled"] {
        assert_eq!(
            run_start_service("danted", state),
            "systemctl is-enabled danted\nsystemctl enable danted\nsystemctl restart danted\n",
            "{state:?}"
        );
    }
}

#[test]
fn the_package_is_installed_only_when_missing_so_preinstalled_images_boot_offline() {
    for (proto, probe) in [
        (ProxyProtocol::Http, "command -v tinyproxy"),
        (ProxyProtocol::Socks5, "command -v danted"),
    ] {
        let ud = render(&settings(proto, &["10.0.0.0/8"]), None, &pol()).unwrap();
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
        render(&settings(ProxyProtocol::Http, &[]), None, &pol()),
        Err(UserDataError::OpenRelay)
    );
    assert!(matches!(
        render(
            &settings(ProxyProtocol::Http, &["10.0.0.0/33"]),
            None,
            &pol()
        ),
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
        let e = render(&s, Some(&c), &pol()).unwrap_err();
        assert!(!e.to_string().contains("p'w"), "password never shown: {e}");
    }
}

#[test]
fn credentials_debug_output_redacts_the_password() {
    let d = format!("{:?}", creds());
    assert!(d.contains("alice") && !d.contains("s3cr3t"), "{d}");
}

#[test]
fn client_networks_wider_than_the_entry_minimum_and_slash_zero_are_refused() {
    let mut p = pol();
    for (cidr, ok) in [
        ("0.0.0.0/0", false),
        ("::/0", false),
        ("10.0.0.0/7", false),
        ("10.0.0.0/8", true),
        ("2001:db8::/31", false),
        ("2001:db8::/32", true),
    ] {
        let r = render(&settings(ProxyProtocol::Http, &[cidr]), None, &p);
        assert_eq!(r.is_ok(), ok, "{cidr}: {r:?}");
        if !ok {
            assert!(
                matches!(r, Err(UserDataError::WideCidr { index: 0, .. })),
                "{r:?}"
            );
        }
    }
    // The admin may tighten it; /0 stays refused even with a minimum of 0.
    p.min_client_prefix_v4 = 24;
    assert!(render(&settings(ProxyProtocol::Http, &["10.0.0.0/16"]), None, &p).is_err());
    p.min_client_prefix_v4 = 0;
    assert!(render(&settings(ProxyProtocol::Http, &["0.0.0.0/0"]), None, &p).is_err());
}

#[test]
fn every_proxy_with_credentials_needs_a_password_of_the_entry_minimum_length() {
    let short = ProxyCredentials {
        username: "alice".into(),
        password: "a".repeat(15),
    };
    let long = ProxyCredentials {
        username: "alice".into(),
        password: "a".repeat(16),
    };
    for proto in [ProxyProtocol::Http, ProxyProtocol::Socks5] {
        let e = render(&settings(proto, &[]), Some(&short), &pol()).unwrap_err();
        assert_eq!(e, UserDataError::ShortPassword { min: 16 });
        assert!(!e.to_string().contains(&short.password), "never shown: {e}");
        assert!(render(&settings(proto, &[]), Some(&long), &pol()).is_ok());
        // With client networks too: whoever is in them may try the password.
        let e = render(&settings(proto, &["10.0.0.0/8"]), Some(&short), &pol()).unwrap_err();
        assert_eq!(e, UserDataError::ShortPassword { min: 16 });
        assert!(render(&settings(proto, &["10.0.0.0/8"]), Some(&long), &pol()).is_ok());
    }
}

#[test]
fn passwords_use_only_characters_tinyproxy_accepts() {
    let s = settings(ProxyProtocol::Http, &["10.0.0.0/8"]);
    for bad in "!%*+,/=?@^~:$'\" #".chars() {
        let c = ProxyCredentials {
            username: "alice".into(),
            password: format!("abc{bad}def"),
        };
        assert_eq!(
            render(&s, Some(&c), &pol()),
            Err(UserDataError::BadPassword),
            "{bad}"
        );
    }
    let c = ProxyCredentials {
        username: "alice".into(),
        password: "Ab0-._".repeat(3),
    };
    assert!(render(&s, Some(&c), &pol()).is_ok());
}

#[test]
fn socks_users_can_never_log_in_or_forward_over_ssh() {
    let ud = render(
        &settings(ProxyProtocol::Socks5, &["10.0.0.0/8"]),
        Some(&creds()),
        &pol(),
    )
    .unwrap();
    let v: serde_json::Value = serde_saphyr::from_str(&ud).unwrap();
    assert_eq!(v["ssh_pwauth"], false, "{ud}");
    let script = file(&ud, "start.sh");
    let chpasswd = script.find("| chpasswd").unwrap();
    let deny = script
        .find("DenyUsers alice\\nMatch User alice\\n  AllowTcpForwarding no")
        .unwrap_or_else(|| panic!("{script}"));
    assert!(chpasswd < deny, "{script}");
    assert!(script.contains("ForceCommand /bin/false"), "{script}");
    // The script stays valid shell.
    let out = std::process::Command::new("sh")
        .args(["-n", "-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And the drop-in it writes is what sshd accepts: printf expands it to these lines.
    let printed = std::process::Command::new("sh")
        .args([
            "-c",
            "printf 'DenyUsers alice\\nMatch User alice\\n  AllowTcpForwarding no\\n'",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&printed.stdout),
        "DenyUsers alice\nMatch User alice\n  AllowTcpForwarding no\n"
    );
}

#[test]
fn socks_usernames_never_name_guest_system_accounts() {
    let s = settings(ProxyProtocol::Socks5, &["10.0.0.0/8"]);
    for u in [
        "root",
        "Daemon",
        "nobody",
        "debian",
        "systemd-network",
        "tinyproxy",
    ] {
        let c = ProxyCredentials {
            username: u.into(),
            password: "s3cr3t-pw-16chars".into(),
        };
        assert_eq!(
            render(&s, Some(&c), &pol()),
            Err(UserDataError::ReservedUsername(u.into()))
        );
    }
    // Any other existing account is refused in the guest before chpasswd runs.
    let script = file(&render(&s, Some(&creds()), &pol()).unwrap(), "start.sh");
    let guard = script.find("if id -u alice >/dev/null 2>&1; then").unwrap();
    let exit = script[guard..].find("exit 1").unwrap() + guard;
    let chpasswd = script.find("| chpasswd").unwrap();
    assert!(guard < exit && exit < chpasswd, "{script}");
    assert!(
        script.contains("useradd -M -s /usr/sbin/nologin alice || exit 1"),
        "{script}"
    );
}

#[test]
fn the_firewall_rejects_internal_destinations_and_is_applied_before_the_proxy_starts() {
    for (proto, user, svc) in [
        (ProxyProtocol::Http, "tinyproxy", "tinyproxy"),
        (ProxyProtocol::Socks5, "nobody", "danted"),
    ] {
        let ud = render(&settings(proto, &["10.0.0.0/8"]), None, &pol()).unwrap();
        let fw = file(&ud, "firewall.sh");
        assert!(
            fw.contains(&format!("meta skuid \"{user}\" jump proxy")),
            "{fw}"
        );
        for net in [
            "10.0.0.0/8",
            "100.64.0.0/10",
            "169.254.0.0/16",
            "127.0.0.0/8",
        ] {
            assert!(fw.contains(net), "{net}: {fw}");
        }
        assert!(fw.contains("fc00::/7") && fw.contains("fe80::/10"), "{fw}");
        assert!(fw.contains("ip daddr @denied4 reject"), "{fw}");
        let script = file(&ud, "start.sh");
        let apply = script
            .find("if ! sh /etc/egress-proxy/firewall.sh")
            .unwrap();
        let start = script.find(&format!("systemctl restart {svc}")).unwrap();
        assert!(apply < start, "{script}");
        assert!(
            script.contains("ExecStartPre=/bin/sh /etc/egress-proxy/firewall.sh"),
            "re-applied on every start: {script}"
        );
        let openrc = script.find("rc_need=\"egress-proxy-firewall\"").unwrap();
        let rc_start = script.find(&format!("rc-service {svc} restart")).unwrap();
        assert!(
            apply < openrc && openrc < rc_start,
            "OpenRC needs it too: {script}"
        );
        assert!(
            script.contains("start() { sh /etc/egress-proxy/firewall.sh; }"),
            "{script}"
        );
    }
}

#[test]
fn allowlists_render_into_tinyproxy_filters_and_dante_rules() {
    let entry = egress_provider::libvirt::config::ProxyPolicy::default();
    let spec = crate::model::Destinations {
        domains: vec!["example.com".into(), "*.example.org".into()],
        cidrs: vec![],
        ports: vec![443],
    };
    let p = GuestPolicy::for_proxy(&entry, &spec, &["203.0.113.9".parse().unwrap()]).unwrap();
    let ud = render(&settings(ProxyProtocol::Http, &["10.0.0.0/8"]), None, &p).unwrap();
    let conf = file(&ud, "tinyproxy.conf");
    assert!(conf.contains("ConnectPort 443\n"), "{conf}");
    assert!(conf.contains("FilterDefaultDeny Yes\n"), "{conf}");
    let filter = file(&ud, "tinyproxy.filter");
    assert_eq!(filter, "^example\\.com$\n^.+\\.example\\.org$\n");
    let fw = file(&ud, "firewall.sh");
    assert!(fw.contains("tcp dport != { 443 } reject"), "{fw}");
    assert!(fw.contains("elements = { 203.0.113.9/32 }"), "{fw}");
    let ud = render(&settings(ProxyProtocol::Socks5, &["10.0.0.0/8"]), None, &p).unwrap();
    let conf = file(&ud, "danted.conf");
    let host = conf.find("to: 203.0.113.9/32").unwrap();
    let block = conf.find("to: 127.0.0.0/8").unwrap();
    let pass = conf
        .find("from: 10.0.0.0/8 to: .example.org\n  command: connect")
        .unwrap();
    assert!(host < block && block < pass, "{conf}");
    assert!(
        !conf.contains("to: 0/0\n  command"),
        "no pass to anywhere: {conf}"
    );
}
