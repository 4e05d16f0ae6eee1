//! Host capabilities: what a libvirt host can run, read from its own capabilities XML
//! (`CONNECT_GET_CAPABILITIES`) and domain capabilities (`CONNECT_GET_DOMAIN_CAPABILITIES`),
//! and the choices the domain XML is built from (finding M7).
//!
//! Guarantees:
//! - Nothing is assumed: architecture (`x86_64`), virt type, machine type (q35, else pc),
//!   emulator, firmware (UEFI only where the host lists a loader), cpu mode and virtio disks all
//!   come from the host's answers; a missing capability is
//!   [`ErrorClass::Permanent`](crate::error::ErrorClass::Permanent) with a message naming the
//!   host and the capability (and what to change).
//! - `virtType: auto` does not trust KVM because it is *listed*. The rule: `auto` picks `kvm`
//!   only when (1) the host's `x86_64` guest lists `<domain type='kvm'/>`, (2) the domain
//!   capabilities for virttype `kvm` are returned and name `<domain>kvm</domain>`, and (3) they
//!   report `<mode name='host-passthrough' supported='yes'/>`: libvirt sets that only when the
//!   QEMU it probed *with KVM acceleration* reported KVM enabled, i.e. `/dev/kvm` opened and a
//!   KVM VM could be created. Otherwise `auto` is `qemu` (TCG). Residual, documented: a KVM
//!   that opens but fails at vCPU setup (nested KVM, "failed to set MSR 0x10a") passes all
//!   three checks; no remote query can see that short of starting a guest, which is why such
//!   hosts are configured with `virtType: qemu`.
//! - Parsing is bounded ([`MAX_CAPS_XML_BYTES`], [`MAX_XML_DEPTH`]); a malformed answer is
//!   Transient (the daemon's problem, not a config problem) and names the host.
//! - Every call in [`probe`] has the caller's deadline.
//!
//! One piece: the bounded XML parser, the two capability documents parsed with it, the probe that
//! fetches them and the rules that choose from them are one concern (what this host can run) and
//! share their private types.

use std::time::Duration;

use libvirt_remote::Client;
use quick_xml::Reader;
use quick_xml::events::{BytesStart, Event};

use super::classify::classify;
use super::config::{Firmware, VirtType};
use crate::error::{ProviderError, Result};

/// The only guest architecture the provider runs.
pub const ARCH: &str = "x86_64";

/// Largest capabilities document parsed, in bytes.
// NB: this host's domain capabilities are ~80 KiB and its capabilities ~12 KiB; hosts with many
// NUMA cells or CPU models grow linearly. 8 MiB bounds a hostile answer (the RPC layer already
// bounds messages at its own maximum).
pub const MAX_CAPS_XML_BYTES: usize = 8 << 20;

/// Most characters of a daemon message quoted in an error.
// NB: libvirt messages are one line; 300 characters keep the useful part and bound status size.
pub const MAX_DAEMON_TEXT: usize = 300;

/// Deepest element nesting accepted (capabilities nest ~7 deep).
pub const MAX_XML_DEPTH: usize = 32;

/// A resolved virtualisation type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Virt {
    /// Hardware virtualisation (`<domain type='kvm'>`).
    Kvm,
    /// Software emulation, TCG (`<domain type='qemu'>`).
    Qemu,
}

impl Virt {
    /// The libvirt name (`kvm` / `qemu`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Qemu => "qemu",
        }
    }
}

/// The CPU configuration the domain gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuMode {
    /// `<cpu mode='host-passthrough'>` (KVM only).
    HostPassthrough,
    /// `<cpu mode='host-model'>` (KVM without passthrough).
    HostModel,
    /// No `<cpu>` element: QEMU's default model, the safe choice under TCG.
    EmulatorDefault,
}

/// One `<machine>` of a guest architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// The name (`q35`, `pc-q35-10.0`, …).
    pub name: String,
    /// The canonical name an alias stands for.
    pub canonical: Option<String>,
    /// `maxCpus`.
    pub max_cpus: Option<u32>,
    /// Marked deprecated by QEMU.
    pub deprecated: bool,
}

/// One `<guest>` of the host capabilities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestArch {
    /// `os_type` (`hvm`).
    pub os_type: String,
    /// Architecture name.
    pub arch: String,
    /// Default emulator binary.
    pub emulator: Option<String>,
    /// Listed `<domain type=…>` values (listed is not the same as working).
    pub domain_types: Vec<String>,
    /// Machine types.
    pub machines: Vec<Machine>,
}

/// The parts of `CONNECT_GET_CAPABILITIES` the provider uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCapabilities {
    /// Logical CPUs over all NUMA cells (0 when the host does not report topology).
    pub host_cpus: u32,
    /// Memory over all NUMA cells, KiB (0 when not reported).
    pub host_memory_kib: u64,
    /// Guest architectures.
    pub guests: Vec<GuestArch>,
}

impl HostCapabilities {
    /// The hvm guest of `arch`, if listed.
    pub fn guest(&self, arch: &str) -> Option<&GuestArch> {
        self.guests
            .iter()
            .find(|g| g.arch == arch && g.os_type == "hvm")
    }
}

/// The parts of `CONNECT_GET_DOMAIN_CAPABILITIES` the provider uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DomainCapabilities {
    /// Emulator binary (`<path>`).
    pub path: String,
    /// Virt type these are for (`<domain>`).
    pub domain: String,
    /// Canonical machine type (`<machine>`).
    pub machine: String,
    /// Architecture.
    pub arch: String,
    /// `<vcpu max=…>`.
    pub max_vcpus: Option<u32>,
    /// `<enum name='firmware'>` values under `<os>` (e.g. `efi`).
    pub firmware: Vec<String>,
    /// `<loader supported='yes'>`.
    pub loader_supported: bool,
    /// Loader (UEFI code) paths under `<loader>`.
    pub loaders: Vec<String>,
    /// CPU modes with `supported='yes'`.
    pub cpu_modes: Vec<String>,
    /// Disk buses (`<devices><disk><enum name='bus'>`); empty when not reported.
    pub disk_buses: Vec<String>,
    /// RNG models (`<devices><rng><enum name='model'>`).
    pub rng_models: Vec<String>,
    /// Channel types (`<devices><channel><enum name='type'>`).
    pub channel_types: Vec<String>,
}

/// What a host offers for one virt type, and the choices derived from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCaps {
    /// The host's configured name (used in every message).
    pub host: String,
    /// Guest architecture (always [`ARCH`]).
    pub arch: String,
    /// The virt type in use (the resolved `virtType`).
    pub virt: Virt,
    /// Virt types the host lists for [`ARCH`] (for the health report; listed ≠ working).
    pub listed_virt_types: Vec<String>,
    /// Emulator binary.
    pub emulator: String,
    /// Canonical machine type (q35 preferred, else pc).
    pub machine: String,
    /// CPU mode the domain gets.
    pub cpu_mode: CpuMode,
    /// UEFI loader chosen for UEFI images (non-secure-boot preferred), when the host has one.
    pub uefi_loader: Option<String>,
    /// Every UEFI loader the host lists.
    pub uefi_loaders: Vec<String>,
    /// Most vCPUs a domain may have here (host CPUs and the machine's limit).
    pub max_vcpus: u32,
    /// Most memory a domain may have here, MiB (the host's memory).
    pub max_memory_mib: u64,
    /// Whether a virtio RNG can be attached.
    pub rng_virtio: bool,
}

/// The firmware a domain boots with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirmwareChoice {
    /// Legacy BIOS (SeaBIOS).
    Bios,
    /// UEFI with this loader (code) path; libvirt creates the NVRAM from its template.
    Uefi {
        /// The loader path, one the host listed.
        loader: String,
    },
}

impl HostCaps {
    /// The firmware for an image that needs `fw`; UEFI without a loader on this host is
    /// Permanent naming the host and the capability.
    pub fn firmware(&self, fw: Firmware) -> Result<FirmwareChoice> {
        match fw {
            Firmware::Bios => Ok(FirmwareChoice::Bios),
            Firmware::Uefi => match &self.uefi_loader {
                Some(l) => Ok(FirmwareChoice::Uefi { loader: l.clone() }),
                None => Err(ProviderError::permanent(format!(
                    "host {}: the image needs UEFI firmware but the host lists no UEFI loader \
                     for {} / {} / {}: install OVMF on the host, or use a BIOS image",
                    self.host,
                    self.arch,
                    self.virt.as_str(),
                    self.machine
                ))),
            },
        }
    }
}

/// Reads and parses the host's capabilities, resolves `requested` and returns the choices.
/// At most three calls, each bounded by `call_timeout`. Errors are classified; capability
/// failures are Permanent naming `host`.
pub async fn probe(
    client: &Client,
    host: &str,
    requested: VirtType,
    call_timeout: Duration,
) -> Result<HostCaps> {
    let caps_xml = bounded(
        call_timeout,
        client.capabilities(),
        host,
        "reading capabilities",
    )
    .await?;
    let caps = parse_capabilities(&caps_xml).map_err(|e| malformed(host, "capabilities", &e))?;
    let guest = require_guest(host, &caps)?;
    let machine = pick_machine(host, guest)?;
    let fetch = |virt: Virt| {
        let machine = machine.clone();
        async move {
            let what = format!("reading {} domain capabilities", virt.as_str());
            let xml = tokio::time::timeout(
                call_timeout,
                client.domain_capabilities(None, Some(ARCH), Some(&machine), Some(virt.as_str())),
            )
            .await
            .map_err(|_| {
                ProviderError::transient(format!(
                    "host {host}: {what} did not answer within {call_timeout:?}"
                ))
            })?;
            Ok::<_, ProviderError>(xml.map_err(|e| (e, what)))
        }
    };
    let lists_kvm = guest.domain_types.iter().any(|t| t == "kvm");
    let kvm = match requested {
        VirtType::Qemu => None,
        VirtType::Kvm | VirtType::Auto if !lists_kvm => None,
        VirtType::Kvm | VirtType::Auto => match fetch(Virt::Kvm).await? {
            Ok(xml) => Some(
                parse_domain_capabilities(&xml)
                    .map_err(|e| malformed(host, "kvm domain capabilities", &e))?,
            ),
            // NB: the daemon refusing kvm domain capabilities (no /dev/kvm, no KVM support in
            // the emulator) is an answer: KVM is unavailable. Connection trouble is not.
            Err((e, _)) if e.remote().is_some() => None,
            Err((e, what)) => return Err(classify(&e, &format!("host {host}: {what}"))),
        },
    };
    let kvm_works = kvm.as_ref().is_some_and(kvm_usable);
    let need_qemu = match requested {
        VirtType::Qemu => true,
        VirtType::Auto => !kvm_works,
        VirtType::Kvm => false,
    };
    let qemu = if need_qemu {
        match fetch(Virt::Qemu).await? {
            Ok(xml) => Some(
                parse_domain_capabilities(&xml)
                    .map_err(|e| malformed(host, "qemu domain capabilities", &e))?,
            ),
            Err((e, what)) if e.remote().is_some() => {
                return Err(ProviderError::permanent(format!(
                    "host {host}: {what} was refused ({}): the host cannot run TCG (qemu) \
                     guests for {ARCH}",
                    e.remote()
                        .map(|r| super::classify::truncate(&r.message, MAX_DAEMON_TEXT))
                        .unwrap_or_default()
                ))
                .with_code(e.libvirt_code()));
            }
            Err((e, what)) => return Err(classify(&e, &format!("host {host}: {what}"))),
        }
    } else {
        None
    };
    choose(host, requested, &caps, kvm.as_ref(), qemu.as_ref())
}

async fn bounded<T>(
    limit: Duration,
    fut: impl Future<Output = libvirt_remote::Result<T>>,
    host: &str,
    what: &str,
) -> Result<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(classify(&e, &format!("host {host}: {what}"))),
        Err(_) => Err(ProviderError::transient(format!(
            "host {host}: {what} did not answer within {limit:?}"
        ))),
    }
}

/// Whether kvm domain capabilities show a KVM that QEMU could actually enable (rule (2) and (3)
/// of the module docs).
pub fn kvm_usable(d: &DomainCapabilities) -> bool {
    d.domain == "kvm" && d.cpu_modes.iter().any(|m| m == "host-passthrough")
}

/// The pure decision: from parsed capabilities and the domain capabilities fetched for kvm
/// and/or qemu, resolve `requested` and derive every choice. See the module docs for `auto`.
pub fn choose(
    host: &str,
    requested: VirtType,
    caps: &HostCapabilities,
    kvm: Option<&DomainCapabilities>,
    qemu: Option<&DomainCapabilities>,
) -> Result<HostCaps> {
    let guest = require_guest(host, caps)?;
    let lists_kvm = guest.domain_types.iter().any(|t| t == "kvm");
    let kvm_ok = lists_kvm && kvm.is_some_and(kvm_usable);
    let (virt, dc) = match requested {
        VirtType::Kvm => match kvm {
            Some(d) if kvm_ok => (Virt::Kvm, d),
            _ => {
                return Err(ProviderError::permanent(format!(
                    "host {host}: virtType kvm is configured but KVM is not usable there \
                     ({}): set virtType to qemu (TCG) or auto for this host",
                    if lists_kvm {
                        "listed, but its domain capabilities do not show KVM acceleration"
                    } else {
                        "the host does not list kvm for x86_64"
                    }
                )));
            }
        },
        VirtType::Auto if kvm_ok => match kvm {
            Some(d) => (Virt::Kvm, d),
            None => return Err(no_virt(host, "kvm")),
        },
        VirtType::Auto | VirtType::Qemu => {
            if !guest.domain_types.iter().any(|t| t == "qemu") {
                return Err(ProviderError::permanent(format!(
                    "host {host}: the host lists no qemu (TCG) domain type for {ARCH} and KVM \
                     is not usable: no virt type can run guests there"
                )));
            }
            match qemu {
                Some(d) => (Virt::Qemu, d),
                None => return Err(no_virt(host, "qemu")),
            }
        }
    };
    if dc.domain != virt.as_str() || dc.arch != ARCH {
        return Err(ProviderError::permanent(format!(
            "host {host}: domain capabilities answered for {} / {} instead of {} / {ARCH}",
            dc.domain,
            dc.arch,
            virt.as_str()
        )));
    }
    if !dc.disk_buses.is_empty() && !dc.disk_buses.iter().any(|b| b == "virtio") {
        return Err(ProviderError::permanent(format!(
            "host {host}: the emulator {} does not support virtio disks ({})",
            dc.path,
            virt.as_str()
        )));
    }
    if !dc.channel_types.is_empty() && !dc.channel_types.iter().any(|b| b == "unix") {
        return Err(ProviderError::permanent(format!(
            "host {host}: the emulator {} does not support unix channels (needed for the guest \
             agent)",
            dc.path
        )));
    }
    let cpu_mode = match virt {
        Virt::Kvm if dc.cpu_modes.iter().any(|m| m == "host-passthrough") => {
            CpuMode::HostPassthrough
        }
        Virt::Kvm if dc.cpu_modes.iter().any(|m| m == "host-model") => CpuMode::HostModel,
        _ => CpuMode::EmulatorDefault,
    };
    let uefi_loaders = if dc.loader_supported && dc.firmware.iter().any(|f| f == "efi") {
        dc.loaders.clone()
    } else if dc.loader_supported {
        // NB: older daemons omit the firmware enum; a listed loader is still usable.
        dc.loaders.clone()
    } else {
        Vec::new()
    };
    let uefi_loader = uefi_loaders
        .iter()
        .find(|l| !l.contains("secboot") && !l.contains(".ms.") && !l.contains(".snakeoil."))
        .or_else(|| uefi_loaders.first())
        .cloned();
    let machine_limit = guest
        .machines
        .iter()
        .find(|m| m.name == dc.machine || m.canonical.as_deref() == Some(dc.machine.as_str()))
        .and_then(|m| m.max_cpus);
    let max_vcpus = [
        Some(caps.host_cpus).filter(|n| *n > 0),
        dc.max_vcpus,
        machine_limit,
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(1);
    let max_memory_mib = caps.host_memory_kib / 1024;
    if max_memory_mib == 0 {
        return Err(ProviderError::permanent(format!(
            "host {host}: the host reports no memory in its NUMA topology; cannot bound guest \
             memory"
        )));
    }
    Ok(HostCaps {
        host: host.to_owned(),
        arch: ARCH.to_owned(),
        virt,
        listed_virt_types: guest.domain_types.clone(),
        emulator: if dc.path.is_empty() {
            guest.emulator.clone().unwrap_or_default()
        } else {
            dc.path.clone()
        },
        machine: dc.machine.clone(),
        cpu_mode,
        uefi_loader,
        uefi_loaders,
        max_vcpus,
        max_memory_mib,
        rng_virtio: dc.rng_models.iter().any(|m| m == "virtio"),
    })
}

fn no_virt(host: &str, virt: &str) -> ProviderError {
    ProviderError::permanent(format!(
        "host {host}: no {virt} domain capabilities were obtained for {ARCH}"
    ))
}

fn malformed(host: &str, what: &str, e: &str) -> ProviderError {
    ProviderError::transient(format!("host {host}: unreadable {what} XML: {e}"))
}

fn require_guest<'c>(host: &str, caps: &'c HostCapabilities) -> Result<&'c GuestArch> {
    caps.guest(ARCH).ok_or_else(|| {
        let arches: Vec<&str> = caps.guests.iter().map(|g| g.arch.as_str()).collect();
        ProviderError::permanent(format!(
            "host {host}: no {ARCH} hvm guests (the host offers {}): proxies need an {ARCH} \
             host; remove the host from the entry",
            if arches.is_empty() {
                "none".to_owned()
            } else {
                arches.join(", ")
            }
        ))
    })
}

/// The machine alias to ask domain capabilities for: `q35` when listed, else `pc`.
pub fn pick_machine(host: &str, guest: &GuestArch) -> Result<String> {
    for want in ["q35", "pc"] {
        if guest.machines.iter().any(|m| m.name == want) {
            return Ok(want.to_owned());
        }
    }
    Err(ProviderError::permanent(format!(
        "host {host}: {ARCH} offers neither the q35 nor the pc machine type"
    )))
}

// ---- a bounded element tree over quick-xml ----

/// An element: local name, attributes, text and children.
#[derive(Debug, Default)]
struct Node {
    name: String,
    attrs: Vec<(String, String)>,
    text: String,
    children: Vec<Node>,
}

impl Node {
    fn attr(&self, k: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
    fn child(&self, name: &str) -> Option<&Node> {
        self.children.iter().find(|c| c.name == name)
    }
    fn children<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Node> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }
    fn text_of(&self, name: &str) -> Option<String> {
        self.child(name).map(|c| c.text.trim().to_owned())
    }
    /// Values of `<enum name='NAME'><value>…</value></enum>` directly under this node.
    fn enum_values(&self, name: &str) -> Vec<String> {
        self.children("enum")
            .filter(|e| e.attr("name") == Some(name))
            .flat_map(|e| e.children("value").map(|v| v.text.trim().to_owned()))
            .collect()
    }
}

fn start_node(e: &BytesStart<'_>) -> std::result::Result<Node, String> {
    let name = e.local_name().into_inner().to_owned();
    let mut attrs = Vec::new();
    for a in e.attributes() {
        let a = a.map_err(|e| e.to_string())?;
        let k = a.key.local_name().into_inner().to_owned();
        let v = a
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map_err(|e| e.to_string())?
            .into_owned();
        attrs.push((k, v));
    }
    Ok(Node {
        name,
        attrs,
        ..Node::default()
    })
}

fn parse_tree(xml: &str) -> std::result::Result<Node, String> {
    if xml.len() > MAX_CAPS_XML_BYTES {
        return Err(format!(
            "{} bytes, above the {MAX_CAPS_XML_BYTES}-byte bound",
            xml.len()
        ));
    }
    let mut reader = Reader::from_str(xml);
    let mut stack: Vec<Node> = Vec::new();
    let mut root: Option<Node> = None;
    loop {
        let ev = reader.read_event().map_err(|e| e.to_string())?;
        match ev {
            Event::Start(e) => {
                if stack.len() >= MAX_XML_DEPTH {
                    return Err(format!("nested deeper than {MAX_XML_DEPTH}"));
                }
                stack.push(start_node(&e)?);
            }
            Event::Empty(e) => {
                let n = start_node(&e)?;
                match stack.last_mut() {
                    Some(p) => p.children.push(n),
                    None => set_root(&mut root, n)?,
                }
            }
            Event::End(_) => {
                let n = stack.pop().ok_or("unbalanced end tag")?;
                match stack.last_mut() {
                    Some(p) => p.children.push(n),
                    None => set_root(&mut root, n)?,
                }
            }
            Event::Text(t) => {
                if let Some(n) = stack.last_mut() {
                    n.text.push_str(&t.xml10_content());
                }
            }
            Event::CData(t) => {
                if let Some(n) = stack.last_mut() {
                    n.text.push_str(&t.xml10_content());
                }
            }
            Event::GeneralRef(r) => {
                let resolved = match r.resolve_char_ref().map_err(|e| e.to_string())? {
                    Some(c) => c.to_string(),
                    None => match r.as_ref() {
                        "lt" => "<".into(),
                        "gt" => ">".into(),
                        "amp" => "&".into(),
                        "apos" => "'".into(),
                        "quot" => "\"".into(),
                        other => return Err(format!("unknown entity &{other};")),
                    },
                };
                if let Some(n) = stack.last_mut() {
                    n.text.push_str(&resolved);
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !stack.is_empty() {
        return Err("document ends inside an element".into());
    }
    root.ok_or_else(|| "empty document".into())
}

fn set_root(root: &mut Option<Node>, n: Node) -> std::result::Result<(), String> {
    if root.is_some() {
        return Err("more than one root element".into());
    }
    *root = Some(n);
    Ok(())
}

/// Parses `CONNECT_GET_CAPABILITIES` XML. The error is a short description of what is wrong.
pub fn parse_capabilities(xml: &str) -> std::result::Result<HostCapabilities, String> {
    let root = parse_tree(xml)?;
    if root.name != "capabilities" {
        return Err(format!(
            "root element is <{}>, not <capabilities>",
            root.name
        ));
    }
    let (mut host_cpus, mut host_memory_kib) = (0u32, 0u64);
    if let Some(cells) = root
        .child("host")
        .and_then(|h| h.child("topology"))
        .and_then(|t| t.child("cells"))
    {
        for cell in cells.children("cell") {
            if let Some(mem) = cell.child("memory") {
                let kib = mem.text.trim().parse::<u64>().unwrap_or(0);
                let kib = match mem.attr("unit").unwrap_or("KiB") {
                    "KiB" | "k" | "K" => kib,
                    "MiB" | "M" => kib.saturating_mul(1024),
                    "GiB" | "G" => kib.saturating_mul(1024 * 1024),
                    "bytes" | "b" => kib / 1024,
                    _ => 0,
                };
                host_memory_kib = host_memory_kib.saturating_add(kib);
            }
            if let Some(cpus) = cell.child("cpus") {
                let n = cpus
                    .attr("num")
                    .and_then(|n| n.parse::<u32>().ok())
                    .unwrap_or_else(|| cpus.children("cpu").count() as u32);
                host_cpus = host_cpus.saturating_add(n);
            }
        }
    }
    let guests = root
        .children("guest")
        .filter_map(|g| {
            let arch = g.child("arch")?;
            Some(GuestArch {
                os_type: g.text_of("os_type").unwrap_or_default(),
                arch: arch.attr("name")?.to_owned(),
                emulator: arch.text_of("emulator"),
                domain_types: arch
                    .children("domain")
                    .filter_map(|d| d.attr("type").map(str::to_owned))
                    .collect(),
                machines: arch
                    .children("machine")
                    .map(|m| Machine {
                        name: m.text.trim().to_owned(),
                        canonical: m.attr("canonical").map(str::to_owned),
                        max_cpus: m.attr("maxCpus").and_then(|n| n.parse().ok()),
                        deprecated: m.attr("deprecated") == Some("yes"),
                    })
                    .collect(),
            })
        })
        .collect();
    Ok(HostCapabilities {
        host_cpus,
        host_memory_kib,
        guests,
    })
}

/// Parses `CONNECT_GET_DOMAIN_CAPABILITIES` XML.
pub fn parse_domain_capabilities(xml: &str) -> std::result::Result<DomainCapabilities, String> {
    let root = parse_tree(xml)?;
    if root.name != "domainCapabilities" {
        return Err(format!(
            "root element is <{}>, not <domainCapabilities>",
            root.name
        ));
    }
    let mut d = DomainCapabilities {
        path: root.text_of("path").unwrap_or_default(),
        domain: root.text_of("domain").unwrap_or_default(),
        machine: root.text_of("machine").unwrap_or_default(),
        arch: root.text_of("arch").unwrap_or_default(),
        max_vcpus: root
            .child("vcpu")
            .and_then(|v| v.attr("max"))
            .and_then(|m| m.parse().ok()),
        ..DomainCapabilities::default()
    };
    if let Some(os) = root
        .child("os")
        .filter(|o| o.attr("supported") == Some("yes"))
    {
        d.firmware = os.enum_values("firmware");
        if let Some(loader) = os
            .child("loader")
            .filter(|l| l.attr("supported") == Some("yes"))
        {
            d.loaders = loader
                .children("value")
                .map(|v| v.text.trim().to_owned())
                .filter(|v| !v.is_empty())
                .collect();
            d.loader_supported = !d.loaders.is_empty();
        }
    }
    if let Some(cpu) = root.child("cpu") {
        d.cpu_modes = cpu
            .children("mode")
            .filter(|m| m.attr("supported") == Some("yes"))
            .filter_map(|m| m.attr("name").map(str::to_owned))
            .collect();
    }
    if let Some(devices) = root.child("devices") {
        let supported = |n: &str| {
            devices
                .child(n)
                .filter(|c| c.attr("supported") == Some("yes"))
        };
        d.disk_buses = supported("disk")
            .map(|c| c.enum_values("bus"))
            .unwrap_or_default();
        d.rng_models = supported("rng")
            .map(|c| c.enum_values("model"))
            .unwrap_or_default();
        d.channel_types = supported("channel")
            .map(|c| c.enum_values("type"))
            .unwrap_or_default();
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_documents_are_errors_not_panics() {
        assert!(parse_capabilities("").is_err());
        assert!(parse_capabilities("<capabilities>").is_err());
        assert!(parse_capabilities("<domainCapabilities/>").is_err());
        assert!(parse_capabilities(&"<a>".repeat(100)).is_err());
        assert!(parse_capabilities("<capabilities>&foo;</capabilities>").is_err());
        assert!(parse_domain_capabilities("<capabilities/>").is_err());
        let big = format!(
            "<capabilities>{}</capabilities>",
            " ".repeat(MAX_CAPS_XML_BYTES)
        );
        assert!(parse_capabilities(&big).is_err());
    }
}
