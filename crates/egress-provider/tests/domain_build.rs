//! The seed, the host capabilities and the domain XML: rendered, parsed, read back by real
//! tools (`isoinfo`, `blkid`, `sh`), and defined and started on the real libvirtd (TCG).
//!
//! Real-daemon tests use unique `eptest-` names printed before creation, a pool of their own in
//! a temp dir, Drop guards that clean up with `virsh` on every path, and never attach a NIC to
//! anything outside: the NIC variant is only defined, never started.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use ep_test_support::cleanup;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use egress_provider::libvirt::caps::{
    self, CpuMode, DomainCapabilities, FirmwareChoice, HostCaps, Virt,
};
use egress_provider::libvirt::config::{Firmware, GuestSettings, ImageFormat, VirtType};
use egress_provider::libvirt::domain_xml::{self, Backing, DiskSource, DomainSpec, Nic, NicAttach};
use egress_provider::libvirt::seed::{self, SeedInput};
use egress_provider::libvirt::{mark, names};
use egress_provider::{ErrorClass, ProxyUid};
use libvirt_remote::client::{domain_state, undefine};
use libvirt_remote::transport;
use libvirt_remote::{Client, OpenOptions, UploadOptions};

const CAPS: &str = include_str!("../../testing/libvirt-fake/fixtures/capabilities.xml");
const DOMCAPS_QEMU: &str =
    include_str!("../../testing/libvirt-fake/fixtures/domcapabilities-qemu-x86_64.xml");

/// Bound on one real-daemon test body (they define, start and stop tiny TCG domains).
// NB: a start under TCG answers in ~1 s here; 120 s is generous for a loaded 2-core box.
const REAL_BUDGET: Duration = Duration::from_secs(120);
/// Per-call deadline given to `caps::probe`.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn uid() -> ProxyUid {
    ProxyUid::parse_strict("0f8fad5b-d9cb-469f-a165-70867728950e").unwrap()
}

fn random_uid() -> ProxyUid {
    let n = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let mixed = n ^ (u128::from(std::process::id()) << 64) ^ 0x5a5a_1234_u128;
    let mut b = uuid::Builder::from_u128(mixed);
    b.set_variant(uuid::Variant::RFC4122);
    b.set_version(uuid::Version::Random);
    ProxyUid(b.into_uuid())
}

fn parsed_caps() -> caps::HostCapabilities {
    caps::parse_capabilities(CAPS).unwrap()
}

fn qemu_domcaps() -> DomainCapabilities {
    caps::parse_domain_capabilities(DOMCAPS_QEMU).unwrap()
}

/// The fixture's domain capabilities as a host with working KVM would answer for `kvm`.
fn kvm_domcaps(passthrough: bool) -> DomainCapabilities {
    let xml = DOMCAPS_QEMU.replace("<domain>qemu</domain>", "<domain>kvm</domain>");
    let xml = if passthrough {
        xml.replace(
            "<mode name='host-passthrough' supported='no'/>",
            "<mode name='host-passthrough' supported='yes'/>",
        )
    } else {
        xml
    };
    caps::parse_domain_capabilities(&xml).unwrap()
}

fn fixture_hostcaps() -> HostCaps {
    caps::choose(
        "h1",
        VirtType::Qemu,
        &parsed_caps(),
        None,
        Some(&qemu_domcaps()),
    )
    .unwrap()
}

// ---------------------------------------------------------------- capabilities

#[test]
fn the_hosts_fixture_capabilities_parse_into_arches_machines_and_limits() {
    let c = parsed_caps();
    assert_eq!(c.host_cpus, 2);
    assert_eq!(c.host_memory_kib, 8_087_768);
    let g = c.guest("x86_64").unwrap();
    assert_eq!(g.domain_types, ["qemu", "kvm"]);
    assert_eq!(g.emulator.as_deref(), Some("/usr/bin/qemu-system-x86_64"));
    assert!(g.machines.iter().any(|m| m.name == "q35"
        && m.canonical.as_deref() == Some("pc-q35-10.0")
        && m.max_cpus == Some(4096)));
    assert_eq!(caps::pick_machine("h1", g).unwrap(), "q35");
    let d = qemu_domcaps();
    assert_eq!(d.domain, "qemu");
    assert_eq!(d.loaders, ["/usr/share/OVMF/OVMF_CODE_4M.fd"]);
    assert!(d.firmware.contains(&"efi".to_owned()));
    assert!(!d.cpu_modes.contains(&"host-passthrough".to_owned()));
    assert!(d.disk_buses.contains(&"virtio".to_owned()));
    let h = fixture_hostcaps();
    assert_eq!(h.virt, Virt::Qemu);
    assert_eq!(
        h.cpu_mode,
        CpuMode::EmulatorDefault,
        "no host CPU under TCG"
    );
    assert_eq!(h.max_vcpus, 2, "bounded by the host's CPUs");
    assert_eq!(h.max_memory_mib, 8_087_768 / 1024);
    assert_eq!(
        h.firmware(Firmware::Uefi).unwrap(),
        FirmwareChoice::Uefi {
            loader: "/usr/share/OVMF/OVMF_CODE_4M.fd".into()
        }
    );
    assert!(h.rng_virtio);
}

#[test]
fn auto_does_not_pick_kvm_just_because_the_host_lists_it() {
    // finding: M7
    let c = parsed_caps();
    // Listed, domain capabilities answered, but QEMU could not enable KVM.
    let h = caps::choose(
        "h1",
        VirtType::Auto,
        &c,
        Some(&kvm_domcaps(false)),
        Some(&qemu_domcaps()),
    )
    .unwrap();
    assert_eq!(h.virt, Virt::Qemu);
    // Listed but the daemon refused kvm domain capabilities.
    let h = caps::choose("h1", VirtType::Auto, &c, None, Some(&qemu_domcaps())).unwrap();
    assert_eq!(h.virt, Virt::Qemu);
    // KVM really enabled: auto takes it, with host-passthrough.
    let h = caps::choose("h1", VirtType::Auto, &c, Some(&kvm_domcaps(true)), None).unwrap();
    assert_eq!((h.virt, h.cpu_mode), (Virt::Kvm, CpuMode::HostPassthrough));
}

#[test]
fn missing_capabilities_are_permanent_and_name_the_host_and_the_capability() {
    // finding: M7
    let c = parsed_caps();
    let e = caps::choose("h1", VirtType::Kvm, &c, Some(&kvm_domcaps(false)), None).unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(
        e.message.contains("host h1") && e.message.contains("virtType kvm"),
        "{e}"
    );

    let arm = caps::parse_capabilities(&CAPS.replace("name='x86_64'", "name='aarch64'")).unwrap();
    let e = caps::choose("h1", VirtType::Qemu, &arm, None, Some(&qemu_domcaps())).unwrap_err();
    assert!(e.is_permanent());
    assert!(
        e.message.contains("host h1") && e.message.contains("x86_64"),
        "{e}"
    );

    let no_loader = caps::parse_domain_capabilities(
        &DOMCAPS_QEMU.replace("<loader supported='yes'>", "<loader supported='no'>"),
    )
    .unwrap();
    let h = caps::choose("h1", VirtType::Qemu, &c, None, Some(&no_loader)).unwrap();
    assert_eq!(h.firmware(Firmware::Bios).unwrap(), FirmwareChoice::Bios);
    let e = h.firmware(Firmware::Uefi).unwrap_err();
    assert!(e.is_permanent());
    assert!(
        e.message.contains("host h1") && e.message.contains("UEFI"),
        "{e}"
    );
    // The domain XML refuses too, before anything reaches libvirt.
    let e = domain_xml::build(
        &DomainSpec {
            firmware: Firmware::Uefi,
            ..spec_fixture()
        },
        &h,
    )
    .unwrap_err();
    assert!(e.is_permanent() && e.message.contains("UEFI"), "{e}");

    let no_virtio = caps::parse_domain_capabilities(&DOMCAPS_QEMU.replace(
        "<value>virtio</value>\n        <value>usb</value>",
        "<value>usb</value>",
    ))
    .unwrap();
    let e = caps::choose("h1", VirtType::Qemu, &c, None, Some(&no_virtio)).unwrap_err();
    assert!(
        e.is_permanent() && e.message.contains("virtio disks"),
        "{e}"
    );
}

// ---------------------------------------------------------------- domain XML

fn spec_fixture() -> DomainSpec<'static> {
    static UID: std::sync::OnceLock<ProxyUid> = std::sync::OnceLock::new();
    DomainSpec {
        name: "ep-home-0f8fad5bd9cb469fa16570867728950e",
        uuid: None,
        vcpus: 1,
        memory_mib: 256,
        firmware: Firmware::Bios,
        root: DiskSource::File("/var/lib/pool/root.qcow2"),
        backing: Some(Backing {
            path: "/var/lib/pool/base.qcow2",
            format: ImageFormat::Qcow2,
            below: None,
        }),
        seed: DiskSource::Volume {
            pool: "pool",
            volume: "seed.iso",
        },
        nic: Some(Nic {
            attach: NicAttach::Bridge("br0"),
            mac: "52:54:00:aa:bb:cc",
            filter: None,
            filter_params: &[],
        }),
        uid: UID.get_or_init(uid),
        entry: "home",
        created_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000),
        installation: None,
        addresses: &[],
    }
}

/// (element path, attributes) of every element of `xml`, parsed back with quick-xml.
fn elements(xml: &str) -> Vec<(String, Vec<(String, String)>)> {
    use quick_xml::events::{BytesStart, Event};
    fn attrs(e: &BytesStart<'_>) -> Vec<(String, String)> {
        e.attributes()
            .map(|a| {
                let a = a.unwrap();
                (
                    a.key.as_ref().to_owned(),
                    a.normalized_value(quick_xml::XmlVersion::Implicit1_0)
                        .unwrap()
                        .into_owned(),
                )
            })
            .collect()
    }
    let mut r = quick_xml::Reader::from_str(xml);
    let mut path: Vec<String> = Vec::new();
    let mut out = Vec::new();
    loop {
        match r.read_event().unwrap() {
            Event::Start(e) => {
                path.push(e.name().as_ref().to_owned());
                out.push((path.join("/"), attrs(&e)));
            }
            Event::Empty(e) => {
                let name = e.name().as_ref().to_owned();
                out.push((format!("{}/{name}", path.join("/")), attrs(&e)));
            }
            Event::End(_) => {
                path.pop();
            }
            Event::Eof => break,
            _ => {}
        }
    }
    out
}

fn attr<'a>(els: &'a [(String, Vec<(String, String)>)], path: &str, key: &str) -> Vec<&'a str> {
    els.iter()
        .filter(|(p, _)| p == path)
        .flat_map(|(_, a)| a.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()))
        .collect()
}

#[test]
fn the_domain_xml_has_every_device_the_design_lists() {
    let xml = domain_xml::build(&spec_fixture(), &fixture_hostcaps()).unwrap();
    println!("{xml}");
    let els = elements(&xml);
    assert_eq!(attr(&els, "domain", "type"), ["qemu"]);
    assert_eq!(attr(&els, "domain/os/type", "machine"), ["pc-i440fx-10.0"]);
    assert_eq!(
        attr(&els, "domain/devices/disk/target", "dev"),
        ["vda", "vdb"]
    );
    assert_eq!(
        attr(&els, "domain/devices/disk/target", "bus"),
        ["virtio", "virtio"]
    );
    assert_eq!(
        attr(&els, "domain/devices/disk", "device"),
        ["disk", "disk"],
        "the seed is a disk, never a cdrom"
    );
    assert_eq!(
        els.iter()
            .filter(|(p, _)| p == "domain/devices/disk/readonly")
            .count(),
        1
    );
    assert_eq!(
        attr(&els, "domain/devices/disk/source", "volume"),
        ["seed.iso"]
    );
    assert_eq!(
        attr(&els, "domain/devices/disk/backingStore/source", "file"),
        ["/var/lib/pool/base.qcow2"]
    );
    assert_eq!(
        attr(&els, "domain/devices/interface/mac", "address"),
        ["52:54:00:aa:bb:cc"]
    );
    assert_eq!(
        attr(&els, "domain/devices/interface/model", "type"),
        ["virtio"]
    );
    assert_eq!(
        attr(&els, "domain/devices/channel/target", "name"),
        ["org.qemu.guest_agent.0"]
    );
    assert_eq!(attr(&els, "domain/devices/serial", "type"), ["pty"]);
    assert_eq!(attr(&els, "domain/devices/console", "type"), ["pty"]);
    assert!(
        els.iter().all(|(p, _)| p != "domain/cpu"),
        "TCG: no cpu element"
    );
    assert!(xml.contains("<emulator>/usr/bin/qemu-system-x86_64</emulator>"));
    // The mark inside <metadata> parses back as ours.
    let start = xml.find("<ep:instance").unwrap();
    let end = xml.find("</ep:instance>").unwrap() + "</ep:instance>".len();
    let m = mark::parse(&xml[start..end], "home", SystemTime::now()).unwrap();
    assert_eq!(m.uid, uid());
}

#[test]
fn hostile_values_are_escaped_or_refused_never_spliced_into_the_markup() {
    let caps = fixture_hostcaps();
    let evil = "br0'/><interface type='direct'/><x a='";
    let path = "/pool/a&b<c>\"d'.qcow2";
    let xml = domain_xml::build(
        &DomainSpec {
            root: DiskSource::File(path),
            nic: Some(Nic {
                attach: NicAttach::Network(evil),
                mac: "52:54:00:aa:bb:cc",
                filter: None,
                filter_params: &[],
            }),
            ..spec_fixture()
        },
        &caps,
    )
    .unwrap();
    let els = elements(&xml);
    assert_eq!(
        attr(&els, "domain/devices/interface/source", "network"),
        [evil]
    );
    assert_eq!(attr(&els, "domain/devices/interface", "type"), ["network"]);
    assert_eq!(
        attr(&els, "domain/devices/disk/source", "file"),
        [path],
        "{xml}"
    );
    assert!(!els.iter().any(|(p, _)| p.ends_with("/x")));
    // An entry the mark cannot carry verbatim is refused: its domain could never be
    // recognised (nor deleted) again.
    let e = domain_xml::build(
        &DomainSpec {
            entry: "ho<me>&",
            ..spec_fixture()
        },
        &caps,
    )
    .unwrap_err();
    assert!(e.is_permanent() && e.message.contains("entry name"), "{e}");

    for bad in [
        DomainSpec {
            name: "ep-x'/><devices>",
            ..spec_fixture()
        },
        DomainSpec {
            nic: Some(Nic {
                attach: NicAttach::Bridge("br\u{1}0"),
                mac: "52:54:00:aa:bb:cc",
                filter: None,
                filter_params: &[],
            }),
            ..spec_fixture()
        },
        DomainSpec {
            nic: Some(Nic {
                attach: NicAttach::Bridge("br0"),
                mac: "52:54:00:AA:BB:CC'",
                filter: None,
                filter_params: &[],
            }),
            ..spec_fixture()
        },
        DomainSpec {
            root: DiskSource::File("relative.qcow2"),
            ..spec_fixture()
        },
    ] {
        let e = domain_xml::build(&bad, &caps).unwrap_err();
        assert!(e.is_permanent(), "{e}");
    }
}

#[test]
fn vcpus_and_memory_are_refused_at_zero_and_above_the_hosts_limits() {
    // finding: L11
    let caps = fixture_hostcaps();
    let cases = [
        (0, 256, "vcpus"),
        (3, 256, "vcpus 3"),
        (1, 0, "memory"),
        (1, 8_000_000, "memory 8000000 MiB"),
    ];
    for (vcpus, memory_mib, needle) in cases {
        let e = domain_xml::build(
            &DomainSpec {
                vcpus,
                memory_mib,
                ..spec_fixture()
            },
            &caps,
        )
        .unwrap_err();
        assert!(e.is_permanent(), "{e}");
        assert!(e.message.contains(needle), "{needle}: {e}");
    }
    let e = domain_xml::build(
        &DomainSpec {
            vcpus: 3,
            ..spec_fixture()
        },
        &caps,
    )
    .unwrap_err();
    assert!(
        e.message.contains("host h1") && e.message.contains('2'),
        "{e}"
    );
    domain_xml::build(
        &DomainSpec {
            vcpus: 2,
            memory_mib: caps.max_memory_mib,
            ..spec_fixture()
        },
        &caps,
    )
    .unwrap();
}

// ---------------------------------------------------------------- seed

fn guest(agent: bool, vendor: Option<&str>) -> GuestSettings {
    GuestSettings {
        install_guest_agent: agent,
        vendor_data: vendor.map(str::to_owned),
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_seed_iso_is_labelled_cidata_and_isoinfo_reads_every_file_exactly() {
    let user = "#cloud-config\nusers: []\nwrite_files:\n- path: /etc/x\n  content: \"é ü\"\n";
    let net = "version: 2\nethernets:\n  id0:\n    match: {macaddress: '52:54:00:aa:bb:cc'}\n    dhcp4: true\n";
    let g = guest(true, Some("#cloud-config\nntp: {enabled: true}\n"));
    let s = seed::build(&SeedInput {
        instance_id: &uid(),
        hostname: "proxy-1",
        user_data: user,
        network_config: Some(net),
        guest: &g,
    })
    .unwrap();
    assert_eq!(s.image.len() % 2048, 0);
    assert!(s.image.len() <= seed::MAX_SEED_BYTES);
    let dir = tempfile::tempdir().unwrap();
    let iso = dir.path().join("seed.iso");
    std::fs::write(&iso, &s.image).unwrap();
    let d = run(Command::new("isoinfo").arg("-d").arg("-i").arg(&iso));
    assert!(d.contains("Volume id: cidata"), "{d}");
    assert!(d.contains("Joliet"), "{d}");
    assert!(d.contains("Rock Ridge"), "{d}");
    let b = run(Command::new("blkid").arg("-p").arg(&iso));
    assert!(
        b.contains("LABEL=\"cidata\"") && b.contains("TYPE=\"iso9660\""),
        "{b}"
    );
    let want = [
        (
            "meta-data",
            "instance-id: 0f8fad5b-d9cb-469f-a165-70867728950e\nlocal-hostname: proxy-1\n"
                .to_owned(),
        ),
        ("user-data", user.to_owned()),
        ("network-config", net.to_owned()),
        ("vendor-data", seed::vendor_data(&g).unwrap().unwrap()),
    ];
    for (name, contents) in &want {
        for ext in ["-J", "-R"] {
            let got = run(Command::new("isoinfo")
                .arg(ext)
                .arg("-i")
                .arg(&iso)
                .arg("-x")
                .arg(format!("/{name}")));
            assert_eq!(&got, contents, "{name} via {ext}");
        }
    }
    assert_eq!(
        s.files
            .iter()
            .map(|(n, c)| (*n, c.clone()))
            .collect::<Vec<_>>(),
        want.iter()
            .map(|(n, c)| (*n, c.clone()))
            .collect::<Vec<_>>()
    );
}

#[test]
fn vendor_data_the_entry_configures_is_kept_never_dropped() {
    // finding: L13
    let own = "#cloud-config\nntp: {enabled: true}\n";
    // Alone: verbatim.
    assert_eq!(
        seed::vendor_data(&guest(false, Some(own)))
            .unwrap()
            .as_deref(),
        Some(own)
    );
    // With the agent: one multipart with both.
    let v = seed::vendor_data(&guest(true, Some(own))).unwrap().unwrap();
    assert!(
        v.starts_with("Content-Type: multipart/mixed; boundary=\""),
        "{v}"
    );
    assert!(v.contains("Content-Type: text/cloud-config"), "{v}");
    assert!(v.contains(own));
    assert!(v.contains("Content-Type: text/x-shellscript"));
    assert!(v.contains(&seed::agent_script()));
    // A multipart vendorData (dropped by the seed system) is nested, not dropped.
    let mime = "Content-Type: multipart/mixed; boundary=\"XX\"\nMIME-Version: 1.0\n\n--XX\n\
                Content-Type: text/x-shellscript\n\n#!/bin/sh\necho hi\n--XX--\n";
    let v = seed::vendor_data(&guest(true, Some(mime)))
        .unwrap()
        .unwrap();
    assert!(v.contains(mime), "{v}");
    // Something cloud-init would silently ignore is refused, naming the setting.
    let e = seed::vendor_data(&guest(true, Some("ntp: {enabled: true}\n"))).unwrap_err();
    assert!(
        e.is_permanent() && e.message.contains("guest.vendorData"),
        "{e}"
    );
    // Neither: no vendor-data at all.
    assert_eq!(seed::vendor_data(&guest(false, None)).unwrap(), None);
}

/// A directory of stub commands, each recording its arguments into `log` and exiting 0;
/// `NAME=STATE` makes `NAME is-enabled` answer `STATE` (as systemctl does: exit 0), a stub
/// without a state answers `disabled` (exit 1).
fn stubs(dir: &Path, names: &[&str], log: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for spec in names {
        let (n, state) = spec.split_once('=').unwrap_or((spec, ""));
        let p = dir.join(n);
        let answer = if state.is_empty() {
            "echo disabled; exit 1".to_owned()
        } else {
            format!("echo {state}; exit 0")
        };
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\necho \"{n} $*\" >> '{}'\n\
                 if [ \"$1\" = is-enabled ]; then {answer}; fi\nexit 0\n",
                log.display()
            ),
        )
        .unwrap();
        Command::new("chmod").arg("+x").arg(&p).status().unwrap();
    }
}

/// Runs the agent script with only `stubs` on PATH and `systemd` deciding whether the
/// systemd runtime directory exists; returns (stub calls, stderr).
fn run_agent_script(commands: &[&str], systemd: bool) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    let log = dir.path().join("calls.log");
    std::fs::write(&log, "").unwrap();
    stubs(&bin, commands, &log);
    let sd = dir.path().join("run-systemd-system");
    if systemd {
        std::fs::create_dir_all(&sd).unwrap();
    }
    let script = seed::agent_script()
        .replace(seed::SYSTEMD_RUNTIME_DIR, sd.to_str().unwrap())
        .replace(
            seed::SCRIPT_PATH_LINE,
            &format!("PATH={}; export PATH", bin.display()),
        );
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(&script)
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "the script must never fail the boot");
    (
        std::fs::read_to_string(&log).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_agent_script_installs_and_starts_the_agent_on_systemd_images() {
    // finding: L10
    let (calls, _) = run_agent_script(&["apt-get", "systemctl"], true);
    assert_eq!(
        calls,
        "apt-get update -q\napt-get install -y -q qemu-guest-agent\n\
         systemctl is-enabled qemu-guest-agent\nsystemctl enable qemu-guest-agent\n\
         systemctl start qemu-guest-agent\n"
    );
    // Already installed: nothing is installed, it is still started.
    let (calls, err) = run_agent_script(&["qemu-ga", "apt-get", "systemctl"], true);
    assert_eq!(
        calls,
        "systemctl is-enabled qemu-guest-agent\nsystemctl enable qemu-guest-agent\n\
         systemctl start qemu-guest-agent\n"
    );
    assert!(err.contains("already installed"), "{err}");
    // Static (Debian's unit, started by udev) or enabled: not enabled again (each `systemctl
    // enable` reloads systemd, seconds of a TCG boot), still started.
    for state in ["static", "enabled"] {
        let stub = format!("systemctl={state}");
        let (calls, _) = run_agent_script(&["qemu-ga", &stub], true);
        assert_eq!(
            calls, "systemctl is-enabled qemu-guest-agent\nsystemctl start qemu-guest-agent\n",
            "{state}"
        );
    }
}

#[test]
fn the_agent_script_installs_and_starts_the_agent_on_openrc_images() {
    // finding: L10
    let (calls, _) = run_agent_script(&["apk", "rc-update", "rc-service"], false);
    assert_eq!(
        calls,
        "apk add --no-cache qemu-guest-agent\nrc-update add qemu-guest-agent default\n\
         rc-service qemu-guest-agent start\n"
    );
    // systemctl present but not booted with systemd (a container-built image): OpenRC wins.
    let (calls, _) = run_agent_script(&["apk", "systemctl", "rc-update", "rc-service"], false);
    assert!(!calls.contains("systemctl"), "{calls}");
    // Neither init system: says so and still exits 0.
    let (calls, err) = run_agent_script(&["apk"], false);
    assert_eq!(calls, "apk add --no-cache qemu-guest-agent\n");
    assert!(err.contains("neither systemd nor OpenRC"), "{err}");
}

#[test]
fn invalid_seed_input_is_permanent_and_names_what_to_change() {
    // finding: M8
    let g = guest(true, None);
    let ok = SeedInput {
        instance_id: &uid(),
        hostname: "p1",
        user_data: "#cloud-config\n",
        network_config: None,
        guest: &g,
    };
    seed::build(&ok).unwrap();
    let big = format!("#cloud-config\n#{}\n", "x".repeat(seed::MAX_PAYLOAD_BYTES));
    for (input, needle) in [
        (
            SeedInput {
                hostname: "bad host",
                ..ok
            },
            "hostname",
        ),
        (
            SeedInput {
                user_data: "users: []",
                ..ok
            },
            "user-data",
        ),
        (
            SeedInput {
                network_config: Some(" "),
                ..ok
            },
            "network-config",
        ),
        (
            SeedInput {
                user_data: &big,
                ..ok
            },
            "payload",
        ),
    ] {
        let e = seed::build(&input).unwrap_err();
        assert!(e.is_permanent(), "{e}");
        assert!(e.message.contains(needle), "{needle}: {e}");
    }
}

/// The env var under which the child process of the next test does its part.
const NO_DISK_ENV: &str = "EPTEST_SEED_NO_DISK";

#[test]
fn the_seed_builds_with_no_writable_disk_and_writes_nothing() {
    // finding: M8, L26
    if std::env::var_os(NO_DISK_ENV).is_some() {
        // Child: TMPDIR does not exist and the cwd is read-only (the seed system's scenario:
        // a missing /tmp or a full disk). Building must still succeed.
        let s = seed::build(&SeedInput {
            instance_id: &uid(),
            hostname: "p1",
            user_data: "#cloud-config\n",
            network_config: None,
            guest: &guest(true, None),
        })
        .unwrap();
        assert!(!s.is_empty());
        println!("child built a {}-byte seed", s.len());
        return;
    }
    let watched = tempfile::tempdir().unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "the_seed_builds_with_no_writable_disk_and_writes_nothing",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(NO_DISK_ENV, "1")
        .env("TMPDIR", watched.path().join("does-not-exist"))
        .current_dir("/proc")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("child built a") && stdout.contains("1 passed"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_dir(watched.path()).unwrap().count(),
        0,
        "nothing was written"
    );
}

// ---------------------------------------------------------------- real libvirtd

async fn unix_client() -> Client {
    let t = transport::unix::connect(cleanup_socket(), transport::DEFAULT_DIAL_TIMEOUT)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "libvirtd unreachable ({e}): run `bash .ci/setup-host`; these tests fail, not skip"
            )
        });
    Client::open(t, OpenOptions::default()).await.unwrap()
}

fn cleanup_socket() -> std::path::PathBuf {
    std::env::var_os("EPTEST_LIBVIRT_SOCKET")
        .map(Into::into)
        .unwrap_or_else(|| transport::DEFAULT_SOCKET.into())
}

#[tokio::test]
async fn the_real_hosts_capabilities_resolve_qemu_and_auto_as_documented() {
    // finding: M7
    let c = unix_client().await;
    let raw = c.capabilities().await.unwrap();
    let parsed = caps::parse_capabilities(&raw).unwrap();
    assert!(parsed.guest("x86_64").is_some());
    assert!(parsed.host_cpus >= 1 && parsed.host_memory_kib > 0);

    let q = caps::probe(&c, "local", VirtType::Qemu, CALL_TIMEOUT)
        .await
        .unwrap();
    println!("qemu: {q:#?}");
    assert_eq!(q.virt, Virt::Qemu);
    assert!(q.machine.starts_with("pc-q35-"), "{}", q.machine);
    assert_eq!(q.cpu_mode, CpuMode::EmulatorDefault);
    assert!(q.uefi_loader.is_some(), "OVMF is installed here");
    assert!(
        !q.uefi_loader.as_deref().unwrap().contains("secboot"),
        "non-secure-boot loader preferred: {:?}",
        q.uefi_loaders
    );

    let a = caps::probe(&c, "local", VirtType::Auto, CALL_TIMEOUT)
        .await
        .unwrap();
    let kvm_xml = c
        .domain_capabilities(None, Some("x86_64"), Some("q35"), Some("kvm"))
        .await
        .ok()
        .and_then(|x| caps::parse_domain_capabilities(&x).ok());
    let expect = if kvm_xml.as_ref().is_some_and(caps::kvm_usable) {
        Virt::Kvm
    } else {
        Virt::Qemu
    };
    println!(
        "auto resolved to {:?} (kvm listed: {}; this host's KVM cannot start guests, so the \
         e2e config says qemu)",
        a.virt,
        a.listed_virt_types.contains(&"kvm".to_owned())
    );
    assert_eq!(a.virt, expect);
    c.close();
}

#[tokio::test]
async fn capabilities_probe_through_the_real_sshd() {
    // finding: M7
    use libvirt_remote::transport::ssh::{self, SshOptions};
    let sshd = ep_test_support::sshd::Sshd::start();
    let t = ssh::connect(&sshd.target(), &SshOptions::default())
        .await
        .unwrap_or_else(|e| panic!("ssh connect: {e}\n{}", sshd.log()));
    let c = Client::open(t, OpenOptions::default()).await.unwrap();
    let q = caps::probe(&c, "ssh-local", VirtType::Qemu, CALL_TIMEOUT)
        .await
        .unwrap();
    assert_eq!(q.virt, Virt::Qemu);
    assert!(q.machine.starts_with("pc-q35-"));
    c.close();
}

/// A pool with a tiny qcow2 base, an overlay backed by it and an uploaded seed volume.
struct Disks {
    pool: cleanup::PoolFixture,
    overlay_path: String,
    base_path: String,
    seed_vol: String,
}

async fn disks(c: &Client, test: &str, uid: &ProxyUid) -> Disks {
    let pool = cleanup::PoolFixture::create(test);
    let base = pool.file("base.qcow2");
    let overlay = pool.file("overlay.qcow2");
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&base)
        .arg("64M"));
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
        .arg(&base)
        .arg(&overlay)
        .arg("64M"));
    let p = c.pool_lookup_by_name(&pool.name).await.unwrap();
    c.pool_refresh(&p).await.unwrap();
    let g = guest(true, None);
    let s = seed::build(&SeedInput {
        instance_id: uid,
        hostname: "eptest",
        user_data: "#cloud-config\n",
        network_config: None,
        guest: &g,
    })
    .unwrap();
    let seed_vol = names::seed("eptest", uid);
    let v = c
        .vol_create_xml(
            &p,
            &format!(
                "<volume><name>{seed_vol}</name><capacity unit='bytes'>{}</capacity>\
                 <target><format type='raw'/></target></volume>",
                s.len()
            ),
            0,
        )
        .await
        .unwrap();
    let sent = c
        .vol_upload(&v, 0, s.len(), &s.image[..], &UploadOptions::default())
        .await
        .unwrap();
    assert_eq!(sent, s.len());
    // The uploaded volume is the image, byte for byte.
    assert_eq!(std::fs::read(pool.file(&seed_vol)).unwrap(), s.image);
    Disks {
        overlay_path: overlay.to_str().unwrap().to_owned(),
        base_path: base.to_str().unwrap().to_owned(),
        seed_vol,
        pool,
    }
}

#[tokio::test]
async fn a_generated_domain_defines_on_the_real_libvirtd_and_its_mark_reads_back() {
    // finding: M7, L11
    tokio::time::timeout(REAL_BUDGET, async {
        cleanup::sweep_once();
        let c = unix_client().await;
        let hc = caps::probe(&c, "local", VirtType::Qemu, CALL_TIMEOUT)
            .await
            .unwrap();
        let u = random_uid();
        let d = disks(&c, "dombuild-nic", &u).await;
        let dom_guard = cleanup::DomainGuard::new("dombuild-nic");
        let mac = names::mac("eptest", &u);
        // The expected address, computed without the production helper: `52` and the first
        // five bytes of sha256("<entry>/<uid>"), by coreutils (`54:00` as the first two is
        // QEMU's range and becomes `54:01`); the legacy one: QEMU's prefix and three bytes.
        let digest = run(Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s 'eptest/{}' | sha256sum", u.canonical())));
        let second = if &digest[0..4] == "5400" {
            "01"
        } else {
            &digest[2..4]
        };
        let expected_mac = format!(
            "52:{}:{second}:{}:{}:{}",
            &digest[0..2],
            &digest[4..6],
            &digest[6..8],
            &digest[8..10]
        );
        assert_eq!(mac, expected_mac);
        assert_eq!(
            names::legacy_mac("eptest", &u),
            format!(
                "52:54:00:{}:{}:{}",
                &digest[0..2],
                &digest[2..4],
                &digest[4..6]
            )
        );
        let created = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
        let xml = domain_xml::build(
            &DomainSpec {
                name: &dom_guard.name,
                uuid: None,
                vcpus: 1,
                memory_mib: 128,
                firmware: Firmware::Bios,
                root: DiskSource::File(&d.overlay_path),
                backing: Some(Backing {
                    path: &d.base_path,
                    format: ImageFormat::Qcow2,
                    below: None,
                }),
                seed: DiskSource::Volume {
                    pool: &d.pool.name,
                    volume: &d.seed_vol,
                },
                // NB: defined only, never started: nothing reaches a real bridge.
                nic: Some(Nic {
                    attach: NicAttach::Bridge("eptest-nobr0"),
                    mac: &mac,
                    filter: None,
                    filter_params: &[],
                }),
                uid: &u,
                entry: "eptest",
                created_at: created,
                installation: None,
                addresses: &[],
            },
            &hc,
        )
        .unwrap();
        let dom = c.domain_define_xml(&xml, 0).await.unwrap();
        let meta = c.domain_metadata(&dom, mark::NAMESPACE, 0).await.unwrap();
        let m = mark::parse(&meta, "eptest", SystemTime::now())
            .unwrap_or_else(|| panic!("libvirt returned a mark we cannot parse: {meta}"));
        assert_eq!((m.uid, m.created_at), (u, created));
        let back = c.domain_xml(&dom, 0).await.unwrap();
        assert!(
            back.contains(&format!("<mac address='{expected_mac}'/>")),
            "{back}"
        );
        assert!(back.contains("<target dev='vdb' bus='virtio'/>"), "{back}");
        assert!(back.contains("<readonly/>"), "{back}");
        assert!(back.contains("org.qemu.guest_agent.0"), "{back}");
        let (state, _) = c.domain_state(&dom).await.unwrap();
        assert_eq!(state, domain_state::SHUTOFF);
        c.domain_undefine(&dom, undefine::ALL_METADATA)
            .await
            .unwrap();
        assert!(c.domain_lookup_by_name(&dom_guard.name).await.is_err());
        c.close();
    })
    .await
    .expect("test body exceeded its budget; guards cleaned up");
}

async fn boots_to_running(test: &str, firmware: Firmware) {
    cleanup::sweep_once();
    let c = unix_client().await;
    let hc = caps::probe(&c, "local", VirtType::Qemu, CALL_TIMEOUT)
        .await
        .unwrap();
    let u = random_uid();
    let d = disks(&c, test, &u).await;
    let dom_guard = cleanup::DomainGuard::new(test);
    let xml = domain_xml::build(
        &DomainSpec {
            name: &dom_guard.name,
            uuid: Some(u.0),
            vcpus: 1,
            memory_mib: 128,
            firmware,
            root: DiskSource::Volume {
                pool: &d.pool.name,
                volume: "overlay.qcow2",
            },
            backing: None,
            seed: DiskSource::File(d.pool.file(&d.seed_vol).to_str().unwrap()),
            nic: None,
            uid: &u,
            entry: "eptest",
            created_at: SystemTime::now(),
            installation: None,
            addresses: &[],
        },
        &hc,
    )
    .unwrap();
    let dom = c.domain_define_xml(&xml, 0).await.unwrap();
    c.domain_create(&dom).await.unwrap();
    let (state, _) = c.domain_state(&dom).await.unwrap();
    assert_eq!(state, domain_state::RUNNING, "{test}");
    let meta = c.domain_metadata(&dom, mark::NAMESPACE, 0).await.unwrap();
    assert_eq!(
        mark::parse(&meta, "eptest", SystemTime::now()).map(|m| m.uid),
        Some(u)
    );
    c.domain_destroy(&dom, 0).await.unwrap();
    c.domain_undefine(&dom, undefine::ALL_METADATA)
        .await
        .unwrap();
    c.close();
}

#[tokio::test]
async fn a_bios_domain_without_nic_boots_to_running_under_tcg() {
    // finding: M7
    tokio::time::timeout(
        REAL_BUDGET,
        boots_to_running("dombuild-bios", Firmware::Bios),
    )
    .await
    .expect("test body exceeded its budget; guards cleaned up");
}

#[tokio::test]
async fn a_uefi_domain_boots_to_running_with_the_loader_the_host_listed() {
    // finding: M7
    tokio::time::timeout(
        REAL_BUDGET,
        boots_to_running("dombuild-uefi", Firmware::Uefi),
    )
    .await
    .expect("test body exceeded its budget; guards cleaned up");
}

// ---------------------------------------------------------------- libvirt-fake: fault paths

async fn fake_client(fake: &libvirt_fake::FakeLibvirt) -> Client {
    Client::open(fake.connect_duplex(), OpenOptions::default())
        .await
        .unwrap()
}

#[tokio::test]
async fn auto_falls_back_to_tcg_when_the_daemon_refuses_kvm_and_kvm_is_then_permanent() {
    // finding: M7
    use libvirt_fake::{FakeLibvirt, codes, domains};
    use libvirt_remote::proto::procs::CONNECT_GET_DOMAIN_CAPABILITIES;
    let fake = FakeLibvirt::new();
    let c = fake_client(&fake).await;
    let refuse = |times| {
        fake.faults().fail_calls(
            CONNECT_GET_DOMAIN_CAPABILITIES,
            codes::CONFIG_UNSUPPORTED,
            domains::QEMU,
            "unsupported configuration: KVM is not supported by '/usr/bin/qemu-system-x86_64'",
            times,
        )
    };
    refuse(Some(1));
    let a = caps::probe(&c, "h1", VirtType::Auto, CALL_TIMEOUT)
        .await
        .unwrap();
    assert_eq!(a.virt, Virt::Qemu);
    refuse(Some(1));
    let e = caps::probe(&c, "h1", VirtType::Kvm, CALL_TIMEOUT)
        .await
        .unwrap_err();
    assert!(e.is_permanent(), "{e}");
    assert!(
        e.message.contains("host h1") && e.message.contains("kvm"),
        "{e}"
    );
    // The fake answers TCG domain capabilities even when asked for kvm: listed, not usable.
    let e = caps::probe(&c, "h1", VirtType::Kvm, CALL_TIMEOUT)
        .await
        .unwrap_err();
    assert!(e.is_permanent() && e.message.contains("not usable"), "{e}");
    c.close();
}

#[tokio::test]
async fn a_host_without_x86_64_or_tcg_is_permanent_naming_the_host() {
    // finding: M7
    use libvirt_fake::FakeLibvirt;
    let fake = FakeLibvirt::new();
    fake.set_capabilities(CAPS.replace("name='x86_64'", "name='aarch64'"));
    let c = fake_client(&fake).await;
    let e = caps::probe(&c, "arm-host", VirtType::Auto, CALL_TIMEOUT)
        .await
        .unwrap_err();
    assert!(e.is_permanent(), "{e}");
    assert!(
        e.message.contains("host arm-host") && e.message.contains("x86_64"),
        "{e}"
    );
    c.close();
}

#[tokio::test]
async fn a_frozen_host_makes_the_probe_transient_not_permanent() {
    // finding: M7
    use libvirt_fake::FakeLibvirt;
    // NB: short so the test is quick; the class is what is asserted, not the time.
    const SHORT: Duration = Duration::from_millis(300);
    let fake = FakeLibvirt::new();
    let c = fake_client(&fake).await;
    fake.faults().freeze();
    let e = caps::probe(&c, "h1", VirtType::Qemu, SHORT)
        .await
        .unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(e.message.contains("host h1"), "{e}");
    c.close();
}
