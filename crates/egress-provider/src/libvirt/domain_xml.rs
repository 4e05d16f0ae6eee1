//! The domain XML of one proxy VM, written with quick-xml's writer from a [`DomainSpec`] and
//! the host's [`HostCaps`].
//!
//! Guarantees:
//! - Every value is written through the XML writer (escaped as text or attribute); no value is
//!   concatenated into markup. Values XML 1.0 cannot carry at all (control characters) are
//!   refused, so libvirt never sees a document that parses differently from what we meant.
//!   The one piece of pre-rendered markup is the ownership mark from
//!   [`mark::render`](super::mark::render), which escapes its own values.
//! - vCPUs and memory are validated (finding L11): zero is refused, and so is anything above
//!   the host's limits from its capabilities ([`HostCaps::max_vcpus`],
//!   [`HostCaps::max_memory_mib`]); the error is Permanent and names the setting, the value,
//!   the limit and the host.
//! - Platform choices come only from [`HostCaps`] (finding M7): virt type, arch, machine,
//!   emulator, cpu mode, and for UEFI images the loader the host listed (no loader → Permanent).
//! - Devices: the root overlay (qcow2, virtio, `vda`), the cloud-init seed as a READ-ONLY
//!   VIRTIO DISK (`vdb`; measured: Debian's cloud kernel does not find the seed on
//!   a q35 SATA CD-ROM but does on virtio), at most one NIC (virtio, our MAC) on a bridge or a
//!   libvirt network, the qemu-guest-agent channel, a pty serial console, a virtio RNG when the
//!   host offers one; the mark in `<metadata>`, checked to parse back with
//!   [`mark::parse`](super::mark::parse) before the XML is returned (a domain whose mark could
//!   not be read back would never be recognised, nor deleted, again).
//! - The root disk's backing chain is declared in full (base, then its data volume) and ends
//!   with an empty `<backingStore/>`: libvirt does not probe the images for more layers, so a
//!   backing file named inside a downloaded image is never opened for the guest.

use std::io;
use std::time::SystemTime;

use quick_xml::Writer;
use quick_xml::events::{BytesEnd, BytesStart, BytesText, Event};

use super::caps::{CpuMode, FirmwareChoice, HostCaps};
use super::config::{Firmware, ImageFormat};
use super::mark;
use crate::error::{ProviderError, Result};
use crate::model::ProxyUid;

/// The guest agent's virtio-serial port name.
pub const GUEST_AGENT_CHANNEL: &str = "org.qemu.guest_agent.0";
/// Target device of the root disk.
pub const ROOT_DEV: &str = "vda";
/// Target device of the seed disk.
pub const SEED_DEV: &str = "vdb";
/// Longest domain name accepted.
// NB: our names are `ep-<entry>-<32 hex>` (entry is a short identifier); libvirt itself has no
// small limit, but the name becomes a file name under /var/lib/libvirt and /run (255 bytes).
pub const MAX_NAME_LEN: usize = 200;
/// Longest path, pool, volume, bridge or network name accepted.
// NB: PATH_MAX on Linux is 4096.
pub const MAX_VALUE_LEN: usize = 4096;

/// Where a disk's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskSource<'a> {
    /// A file path on the host (`<disk type='file'>`).
    File(&'a str),
    /// A volume of a storage pool (`<disk type='volume'>`): no path lookup needed.
    Volume {
        /// Pool name.
        pool: &'a str,
        /// Volume name.
        volume: &'a str,
    },
}

/// The backing image of the root overlay, declared so libvirt labels it without probing.
/// The declared chain is terminated with an empty `<backingStore/>` after its last layer, so
/// libvirt never follows a backing file named inside an image's own header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backing<'a> {
    /// The base's path on the host.
    pub path: &'a str,
    /// The base's format.
    pub format: ImageFormat,
    /// The layer under this one (a published base's data volume), if any; `None` ends the
    /// chain here.
    pub below: Option<&'a Backing<'a>>,
}

/// What the NIC attaches to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NicAttach<'a> {
    /// A host bridge (`<interface type='bridge'>`).
    Bridge(&'a str),
    /// A libvirt network (`<interface type='network'>`).
    Network(&'a str),
}

/// The single NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nic<'a> {
    /// Bridge or network.
    pub attach: NicAttach<'a>,
    /// Our MAC (from [`names::mac`](super::names::mac)); lowercase `xx:xx:xx:xx:xx:xx`.
    pub mac: &'a str,
    /// The libvirt network filter on the NIC (`<filterref>`; see
    /// [`nwfilter`](super::nwfilter)); `None`: no filter.
    pub filter: Option<&'a str>,
    /// The filter's parameters for this NIC (`<parameter name value>`, in order; see
    /// [`nwfilter::nic_params`](super::nwfilter::nic_params)).
    pub filter_params: &'a [(&'static str, String)],
}

/// Everything one domain is built from (the platform comes from [`HostCaps`]).
#[derive(Debug, Clone, Copy)]
pub struct DomainSpec<'a> {
    /// Domain name (from [`names::domain`](super::names::domain)).
    pub name: &'a str,
    /// Domain UUID; `None` lets libvirt choose.
    pub uuid: Option<uuid::Uuid>,
    /// vCPUs (1 ..= host limit).
    pub vcpus: u32,
    /// Memory in MiB (1 ..= host memory).
    pub memory_mib: u64,
    /// Firmware the image needs.
    pub firmware: Firmware,
    /// The root overlay (qcow2).
    pub root: DiskSource<'a>,
    /// The overlay's backing base, when known.
    pub backing: Option<Backing<'a>>,
    /// The seed volume (raw ISO), attached read-only.
    pub seed: DiskSource<'a>,
    /// The NIC; `None` builds a domain without network (tests, never production).
    pub nic: Option<Nic<'a>>,
    /// Proxy UID for the ownership mark.
    pub uid: &'a ProxyUid,
    /// Provider entry for the ownership mark.
    pub entry: &'a str,
    /// Creation time for the ownership mark.
    pub created_at: SystemTime,
    /// The installation ID written into the mark (`None`: a mark without one).
    pub installation: Option<&'a str>,
    /// The declared egress addresses written into the mark (empty: none allocated).
    pub addresses: &'a [std::net::IpAddr],
}

/// Builds the domain XML for `spec` on the host described by `caps`. Invalid values and
/// capability gaps are Permanent and name the setting, the value and the host.
pub fn build(spec: &DomainSpec<'_>, caps: &HostCaps) -> Result<String> {
    validate(spec, caps)?;
    let firmware = caps.firmware(spec.firmware)?;
    write(spec, caps, &firmware).map_err(|e| {
        // NB: writing into a Vec cannot fail; keep the path anyway rather than panic.
        ProviderError::transient(format!(
            "writing the domain XML of {} failed: {e}",
            spec.name
        ))
    })
}

fn validate(spec: &DomainSpec<'_>, caps: &HostCaps) -> Result<()> {
    let host = &caps.host;
    if spec.name.is_empty()
        || spec.name.len() > MAX_NAME_LEN
        || !spec
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(ProviderError::permanent(format!(
            "domain name {:?} is not 1–{MAX_NAME_LEN} letters, digits, '-', '_' or '.'",
            super::classify::truncate(spec.name, 80)
        )));
    }
    if spec.vcpus == 0 {
        return Err(ProviderError::permanent(
            "vcpus is 0: a proxy VM needs at least 1 vCPU; set vcpus to 1 or more",
        ));
    }
    if spec.vcpus > caps.max_vcpus {
        return Err(ProviderError::permanent(format!(
            "vcpus {} is above what host {host} allows ({}: its CPUs and the {} machine's \
             limit); lower vcpus",
            spec.vcpus, caps.max_vcpus, caps.machine
        )));
    }
    if spec.memory_mib == 0 {
        return Err(ProviderError::permanent(
            "memory is 0 MiB: set memory to the guest's needs (e.g. 512 MiB)",
        ));
    }
    if spec.memory_mib > caps.max_memory_mib {
        return Err(ProviderError::permanent(format!(
            "memory {} MiB is above host {host}'s {} MiB; lower memory",
            spec.memory_mib, caps.max_memory_mib
        )));
    }
    let mut values: Vec<(&str, &str)> = vec![("entry", spec.entry)];
    for (what, d) in [("root disk", spec.root), ("seed disk", spec.seed)] {
        match d {
            DiskSource::File(p) => {
                if !p.starts_with('/') {
                    return Err(ProviderError::permanent(format!(
                        "{what} path {:?} is not absolute",
                        super::classify::truncate(p, 120)
                    )));
                }
                values.push((what, p));
            }
            DiskSource::Volume { pool, volume } => {
                values.push((what, pool));
                values.push((what, volume));
            }
        }
    }
    let mut layer = spec.backing.as_ref();
    while let Some(b) = layer {
        values.push(("backing path", b.path));
        layer = b.below;
    }
    if let Some(nic) = spec.nic {
        match nic.attach {
            NicAttach::Bridge(b) => values.push(("bridge", b)),
            NicAttach::Network(n) => values.push(("network", n)),
        }
        if !valid_mac(nic.mac) {
            return Err(ProviderError::permanent(format!(
                "MAC address {:?} is not lowercase xx:xx:xx:xx:xx:xx",
                super::classify::truncate(nic.mac, 40)
            )));
        }
    }
    // NB: a domain whose mark cannot be read back would never be recognised as ours again
    // (never deleted, leaked): refuse it before defining.
    let m = mark::render_with(
        spec.uid,
        spec.entry,
        spec.installation,
        spec.addresses,
        spec.created_at,
    );
    if mark::parse(&m, spec.entry, SystemTime::now()).is_none() {
        return Err(ProviderError::permanent(format!(
            "entry name {:?} cannot be carried by the ownership mark (it needs escaping); use \
             letters, digits and '-'",
            super::classify::truncate(spec.entry, 80)
        )));
    }
    for (what, v) in values {
        if v.is_empty() || v.len() > MAX_VALUE_LEN || v.chars().any(|c| c.is_control()) {
            return Err(ProviderError::permanent(format!(
                "{what} {:?} is empty, too long or contains control characters",
                super::classify::truncate(v, 120)
            )));
        }
    }
    Ok(())
}

fn valid_mac(m: &str) -> bool {
    m.len() == 17
        && m.split(':').count() == 6
        && m.split(':').all(|o| {
            o.len() == 2
                && o.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

/// A thin helper over quick-xml's writer: every value goes through `BytesStart::push_attribute`
/// or `BytesText::new`, both of which escape.
struct X {
    w: Writer<Vec<u8>>,
}

impl X {
    fn open(&mut self, name: &str, attrs: &[(&str, &str)]) -> io::Result<()> {
        let mut s = BytesStart::new(name);
        for a in attrs {
            s.push_attribute(*a);
        }
        self.w.write_event(Event::Start(s))
    }
    fn close(&mut self, name: &str) -> io::Result<()> {
        self.w.write_event(Event::End(BytesEnd::new(name)))
    }
    fn empty(&mut self, name: &str, attrs: &[(&str, &str)]) -> io::Result<()> {
        let mut s = BytesStart::new(name);
        for a in attrs {
            s.push_attribute(*a);
        }
        self.w.write_event(Event::Empty(s))
    }
    fn text(&mut self, name: &str, attrs: &[(&str, &str)], text: &str) -> io::Result<()> {
        self.open(name, attrs)?;
        self.w.write_event(Event::Text(BytesText::new(text)))?;
        self.close(name)
    }
}

fn write(spec: &DomainSpec<'_>, caps: &HostCaps, fw: &FirmwareChoice) -> io::Result<String> {
    let mut x = X {
        w: Writer::new_with_indent(Vec::new(), b' ', 2),
    };
    x.open("domain", &[("type", caps.virt.as_str())])?;
    x.text("name", &[], spec.name)?;
    if let Some(u) = spec.uuid {
        x.text("uuid", &[], &u.hyphenated().to_string())?;
    }
    x.open("metadata", &[])?;
    let m = mark::render_with(
        spec.uid,
        spec.entry,
        spec.installation,
        spec.addresses,
        spec.created_at,
    );
    // NB: pre-rendered by mark::render_for, which escapes its only free value (the entry).
    x.w.write_event(Event::Text(BytesText::from_escaped(m)))?;
    x.close("metadata")?;
    let mem = spec.memory_mib.to_string();
    x.text("memory", &[("unit", "MiB")], &mem)?;
    x.text("currentMemory", &[("unit", "MiB")], &mem)?;
    x.text("vcpu", &[("placement", "static")], &spec.vcpus.to_string())?;

    match fw {
        FirmwareChoice::Bios => x.open("os", &[])?,
        FirmwareChoice::Uefi { .. } => x.open("os", &[("firmware", "efi")])?,
    }
    x.text(
        "type",
        &[("arch", &caps.arch), ("machine", &caps.machine)],
        "hvm",
    )?;
    if let FirmwareChoice::Uefi { loader } = fw {
        x.text("loader", &[("readonly", "yes"), ("type", "pflash")], loader)?;
    }
    x.empty("boot", &[("dev", "hd")])?;
    x.close("os")?;

    x.open("features", &[])?;
    x.empty("acpi", &[])?;
    x.empty("apic", &[])?;
    if matches!(fw, FirmwareChoice::Uefi { loader } if loader.contains("secboot")) {
        // NB: secure-boot OVMF builds require SMM.
        x.empty("smm", &[("state", "on")])?;
    }
    x.close("features")?;
    match caps.cpu_mode {
        CpuMode::HostPassthrough => {
            x.empty("cpu", &[("mode", "host-passthrough"), ("check", "none")])?
        }
        CpuMode::HostModel => x.empty("cpu", &[("mode", "host-model")])?,
        CpuMode::EmulatorDefault => {}
    }
    x.empty("clock", &[("offset", "utc")])?;
    x.text("on_poweroff", &[], "destroy")?;
    x.text("on_reboot", &[], "restart")?;
    x.text("on_crash", &[], "destroy")?;

    x.open("devices", &[])?;
    if !caps.emulator.is_empty() {
        x.text("emulator", &[], &caps.emulator)?;
    }
    // Root overlay.
    disk(&mut x, spec.root, "qcow2", ROOT_DEV, false, spec.backing)?;
    // Seed: read-only virtio disk, never a CD-ROM (see module docs).
    disk(&mut x, spec.seed, "raw", SEED_DEV, true, None)?;
    if let Some(nic) = spec.nic {
        let (kind, key, val) = match nic.attach {
            NicAttach::Bridge(b) => ("bridge", "bridge", b),
            NicAttach::Network(n) => ("network", "network", n),
        };
        x.open("interface", &[("type", kind)])?;
        x.empty("mac", &[("address", nic.mac)])?;
        x.empty("source", &[(key, val)])?;
        x.empty("model", &[("type", "virtio")])?;
        if let Some(f) = nic.filter {
            if nic.filter_params.is_empty() {
                x.empty("filterref", &[("filter", f)])?;
            } else {
                x.open("filterref", &[("filter", f)])?;
                for (name, value) in nic.filter_params {
                    x.empty("parameter", &[("name", name), ("value", value.as_str())])?;
                }
                x.close("filterref")?;
            }
        }
        x.close("interface")?;
    }
    x.open("serial", &[("type", "pty")])?;
    x.empty("target", &[("port", "0")])?;
    x.close("serial")?;
    x.open("console", &[("type", "pty")])?;
    x.empty("target", &[("type", "serial"), ("port", "0")])?;
    x.close("console")?;
    x.open("channel", &[("type", "unix")])?;
    x.empty(
        "target",
        &[("type", "virtio"), ("name", GUEST_AGENT_CHANNEL)],
    )?;
    x.close("channel")?;
    if caps.rng_virtio {
        x.open("rng", &[("model", "virtio")])?;
        x.text("backend", &[("model", "random")], "/dev/urandom")?;
        x.close("rng")?;
    }
    x.close("devices")?;
    x.close("domain")?;
    let bytes = x.w.into_inner();
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn disk(
    x: &mut X,
    src: DiskSource<'_>,
    format: &str,
    dev: &str,
    readonly: bool,
    backing: Option<Backing<'_>>,
) -> io::Result<()> {
    let kind = match src {
        DiskSource::File(_) => "file",
        DiskSource::Volume { .. } => "volume",
    };
    x.open("disk", &[("type", kind), ("device", "disk")])?;
    x.empty("driver", &[("name", "qemu"), ("type", format)])?;
    match src {
        DiskSource::File(p) => x.empty("source", &[("file", p)])?,
        DiskSource::Volume { pool, volume } => {
            x.empty("source", &[("pool", pool), ("volume", volume)])?
        }
    }
    if let Some(b) = backing {
        backing_store(x, &b)?;
    }
    x.empty("target", &[("dev", dev), ("bus", "virtio")])?;
    if readonly {
        x.empty("readonly", &[])?;
    }
    x.close("disk")
}

/// Writes `b` and the layers below it, then an empty `<backingStore/>`: the chain ends where
/// we declared it, whatever the images' headers name (a qcow2 backing file of a downloaded
/// image is never followed).
fn backing_store(x: &mut X, b: &Backing<'_>) -> io::Result<()> {
    x.open("backingStore", &[("type", "file")])?;
    x.empty("format", &[("type", b.format.as_str())])?;
    x.empty("source", &[("file", b.path)])?;
    match b.below {
        Some(below) => backing_store(x, below)?,
        None => x.empty("backingStore", &[])?,
    }
    x.close("backingStore")
}
