//! The guest's proxy policy, proven with the real daemons: the configs and the firewall
//! script that `userdata::render` writes into the guest's user-data are run with Debian's
//! `tinyproxy`, `danted` and `nft` (installed by .ci/setup-host), each test in its own
//! network namespace (`ip netns`), so the firewall rules never touch this machine's.
//!
//! The namespace's loopback interface also holds a stand-in public address (198.51.100.1,
//! TEST-NET-2, not a denied network), a private one (10.9.9.1) and the cloud metadata
//! address (169.254.169.254); an HTTP server listens on all of them. Names resolve
//! through the namespace's own hosts file (`/etc/netns/NAME/hosts`, which `ip netns exec`
//! mounts over `/etc/hosts`). Clients are `curl` run as root inside the namespace (root is
//! not the proxy user, so the firewall does not police the client itself).
//!
//! Loopback (127.0.0.0/8) is a denied destination, so the allowed targets use the other addresses; where
//! a test needs loopback allowed it says so and lifts it the only way the product allows:
//! the provider entry's `policy.allowedDestinations.cidrs`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use egress_core::controller::ProxyCredentials;
use egress_core::controller::userdata::{PASSWORD_PUNCT, render};
use egress_core::model::{Destinations, ProxyProtocol, ProxySettings};
use egress_core::proxy_policy::GuestPolicy;
use egress_provider::libvirt::config::ProxyPolicy;

/// Bound on a daemon starting to answer (loopback, a fresh namespace: milliseconds).
const START_DEADLINE: Duration = Duration::from_secs(10);
/// curl's bound on one request: a refusal is immediate; a hang means a dropped packet.
const REQUEST_SECS: &str = "5";
/// How long a tinyproxy started with a bad config is given to exit (it exits while parsing
/// the config, in milliseconds; a good config keeps it running).
const PARSE_GRACE: Duration = Duration::from_millis(1500);

/// The proxy port inside the namespace.
const PROXY_PORT: u16 = 3128;
/// The echo ports inside the namespace.
const ECHO_PORT: u16 = 8080;
const OTHER_PORT: u16 = 8081;
const PUBLIC: &str = "198.51.100.1";
const PRIVATE: &str = "10.9.9.1";
const METADATA: &str = "169.254.169.254";
/// The default gateway of [`Netns::add_gateway`] (TEST-NET-3: not a denied network, so
/// only the gateway rule refuses it).
const GATEWAY: &str = "203.0.113.1";

static SEQ: AtomicU32 = AtomicU32::new(0);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn require(bin: &str) {
    assert!(
        Path::new(bin).exists(),
        "{bin} is missing: run `bash .ci/setup-host` (it installs tinyproxy, dante-server, \
         nftables, curl and iproute2)"
    );
}

fn run(args: &[&str]) -> Output {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A network namespace with the addresses above and an HTTP server on ports 8080 and
/// 8081; removed (with its hosts file and processes) on drop.
struct Netns {
    name: String,
    children: Vec<Child>,
    etc: PathBuf,
    dir: tempfile::TempDir,
}

impl Netns {
    fn new() -> Self {
        for b in [
            "/usr/sbin/ip",
            "/usr/sbin/nft",
            "/usr/bin/curl",
            "/usr/bin/python3",
        ] {
            require(b);
        }
        let name = format!(
            "ep-pol-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        run(&["ip", "netns", "add", &name]);
        let etc = PathBuf::from(format!("/etc/netns/{name}"));
        let mut ns = Self {
            name: name.clone(),
            children: Vec::new(),
            etc: etc.clone(),
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(
            etc.join("hosts"),
            format!(
                "127.0.0.1 localhost\n{PUBLIC} public.example.com other.example.net\n\
                 {PRIVATE} internal.example.com\n"
            ),
        )
        .unwrap();
        // The proxy user must read its config and filter files after dropping privileges.
        std::fs::set_permissions(
            ns.dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        for cmd in [
            "link set lo up",
            &format!("addr add {PUBLIC}/32 dev lo"),
            &format!("addr add {PRIVATE}/32 dev lo"),
            &format!("addr add {METADATA}/32 dev lo"),
        ] {
            let mut a = vec!["ip", "-n", &name];
            a.extend(cmd.split(' '));
            run(&a);
        }
        for port in [ECHO_PORT, OTHER_PORT] {
            let p = port.to_string();
            let dir = ns.dir.path().to_owned();
            ns.spawn(
                &["python3", "-m", "http.server", &p, "--bind", "0.0.0.0"],
                &dir,
            );
            ns.wait_http(&format!("http://{PUBLIC}:{port}/"));
        }
        ns
    }

    fn spawn(&mut self, args: &[&str], cwd: &Path) {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .current_dir(cwd)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.children.push(child);
    }

    fn exec(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .unwrap()
    }

    /// Waits until `url` answers 200 directly (no proxy).
    fn wait_http(&self, url: &str) {
        let t0 = Instant::now();
        loop {
            let o = self.exec(&[
                "curl",
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "1",
                url,
            ]);
            if String::from_utf8_lossy(&o.stdout) == "200" {
                return;
            }
            assert!(t0.elapsed() < START_DEADLINE, "{url} never answered");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_listening(&self, port: u16) {
        let t0 = Instant::now();
        loop {
            let o = self.exec(&["ss", "-Htln", &format!("sport = :{port}")]);
            if !o.stdout.is_empty() {
                return;
            }
            assert!(t0.elapsed() < START_DEADLINE, "port {port} never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Gives the namespace a default route via [`GATEWAY`] (on a veth pair inside it), as a
    /// guest's DHCP does; the gateway address also answers HTTP (the echo binds 0.0.0.0).
    fn add_gateway(&self) {
        for cmd in [
            "link add v0 type veth peer name v1",
            "link set v0 up",
            "link set v1 up",
            "addr add 203.0.113.2/24 dev v0",
            &format!("addr add {GATEWAY}/32 dev v1"),
            &format!("route add default via {GATEWAY} dev v0"),
        ] {
            let mut a = vec!["ip", "-n", &self.name];
            a.extend(cmd.split(' '));
            run(&a);
        }
    }

    /// Applies the rendered firewall script, as the guest's start script does.
    fn firewall(&self, user_data: &str) {
        let path = self.dir.path().join("firewall.sh");
        std::fs::write(&path, staged(user_data, "firewall.sh")).unwrap();
        let o = self.exec(&["sh", path.to_str().unwrap()]);
        assert!(
            o.status.success(),
            "firewall: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// Starts tinyproxy with the rendered config (and filter), listening on 127.0.0.1.
    fn tinyproxy(&mut self, user_data: &str) {
        let dir = self.dir.path().to_owned();
        let filter = dir.join("egress-filter");
        if let Some(f) = try_staged(user_data, "tinyproxy.filter") {
            std::fs::write(&filter, f).unwrap();
        }
        let conf = format!("Listen 127.0.0.1\n{}", staged(user_data, "tinyproxy.conf"))
            .replace("/etc/tinyproxy/egress-filter", filter.to_str().unwrap());
        let path = dir.join("tinyproxy.conf");
        std::fs::write(&path, conf).unwrap();
        self.spawn(
            &["/usr/bin/tinyproxy", "-d", "-c", path.to_str().unwrap()],
            &dir,
        );
        self.wait_listening(PROXY_PORT);
    }

    /// Starts danted with `conf` (the rendered one, adapted to loopback as the start script
    /// adapts it to the guest's interface).
    fn danted(&mut self, conf: &str) {
        let dir = self.dir.path().to_owned();
        let conf = conf
            .replace("@EXTERNAL@", "lo")
            .replace("internal: 0.0.0.0", "internal: 127.0.0.1")
            .replace("logoutput: syslog", "logoutput: stderr");
        let path = dir.join("danted.conf");
        std::fs::write(&path, conf).unwrap();
        self.spawn(
            &["/usr/sbin/danted", "-f", path.to_str().unwrap(), "-N", "1"],
            &dir,
        );
        self.wait_listening(PROXY_PORT);
    }

    /// Fetches `url` through the proxy: `Ok` when the echo answered 200, `Err(what curl
    /// saw)` otherwise. `how` is curl's proxy option (`-x http://...`, `--socks5-hostname`).
    fn fetch(&self, how: &[&str], url: &str) -> Result<(), String> {
        let mut a = vec![
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{http_connect}",
            "--max-time",
            REQUEST_SECS,
        ];
        a.extend(how);
        a.push(url);
        let o = self.exec(&a);
        let code = o.status.code().unwrap_or(-1);
        let seen = format!("exit {code}, {}", String::from_utf8_lossy(&o.stdout));
        assert_ne!(
            code, 28,
            "{url} through {how:?}: refused, not hung ({seen})"
        );
        if code == 0 && o.stdout.starts_with(b"200") {
            Ok(())
        } else {
            Err(seen)
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = std::fs::remove_dir_all(&self.etc);
    }
}

fn try_staged(user_data: &str, name: &str) -> Option<String> {
    let v: serde_json::Value = serde_saphyr::from_str(user_data).unwrap();
    v["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with(name))
        .map(|f| f["content"].as_str().unwrap().to_owned())
}

fn staged(user_data: &str, name: &str) -> String {
    try_staged(user_data, name).unwrap_or_else(|| panic!("no staged {name}"))
}

fn settings(protocol: ProxyProtocol, cidrs: &[&str]) -> ProxySettings {
    ProxySettings {
        port: PROXY_PORT,
        protocol,
        allowed_client_cidrs: cidrs.iter().map(|s| (*s).to_owned()).collect(),
        ..ProxySettings::default()
    }
}

/// The policy of an entry lifting `internal` (its `allowedInternalCidrs`), joined with a
/// Proxy's allowlist `spec`.
fn policy(internal: &[&str], spec: Destinations) -> GuestPolicy {
    let entry = ProxyPolicy {
        allowed_internal_cidrs: internal.iter().map(|s| (*s).to_owned()).collect(),
        ..ProxyPolicy::default()
    };
    let mut p = GuestPolicy::for_proxy(&entry, &spec, &[]).unwrap();
    // The echo ports stand in for the operator's health targets, whose ports CONNECT may
    // reach besides 443 and 80 when no port list is set.
    p.connect_default.extend([ECHO_PORT, OTHER_PORT]);
    p
}

/// Every character a password may hold.
fn every_allowed_character() -> String {
    ('A'..='Z')
        .chain('a'..='z')
        .chain('0'..='9')
        .chain(PASSWORD_PUNCT.chars())
        .collect()
}

const HTTP: &[&str] = &["-x", "http://127.0.0.1:3128"];
const HTTP_CONNECT: &[&str] = &["-p", "-x", "http://127.0.0.1:3128"];
const SOCKS: &[&str] = &["--socks5-hostname", "127.0.0.1:3128"];

fn url(host: &str, port: u16) -> String {
    format!("http://{host}:{port}/")
}

#[test]
fn tinyproxy_refuses_internal_destinations_through_the_guest_firewall() {
    require("/usr/bin/tinyproxy");
    let mut ns = Netns::new();
    let ud = render(
        &settings(ProxyProtocol::Http, &["127.0.0.0/8"]),
        None,
        &policy(&[], Destinations::default()),
    )
    .unwrap();
    ns.firewall(&ud);
    ns.tinyproxy(&ud);
    for how in [HTTP, HTTP_CONNECT] {
        ns.fetch(how, &url(PUBLIC, ECHO_PORT))
            .unwrap_or_else(|e| panic!("a public destination passes ({how:?}): {e}"));
        ns.fetch(how, &url("public.example.com", OTHER_PORT))
            .unwrap();
        for denied in [
            PRIVATE,
            METADATA,
            "127.0.0.1",
            "internal.example.com",
            "localhost",
        ] {
            let r = ns.fetch(how, &url(denied, ECHO_PORT));
            assert!(r.is_err(), "{denied} must be refused ({how:?})");
        }
    }
}

#[test]
fn tinyproxy_passes_only_the_allowed_domains_and_ports() {
    require("/usr/bin/tinyproxy");
    let mut ns = Netns::new();
    let spec = Destinations {
        domains: vec!["public.example.com".into(), "*.example.net".into()],
        cidrs: vec![],
        ports: vec![ECHO_PORT],
    };
    let ud = render(
        &settings(ProxyProtocol::Http, &["127.0.0.0/8"]),
        None,
        &policy(&[], spec),
    )
    .unwrap();
    ns.firewall(&ud);
    ns.tinyproxy(&ud);
    for how in [HTTP, HTTP_CONNECT] {
        ns.fetch(how, &url("public.example.com", ECHO_PORT))
            .unwrap();
        ns.fetch(how, &url("other.example.net", ECHO_PORT)).unwrap();
        for (host, port, why) in [
            (PUBLIC, ECHO_PORT, "an IP address is not an allowed domain"),
            ("public.example.com", OTHER_PORT, "the port is not allowed"),
            (
                "internal.example.com",
                ECHO_PORT,
                "the domain is not allowed",
            ),
        ] {
            assert!(
                ns.fetch(how, &url(host, port)).is_err(),
                "{host}:{port} ({how:?}): {why}"
            );
        }
    }
}

#[test]
fn dante_passes_only_the_allowed_domains_and_the_firewall_only_the_allowed_ports() {
    require("/usr/sbin/danted");
    // NB: a suffix only: dante resolves the exact names in its rules and then also passes a
    // client asking for their addresses (documented); a suffix cannot be resolved, so
    // here an address matches nothing.
    let spec = Destinations {
        domains: vec!["*.example.net".into()],
        cidrs: vec![],
        ports: vec![ECHO_PORT],
    };
    let ud = render(
        &settings(ProxyProtocol::Socks5, &["127.0.0.0/8"]),
        None,
        &policy(&[], spec),
    )
    .unwrap();
    let mut ns = Netns::new();
    ns.firewall(&ud);
    ns.danted(&staged(&ud, "danted.conf"));
    ns.fetch(SOCKS, &url("other.example.net", ECHO_PORT))
        .unwrap();
    for (host, port, why) in [
        (
            "public.example.com",
            ECHO_PORT,
            "the domain is not allowed (the same address as an allowed one)",
        ),
        (PUBLIC, ECHO_PORT, "an IP address is not an allowed domain"),
        ("other.example.net", OTHER_PORT, "the port is not allowed"),
        (
            "internal.example.com",
            ECHO_PORT,
            "the domain is not allowed",
        ),
    ] {
        assert!(
            ns.fetch(SOCKS, &url(host, port)).is_err(),
            "{host}:{port}: {why}"
        );
    }
}

#[test]
fn dante_refuses_internal_destinations_by_its_rules_and_by_the_firewall() {
    require("/usr/sbin/danted");
    let ud = render(
        &settings(ProxyProtocol::Socks5, &["127.0.0.0/8"]),
        None,
        &policy(&[], Destinations::default()),
    )
    .unwrap();
    let conf = staged(&ud, "danted.conf");
    // dante's own rules, no firewall.
    {
        let mut ns = Netns::new();
        ns.danted(&conf);
        ns.fetch(SOCKS, &url("public.example.com", ECHO_PORT))
            .unwrap();
        for denied in [PRIVATE, METADATA, "127.0.0.1", "internal.example.com"] {
            assert!(
                ns.fetch(SOCKS, &url(denied, ECHO_PORT)).is_err(),
                "{denied} (rules)"
            );
        }
    }
    // The firewall alone: a dante passing everything is still held by it.
    {
        let mut ns = Netns::new();
        ns.firewall(&ud);
        let start = conf
            .find("socks block {\n  from: 0/0 to: 0.0.0.0/8")
            .unwrap();
        let open = format!(
            "{}socks pass {{\n  from: 0/0 to: 0/0\n  command: connect\n}}\n",
            &conf[..start]
        );
        ns.danted(&open);
        ns.fetch(SOCKS, &url("public.example.com", ECHO_PORT))
            .unwrap();
        for denied in [PRIVATE, METADATA, "127.0.0.1", "internal.example.com"] {
            assert!(
                ns.fetch(SOCKS, &url(denied, ECHO_PORT)).is_err(),
                "{denied} (firewall)"
            );
        }
    }
}

#[test]
fn an_entry_can_lift_an_internal_network_and_a_proxy_can_narrow_to_it() {
    require("/usr/bin/tinyproxy");
    require("/usr/sbin/danted");
    // The admin lifts 10.9.9.0/24 (e.g. an internal service); loopback stays denied.
    let narrowed = Destinations {
        cidrs: vec!["10.9.9.0/24".into()],
        ..Destinations::default()
    };
    for (proto, how) in [(ProxyProtocol::Http, HTTP), (ProxyProtocol::Socks5, SOCKS)] {
        for (spec, public_passes) in [(Destinations::default(), true), (narrowed.clone(), false)] {
            let mut ns = Netns::new();
            let p = policy(&["10.9.9.0/24"], spec);
            let ud = render(&settings(proto, &["127.0.0.0/8"]), None, &p).unwrap();
            ns.firewall(&ud);
            match proto {
                ProxyProtocol::Http => ns.tinyproxy(&ud),
                ProxyProtocol::Socks5 => ns.danted(&staged(&ud, "danted.conf")),
            }
            ns.fetch(how, &url(PRIVATE, ECHO_PORT)).unwrap();
            assert_eq!(
                ns.fetch(how, &url(PUBLIC, ECHO_PORT)).is_ok(),
                public_passes,
                "{proto:?}"
            );
            assert!(
                ns.fetch(how, &url("127.0.0.1", ECHO_PORT)).is_err(),
                "{proto:?}"
            );
            assert!(
                ns.fetch(how, &url(METADATA, ECHO_PORT)).is_err(),
                "{proto:?}"
            );
        }
    }
}

#[test]
fn tinyproxy_starts_with_a_password_of_every_allowed_character_and_checks_it() {
    require("/usr/bin/tinyproxy");
    let mut ns = Netns::new();
    let pw = every_allowed_character();
    let creds = ProxyCredentials {
        username: "alice".into(),
        password: pw.clone(),
    };
    let ud = render(
        &settings(ProxyProtocol::Http, &[]),
        Some(&creds),
        &policy(&[], Destinations::default()),
    )
    .unwrap();
    ns.firewall(&ud);
    ns.tinyproxy(&ud);
    let good = format!("alice:{pw}");
    let mut how = HTTP.to_vec();
    how.extend(["-U", &good]);
    ns.fetch(&how, &url(PUBLIC, ECHO_PORT)).unwrap();
    let bad = format!("alice:{pw}x");
    let mut how = HTTP.to_vec();
    how.extend(["-U", &bad]);
    let e = ns.fetch(&how, &url(PUBLIC, ECHO_PORT)).unwrap_err();
    assert!(
        e.contains("401") || e.contains("407"),
        "refused for its password: {e}"
    );
}

#[test]
fn tinyproxy_does_not_start_with_the_punctuation_the_password_rules_exclude() {
    // Why the password character set is what it is: of the punctuation once accepted,
    // tinyproxy 1.11 parses only `-`, `.` and `_` in BasicAuth and refuses to start on the
    // rest.
    require("/usr/bin/tinyproxy");
    let dir = tempfile::tempdir().unwrap();
    let mut starts = String::new();
    for (i, ch) in "!%*+,-./=?@^_~".chars().enumerate() {
        let path = dir.path().join(format!("t{i}.conf"));
        std::fs::write(
            &path,
            format!(
                "Listen 127.0.0.1\nPort {}\nBasicAuth alice abc{ch}def\n",
                free_port()
            ),
        )
        .unwrap();
        let mut child = Command::new("/usr/bin/tinyproxy")
            .args(["-d", "-c", path.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        let exited = loop {
            if child.try_wait().unwrap().is_some() {
                break true;
            }
            if t0.elapsed() > PARSE_GRACE {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = child.kill();
        let _ = child.wait();
        if !exited {
            starts.push(ch);
        }
    }
    assert_eq!(starts, PASSWORD_PUNCT);
}

#[test]
fn dante_starts_with_username_auth_and_the_password_survives_the_start_script() {
    require("/usr/sbin/danted");
    let pw = every_allowed_character();
    let creds = ProxyCredentials {
        username: "alice".into(),
        password: pw.clone(),
    };
    let ud = render(
        &settings(ProxyProtocol::Socks5, &[]),
        Some(&creds),
        &policy(&[], Destinations::default()),
    )
    .unwrap();
    let mut ns = Netns::new();
    let conf = staged(&ud, "danted.conf");
    assert!(conf.contains("socksmethod: username\n"), "{conf}");
    ns.danted(&conf);
    // Without credentials the rendered dante refuses.
    assert!(ns.fetch(SOCKS, &url(PUBLIC, ECHO_PORT)).is_err());
    // The start script's chpasswd line, run by sh with chpasswd replaced by cat, hands
    // chpasswd exactly `user:password`.
    let script = staged(&ud, "start.sh");
    let line = script
        .lines()
        .find(|l| l.ends_with("| chpasswd"))
        .unwrap()
        .replace("| chpasswd", "| cat");
    let out = Command::new("sh").args(["-c", &line]).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("alice:{pw}\n")
    );
}

#[test]
fn the_start_script_never_sets_the_password_of_an_existing_account() {
    // `libvirt-qemu` exists on this machine (libvirt creates it) and is not on the reserved
    // list: the guest-side check is what refuses it. useradd and chpasswd are shell
    // functions here that only say they ran.
    assert!(
        Command::new("id")
            .arg("libvirt-qemu")
            .output()
            .unwrap()
            .status
            .success(),
        "libvirt-qemu is missing: run `bash .ci/setup-host` (libvirt-daemon-system)"
    );
    let script_for = |user: &str| {
        let creds = ProxyCredentials {
            username: user.into(),
            password: "s3cr3t-pw-16chars".into(),
        };
        let ud = render(
            &settings(ProxyProtocol::Socks5, &[]),
            Some(&creds),
            &policy(&[], Destinations::default()),
        )
        .unwrap();
        let script = staged(&ud, "start.sh");
        let from = script.find("if id -u").unwrap();
        let to = script.find("| chpasswd").unwrap() + "| chpasswd".len();
        format!(
            "useradd() {{ echo useradd; }}\nadduser() {{ echo adduser; }}\n\
             chpasswd() {{ echo chpasswd; }}\n{}\n",
            &script[from..to]
        )
    };
    let run = |s: String| Command::new("sh").args(["-c", &s]).output().unwrap();
    let existing = run(script_for("libvirt-qemu"));
    assert!(!existing.status.success());
    assert_eq!(String::from_utf8_lossy(&existing.stdout), "", "nothing ran");
    let fresh = run(script_for("ep-test-no-such-user"));
    assert!(fresh.status.success());
    assert_eq!(
        String::from_utf8_lossy(&fresh.stdout),
        "useradd\nchpasswd\n"
    );
}

#[test]
fn the_guests_default_gateway_is_refused_unless_the_entry_lifts_it() {
    // The gateway stands for the host: its address as the guest sees it.
    require("/usr/bin/tinyproxy");
    for (lift, passes) in [(&[][..], false), (&["203.0.113.0/24"][..], true)] {
        let mut ns = Netns::new();
        ns.add_gateway();
        let ud = render(
            &settings(ProxyProtocol::Http, &["127.0.0.0/8"]),
            None,
            &policy(lift, Destinations::default()),
        )
        .unwrap();
        ns.firewall(&ud);
        ns.tinyproxy(&ud);
        ns.fetch(HTTP, &url(PUBLIC, ECHO_PORT)).unwrap();
        assert_eq!(
            ns.fetch(HTTP, &url(GATEWAY, ECHO_PORT)).is_ok(),
            passes,
            "lifted: {lift:?}"
        );
    }
}

#[test]
fn the_start_and_firewall_scripts_are_valid_shell_and_the_openrc_service_renders() {
    let creds = ProxyCredentials {
        username: "alice".into(),
        password: "s3cr3t-pw-16chars".into(),
    };
    for proto in [ProxyProtocol::Http, ProxyProtocol::Socks5] {
        let ud = render(
            &settings(proto, &["10.0.0.0/8"]),
            Some(&creds),
            &policy(&[], Destinations::default()),
        )
        .unwrap();
        for name in ["start.sh", "firewall.sh"] {
            let o = Command::new("sh")
                .args(["-n", "-c", &staged(&ud, name)])
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "{proto:?} {name}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let script = staged(&ud, "start.sh");
        // Fail closed: when the firewall cannot be applied (here: no firewall script at
        // /etc/egress-proxy), the start script stops there.
        assert!(!Path::new("/etc/egress-proxy/firewall.sh").exists());
        let from = script
            .find("if ! sh /etc/egress-proxy/firewall.sh")
            .unwrap();
        let to = from + script[from..].find("\nfi\n").unwrap() + 4;
        let block = format!("{}echo still-running\n", &script[from..to]);
        let o = Command::new("sh").args(["-c", &block]).output().unwrap();
        assert!(!o.status.success(), "{proto:?}");
        assert_eq!(String::from_utf8_lossy(&o.stdout), "", "{proto:?}: stopped");
        // The systemd drop-in and the OpenRC service the start script writes, printed
        // instead of written.
        let line = script
            .lines()
            .find(|l| l.contains(".service.d/egress-proxy.conf"))
            .unwrap();
        let line = &line[..line.find(" > ").unwrap()];
        let o = Command::new("sh").args(["-c", line]).output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "[Service]\nExecStartPre=/bin/sh /etc/egress-proxy/firewall.sh\n"
        );
        let line = script
            .lines()
            .find(|l| l.contains("> /etc/init.d/egress-proxy-firewall"))
            .unwrap()
            .replace("> /etc/init.d/egress-proxy-firewall", "");
        // Every proxy service needs it: the conf.d lines, written into a scratch directory.
        let confd = tempfile::tempdir().unwrap();
        let needs = script
            .lines()
            .find(|l| l.contains("rc_need="))
            .unwrap()
            .replace("/etc/conf.d/", &format!("{}/", confd.path().display()));
        assert!(
            Command::new("sh")
                .args(["-c", &needs])
                .status()
                .unwrap()
                .success()
        );
        for svc in ["tinyproxy", "danted", "sockd"] {
            let text = std::fs::read_to_string(confd.path().join(svc)).unwrap_or_default();
            assert_eq!(text, "rc_need=\"egress-proxy-firewall\"\n", "{svc}");
        }
        let o = Command::new("sh").args(["-c", &line]).output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "#!/sbin/openrc-run\ndescription=\"egress-proxy destination firewall\"\n\
             depend() { need net; before tinyproxy danted sockd; }\n\
             start() { sh /etc/egress-proxy/firewall.sh; }\n"
        );
    }
}

/// The proxy address clients use in the client-network tests: the stand-in public address,
/// so a client's source is its `--interface` address (the proxy listens on every address,
/// as in the guest).
const PROXY_AT: &str = "198.51.100.1:3128";

impl Netns {
    /// Starts tinyproxy with `conf` exactly as rendered (no `Listen`: every address, the
    /// guest's dual-stack socket, which sees an IPv4 client as `::ffff:a.b.c.d`).
    fn tinyproxy_as_rendered(&mut self, conf: &str) {
        let dir = self.dir.path().to_owned();
        let path = dir.join("tinyproxy-any.conf");
        std::fs::write(&path, conf).unwrap();
        self.spawn(
            &["/usr/bin/tinyproxy", "-d", "-c", path.to_str().unwrap()],
            &dir,
        );
        self.wait_listening(PROXY_PORT);
    }

    /// Starts danted with `conf`, listening on every address as in the guest.
    fn danted_any(&mut self, conf: &str) {
        let dir = self.dir.path().to_owned();
        let conf = conf
            .replace("@EXTERNAL@", "lo")
            .replace("logoutput: syslog", "logoutput: stderr");
        let path = dir.join("danted-any.conf");
        std::fs::write(&path, conf).unwrap();
        self.spawn(
            &["/usr/sbin/danted", "-f", path.to_str().unwrap(), "-N", "1"],
            &dir,
        );
        self.wait_listening(PROXY_PORT);
    }

    /// Fetches the public echo through the proxy at [`PROXY_AT`] from the IPv4 client
    /// address `from`.
    fn fetch_from(&self, protocol: ProxyProtocol, from: &str) -> Result<(), String> {
        let how: Vec<&str> = match protocol {
            ProxyProtocol::Http => vec!["-x", "http://198.51.100.1:3128"],
            ProxyProtocol::Socks5 => vec!["--socks5-hostname", PROXY_AT],
        };
        let mut a = how;
        a.extend(["--interface", from]);
        self.fetch(&a, &url(PUBLIC, ECHO_PORT))
    }
}

/// Client lists that admit every IPv4 client: an IPv6 network holding the IPv4-mapped
/// range, and 256 networks each narrow enough on its own.
fn admitting_every_ipv4_client() -> Vec<(&'static str, Vec<String>)> {
    vec![
        ("::/32", vec!["::/32".to_owned()]),
        ("::/80", vec!["::/80".to_owned()]),
        (
            "256 x /8",
            (0..=255).map(|a| format!("{a}.0.0.0/8")).collect(),
        ),
    ]
}

#[test]
fn tinyproxy_admits_an_ipv4_client_under_an_ipv6_network_holding_the_mapped_range() {
    // The attack, shown on this machine's tinyproxy: the control for the refusals below.
    require("/usr/bin/tinyproxy");
    let mut ns = Netns::new();
    let ud = render(
        &settings(ProxyProtocol::Http, &["2001:db8::/32"]),
        None,
        &policy(&[], Destinations::default()),
    )
    .unwrap();
    let conf = staged(&ud, "tinyproxy.conf").replace("Allow 2001:db8::/32", "Allow ::/32");
    ns.tinyproxy_as_rendered(&conf);
    ns.fetch_from(ProxyProtocol::Http, PRIVATE)
        .unwrap_or_else(|e| panic!("tinyproxy with `Allow ::/32` admits IPv4 clients: {e}"));
}

#[test]
fn client_lists_admitting_every_ipv4_client_are_refused_and_never_rendered() {
    require("/usr/bin/tinyproxy");
    require("/usr/sbin/danted");
    for (what, cidrs) in admitting_every_ipv4_client() {
        for protocol in [ProxyProtocol::Http, ProxyProtocol::Socks5] {
            let s = settings(protocol, &[]);
            let s = ProxySettings {
                allowed_client_cidrs: cidrs.clone(),
                ..s
            };
            // Refused where a Proxy is validated (both drivers, `check --no-probe`)...
            let spec = egress_core::model::ProxySpec {
                provider: "home".into(),
                host: None,
                image: "debian-12".into(),
                resources: Default::default(),
                proxy: s.clone(),
                egress: Default::default(),
            };
            let errs = spec.validate();
            assert!(
                errs.iter()
                    .any(|e| e.path == "spec.proxy.allowedClientCidrs"),
                "{what}: {errs:?}"
            );
            // ...and by the renderer, with credentials too.
            let creds = ProxyCredentials {
                username: "alice".into(),
                password: "a-long-enough-password".into(),
            };
            for c in [None, Some(&creds)] {
                match render(&s, c, &policy(&[], Destinations::default())) {
                    Err(e) => assert!(
                        e.to_string().starts_with("spec.proxy.allowedClientCidrs:"),
                        "{what}: {e}"
                    ),
                    Ok(ud) => {
                        // What a guest would run: an IPv4 client outside every intended
                        // network must still be refused by the real daemon.
                        let mut ns = Netns::new();
                        match protocol {
                            ProxyProtocol::Http => {
                                ns.tinyproxy_as_rendered(&staged(&ud, "tinyproxy.conf"));
                            }
                            ProxyProtocol::Socks5 => ns.danted_any(&staged(&ud, "danted.conf")),
                        }
                        let r = ns.fetch_from(protocol, PRIVATE);
                        panic!(
                            "{what} ({protocol:?}) was rendered; an IPv4 client from \
                             {PRIVATE} got {r:?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn mapped_client_networks_are_rendered_as_ipv4_and_admit_only_their_clients() {
    require("/usr/bin/tinyproxy");
    require("/usr/sbin/danted");
    for protocol in [ProxyProtocol::Http, ProxyProtocol::Socks5] {
        let ud = render(
            &settings(protocol, &["::ffff:198.51.100.0/120"]),
            None,
            &policy(&[], Destinations::default()),
        )
        .unwrap();
        let mut ns = Netns::new();
        match protocol {
            ProxyProtocol::Http => {
                let conf = staged(&ud, "tinyproxy.conf");
                assert!(conf.contains("Allow 198.51.100.0/24\n"), "{conf}");
                ns.tinyproxy_as_rendered(&conf);
            }
            ProxyProtocol::Socks5 => {
                let conf = staged(&ud, "danted.conf");
                assert!(conf.contains("from: 198.51.100.0/24 to: 0/0"), "{conf}");
                ns.danted_any(&conf);
            }
        }
        ns.fetch_from(protocol, PUBLIC)
            .unwrap_or_else(|e| panic!("{protocol:?}: a client inside passes: {e}"));
        assert!(
            ns.fetch_from(protocol, PRIVATE).is_err(),
            "{protocol:?}: a client outside is refused"
        );
    }
}

/// IPv6 destinations in the translation and tunnel ranges of the shared deny list, each
/// reaching the stand-in public address on a NAT64 or 6to4 segment, and a control.
const NAT64: &str = "64:ff9b::c633:6401";
const SIXTOFOUR: &str = "2002:c633:6401::1";
const V6_CONTROL: &str = "2001:db8::1";
const V6_PORT: u16 = 8082;

impl Netns {
    /// Puts [`NAT64`], [`SIXTOFOUR`] and [`V6_CONTROL`] on loopback with an HTTP server on
    /// [`V6_PORT`] answering on all of them.
    fn add_translated(&mut self) {
        for a in [NAT64, SIXTOFOUR, V6_CONTROL] {
            run(&[
                "ip",
                "-n",
                &self.name,
                "-6",
                "addr",
                "add",
                &format!("{a}/128"),
                "dev",
                "lo",
            ]);
        }
        let dir = self.dir.path().to_owned();
        let p = V6_PORT.to_string();
        self.spawn(&["python3", "-m", "http.server", &p, "--bind", "::"], &dir);
        self.wait_http(&format!("http://[{V6_CONTROL}]:{V6_PORT}/"));
    }
}

#[test]
fn nat64_and_6to4_destinations_are_refused_by_the_real_proxies() {
    require("/usr/bin/tinyproxy");
    require("/usr/sbin/danted");
    for protocol in [ProxyProtocol::Http, ProxyProtocol::Socks5] {
        let ud = render(
            &settings(protocol, &["127.0.0.0/8"]),
            None,
            &policy(&[], Destinations::default()),
        )
        .unwrap();
        let mut ns = Netns::new();
        ns.add_translated();
        ns.firewall(&ud);
        let how = match protocol {
            ProxyProtocol::Http => {
                ns.tinyproxy(&ud);
                HTTP
            }
            ProxyProtocol::Socks5 => {
                ns.danted(&staged(&ud, "danted.conf"));
                SOCKS
            }
        };
        let at = |a: &str| format!("http://[{a}]:{V6_PORT}/");
        ns.fetch(how, &at(V6_CONTROL))
            .unwrap_or_else(|e| panic!("{protocol:?}: the IPv6 control passes: {e}"));
        for denied in [NAT64, SIXTOFOUR] {
            assert!(
                ns.fetch(how, &at(denied)).is_err(),
                "{protocol:?}: {denied} must be refused"
            );
        }
    }
}

#[test]
fn the_sshd_drop_in_for_socks_users_is_accepted_by_the_real_sshd_and_denies_them() {
    require("/usr/sbin/sshd");
    let creds = ProxyCredentials {
        username: "alice".into(),
        password: "a-long-enough-password".into(),
    };
    let ud = render(
        &settings(ProxyProtocol::Socks5, &["10.0.0.0/8"]),
        Some(&creds),
        &policy(&[], Destinations::default()),
    )
    .unwrap();
    let script = staged(&ud, "start.sh");
    // The drop-in as the start script writes it (its printf run as is).
    let line = script
        .lines()
        .find(|l| l.trim_start().starts_with("printf 'DenyUsers"))
        .unwrap_or_else(|| panic!("{script}"));
    let printf = line.trim().split(" > ").next().unwrap().to_owned();
    let out = run(&["sh", "-c", &printf]);
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    run(&[
        "ssh-keygen",
        "-q",
        "-t",
        "ed25519",
        "-N",
        "",
        "-f",
        key.to_str().unwrap(),
    ]);
    let cfg = dir.path().join("sshd_config");
    std::fs::write(
        &cfg,
        format!(
            "HostKey {}\nPidFile none\nPasswordAuthentication yes\n{}",
            key.display(),
            String::from_utf8_lossy(&out.stdout)
        ),
    )
    .unwrap();
    run(&["/usr/sbin/sshd", "-t", "-f", cfg.to_str().unwrap()]);
    let eff = run(&[
        "/usr/sbin/sshd",
        "-T",
        "-f",
        cfg.to_str().unwrap(),
        "-C",
        "user=alice,host=client,addr=192.0.2.1",
    ]);
    let eff = String::from_utf8_lossy(&eff.stdout).to_lowercase();
    for want in [
        "denyusers alice",
        "allowtcpforwarding no",
        "permittunnel no",
        "forcecommand /bin/false",
    ] {
        assert!(eff.lines().any(|l| l == want), "{want} missing:\n{eff}");
    }
}
