//! The cloud-init NoCloud seed: an ISO 9660 image labelled `cidata`, built in memory.
//!
//! Guarantees:
//! - Nothing is written to local disk (finding L26): the image is assembled in a `Vec<u8>` and
//!   handed to the caller, who uploads it as a volume.
//! - Building is pure (no I/O): the only failures are invalid inputs, which are
//!   [`ErrorClass::Permanent`](crate::error::ErrorClass::Permanent) and name the setting to
//!   change, so nothing transient can ever latch (finding M8). An encoder failure (a bug, not
//!   an input problem) is Transient.
//! - The image carries Joliet and Rock Ridge, so `meta-data`, `user-data`, `network-config`
//!   and `vendor-data` are readable under those exact names (the primary ISO 9660 tree has
//!   `META_DATA;1`-style names that cloud-init never reads); the volume label is `cidata`,
//!   which is what cloud-init's NoCloud probe looks for (`blkid` reports `LABEL=cidata`).
//! - Inputs and the result are size-bounded ([`MAX_PAYLOAD_BYTES`], [`MAX_SEED_BYTES`]).
//! - vendor-data (finding L10, L13): with `installGuestAgent` it carries a shell script that
//!   installs qemu-guest-agent only when it is missing and enables and starts it on systemd
//!   *and* OpenRC images (and says so, without failing, on anything else). The entry's own
//!   `vendorData` is kept, never dropped: alone it is used verbatim, together with the agent
//!   script both become parts of one MIME multipart document. A payload cloud-init would not
//!   recognise is refused ([`payload_type`]) instead of being silently ignored.
//!
//! Why a script part and not a `#cloud-config` `runcmd`: cloud-init merges vendor-data's
//! cloud-config *under* user-data, and a user-data `runcmd` (which our proxy user-data uses)
//! replaces vendor-data's `runcmd` wholesale, silently dropping the agent install. A
//! `text/x-shellscript` part in vendor-data runs from `scripts_vendor` whatever user-data says.
//!
//! The ISO writer is the `hadris-iso` crate (2.5, pure Rust, Joliet + Rock Ridge), checked with
//! `isoinfo` and `blkid` in the tests; no ISO code is hand-written here.

use std::io::Cursor;
use std::sync::Arc;

use bytes::Bytes;
use hadris_iso::joliet::JolietLevel;
use hadris_iso::read::PathSeparator;
use hadris_iso::rrip::RripOptions;
use hadris_iso::write::options::{BaseIsoLevel, CreationFeatures, IsoFormatOptions};
use hadris_iso::write::{File as IsoFile, InputFiles, IsoImageWriter};

use super::config::GuestSettings;
use crate::error::{ProviderError, Result};
use crate::model::ProxyUid;

/// The volume label cloud-init's NoCloud datasource looks for.
pub const VOLUME_LABEL: &str = "cidata";

/// Largest total of user-data + network-config + vendor-data accepted, in bytes.
// NB: our rendered user-data (proxy config, keys, allowlists) is a few KiB; EC2 caps user-data
// at 16 KiB. 1 MiB is far above any real payload and keeps the in-memory image small.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// Largest seed image produced, in bytes.
// NB: the image is the payload plus ~56 KiB of ISO structures (volume descriptors, three
// directory trees, path tables) with every file rounded up to a 2 KiB sector; 2 MiB bounds a
// maximal payload with room to spare.
pub const MAX_SEED_BYTES: usize = 2 << 20;

/// Longest hostname accepted (RFC 1123).
pub const MAX_HOSTNAME_LEN: usize = 253;

/// The directory whose presence means the guest booted with systemd (`sd_booted()`).
pub const SYSTEMD_RUNTIME_DIR: &str = "/run/systemd/system";

/// The `PATH` the agent script runs with (cloud-init's environment may lack the sbin dirs).
pub const SCRIPT_PATH_LINE: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH; export PATH";

/// The filename given to the agent script part inside a multipart vendor-data.
pub const AGENT_PART_FILENAME: &str = "ep-qemu-guest-agent.sh";

/// Everything the seed is built from. `Debug` shows the user-data's and network-config's
/// sizes only: the user-data holds the proxy's password.
#[derive(Clone, Copy)]
pub struct SeedInput<'a> {
    /// The instance id cloud-init sees (`instance-id` in meta-data): the Proxy UID, so a new
    /// Proxy is a new instance to cloud-init even if a disk were reused.
    pub instance_id: &'a ProxyUid,
    /// The guest's hostname (`local-hostname`); RFC 1123.
    pub hostname: &'a str,
    /// user-data as rendered by the caller; must be a payload cloud-init recognises.
    pub user_data: &'a str,
    /// Optional network-config (v1 or v2 YAML), passed through.
    pub network_config: Option<&'a str>,
    /// The entry's guest settings (agent install, vendor-data).
    pub guest: &'a GuestSettings,
}

/// A built seed. `Debug` shows the image's size and the files' names and sizes only (their
/// content holds the proxy's password).
#[derive(Clone, PartialEq, Eq)]
pub struct Seed {
    /// The ISO 9660 image (`cidata`, Joliet + Rock Ridge); its length is a multiple of 2048
    /// and at most [`MAX_SEED_BYTES`]. Upload it as a raw volume of exactly this capacity.
    pub image: Bytes,
    /// The files in the image, by name, exactly as written (for logs and tests).
    pub files: Vec<(&'static str, String)>,
}

impl std::fmt::Debug for SeedInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeedInput")
            .field("instance_id", self.instance_id)
            .field("hostname", &self.hostname)
            .field(
                "user_data",
                &format_args!("<{} bytes, redacted>", self.user_data.len()),
            )
            .field(
                "network_config",
                &self
                    .network_config
                    .map(|n| format!("<{} bytes, redacted>", n.len())),
            )
            .field("guest", self.guest)
            .finish()
    }
}

impl std::fmt::Debug for Seed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let files: Vec<String> = self
            .files
            .iter()
            .map(|(name, text)| format!("{name} <{} bytes, redacted>", text.len()))
            .collect();
        f.debug_struct("Seed")
            .field("image", &format_args!("<{} bytes>", self.image.len()))
            .field("files", &files)
            .finish()
    }
}

impl Seed {
    /// The image's length in bytes (the seed volume's capacity).
    pub fn len(&self) -> u64 {
        self.image.len() as u64
    }

    /// Whether the image is empty (never true for a built seed).
    pub fn is_empty(&self) -> bool {
        self.image.is_empty()
    }
}

/// Checks `input` as [`build`] does, without building the image: every refusal of `build`
/// but the image's own size bound (which a payload within [`MAX_PAYLOAD_BYTES`] stays far
/// below). A create checks first and builds just before the upload, so the image is held
/// only between those two.
pub fn check(input: &SeedInput<'_>) -> Result<()> {
    checked_vendor_data(input).map(|_| ())
}

/// The checks of [`check`], and the vendor-data they render.
fn checked_vendor_data(input: &SeedInput<'_>) -> Result<Option<String>> {
    validate_hostname(input.hostname)?;
    payload_type("user-data", input.user_data)?;
    if let Some(nc) = input.network_config
        && nc.trim().is_empty()
    {
        return Err(ProviderError::permanent(
            "network-config is empty: omit it or give a network config (version 1 or 2)",
        ));
    }
    let vendor = vendor_data(input.guest)?;
    let payload = input.user_data.len()
        + input.network_config.map_or(0, str::len)
        + vendor.as_ref().map_or(0, String::len);
    if payload > MAX_PAYLOAD_BYTES {
        return Err(ProviderError::permanent(format!(
            "cloud-init payload is {payload} bytes (user-data + network-config + vendorData); \
             at most {MAX_PAYLOAD_BYTES} are accepted: shrink the user data or guest.vendorData"
        )));
    }
    Ok(vendor)
}

/// Builds the seed image in memory. Invalid input is Permanent and names the setting.
pub fn build(input: &SeedInput<'_>) -> Result<Seed> {
    let vendor = checked_vendor_data(input)?;
    let mut files: Vec<(&'static str, String)> = vec![
        ("meta-data", meta_data(input.instance_id, input.hostname)),
        ("user-data", input.user_data.to_owned()),
    ];
    if let Some(nc) = input.network_config {
        files.push(("network-config", nc.to_owned()));
    }
    if let Some(v) = vendor {
        files.push(("vendor-data", v));
    }
    let image = write_iso(&files)?;
    if image.len() > MAX_SEED_BYTES {
        return Err(ProviderError::permanent(format!(
            "the cloud-init seed image would be {} bytes, above the {MAX_SEED_BYTES}-byte \
             bound: shrink the user data or guest.vendorData",
            image.len()
        )));
    }
    Ok(Seed {
        image: Bytes::from(image),
        files,
    })
}

/// The meta-data document: `instance-id` (canonical UID) and `local-hostname`. Both values are
/// validated tokens (UUID, RFC 1123 name), so no YAML quoting is needed.
pub fn meta_data(instance_id: &ProxyUid, hostname: &str) -> String {
    format!(
        "instance-id: {}\nlocal-hostname: {hostname}\n",
        instance_id.canonical()
    )
}

/// Checks an RFC 1123 hostname: 1–253 characters, dot-separated labels of 1–63 ASCII letters,
/// digits and hyphens, not starting or ending with a hyphen.
pub fn validate_hostname(h: &str) -> Result<()> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if h.is_empty() || h.len() > MAX_HOSTNAME_LEN || !h.split('.').all(label_ok) {
        return Err(ProviderError::permanent(format!(
            "hostname {:?} is not a valid RFC 1123 host name (letters, digits, hyphens, \
             dot-separated labels of at most 63, at most {MAX_HOSTNAME_LEN} in all)",
            crate::libvirt::classify::truncate(h, 80)
        )));
    }
    Ok(())
}

/// The MIME type cloud-init dispatches `payload` to, from its first line, or a Permanent error
/// naming `what` when cloud-init would silently ignore it (finding L13). A payload that is
/// already MIME (`Content-Type:` header) is returned as `"mime"`.
pub fn payload_type(what: &str, payload: &str) -> Result<&'static str> {
    // NB: order matters: longer prefixes first (`#cloud-config-archive` before `#cloud-config`,
    // `#include-once` before `#include`). The list is cloud-init's "starts with" table.
    const TABLE: &[(&str, &str)] = &[
        ("#cloud-config-archive", "text/cloud-config-archive"),
        ("#cloud-config", "text/cloud-config"),
        ("#cloud-boothook", "text/cloud-boothook"),
        ("#include-once", "text/x-include-once-url"),
        ("#include", "text/x-include-url"),
        ("#part-handler", "text/part-handler"),
        ("## template: jinja", "text/jinja2"),
        ("#!", "text/x-shellscript"),
    ];
    if payload.len() >= 13
        && payload
            .get(..13)
            .is_some_and(|p| p.eq_ignore_ascii_case("content-type:"))
    {
        return Ok("mime");
    }
    TABLE
        .iter()
        .find(|(prefix, _)| payload.starts_with(prefix))
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            ProviderError::permanent(format!(
                "{what} is not a payload cloud-init recognises: it must start with \
                 `#cloud-config`, `#!` (a script), `#cloud-boothook`, `#include`, \
                 `## template: jinja` or be MIME multipart (`Content-Type:`); cloud-init would \
                 silently ignore it"
            ))
        })
}

/// The agent-install script (finding L10): installs qemu-guest-agent only when `qemu-ga` is
/// missing, then enables it (unless it is enabled or static) and starts it with systemd when
/// the guest booted with systemd, else with OpenRC (`rc-update`/`rc-service`) when present,
/// else reports that neither was found. It never fails the boot (always exits 0) and reports
/// every failure on stderr, which cloud-init logs.
pub fn agent_script() -> String {
    format!(
        r#"#!/bin/sh
# egress-proxies: install qemu-guest-agent if it is missing, then enable and start it.
{SCRIPT_PATH_LINE}
log() {{ echo "ep-guest-agent: $*" >&2; }}
have() {{ command -v "$1" >/dev/null 2>&1; }}
if have qemu-ga; then
  log "qemu-guest-agent is already installed"
elif have apt-get; then
  {{ DEBIAN_FRONTEND=noninteractive apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-guest-agent; }} || log "apt-get could not install qemu-guest-agent"
elif have dnf; then
  dnf install -y qemu-guest-agent || log "dnf could not install qemu-guest-agent"
elif have yum; then
  yum install -y qemu-guest-agent || log "yum could not install qemu-guest-agent"
elif have zypper; then
  zypper --non-interactive install qemu-guest-agent || log "zypper could not install qemu-guest-agent"
elif have apk; then
  apk add --no-cache qemu-guest-agent || log "apk could not install qemu-guest-agent"
else
  log "no known package manager: install qemu-guest-agent in the image"
fi
if [ -d {SYSTEMD_RUNTIME_DIR} ] && have systemctl; then
  # NB: the unit is static on Debian/Ubuntu (started by udev); enable may refuse, start works.
  # Not enabled again when it is enabled or static: `systemctl enable` reloads systemd (~6 s
  # of a first boot under TCG) even when it changes nothing.
  case "$(systemctl is-enabled qemu-guest-agent 2>/dev/null)" in
    enabled|static) ;;
    *) systemctl enable qemu-guest-agent >/dev/null 2>&1 || true ;;
  esac
  systemctl start qemu-guest-agent || log "systemctl could not start qemu-guest-agent"
elif have rc-update; then
  rc-update add qemu-guest-agent default || log "rc-update could not enable qemu-guest-agent"
  rc-service qemu-guest-agent start || log "rc-service could not start qemu-guest-agent"
else
  log "neither systemd nor OpenRC found: start qemu-ga with this image's init system"
fi
exit 0
"#
    )
}

/// The vendor-data for `guest`, or `None` when there is none. With `installGuestAgent` and a
/// configured `vendorData`, both are parts of one MIME multipart document (the entry's part
/// first); a configured `vendorData` cloud-init would not recognise is Permanent (L13).
pub fn vendor_data(guest: &GuestSettings) -> Result<Option<String>> {
    let own = match guest.vendor_data.as_deref() {
        Some(v) => Some((v, payload_type("guest.vendorData", v)?)),
        None => None,
    };
    match (guest.install_guest_agent, own) {
        (false, None) => Ok(None),
        (false, Some((v, _))) => Ok(Some(v.to_owned())),
        (true, None) => Ok(Some(agent_script())),
        (true, Some((v, kind))) => Ok(Some(multipart(v, kind, &agent_script()))),
    }
}

/// A `multipart/mixed` document of the entry's vendor-data (of cloud-init type `kind`) and the
/// agent script, with a boundary that occurs in neither.
fn multipart(own: &str, kind: &str, script: &str) -> String {
    let mut n = 0u32;
    let boundary = loop {
        let b = format!("==============ep-seed-{n:04}==");
        if !own.contains(&b) && !script.contains(&b) {
            break b;
        }
        n = n.saturating_add(1);
    };
    let mut out =
        format!("Content-Type: multipart/mixed; boundary=\"{boundary}\"\nMIME-Version: 1.0\n\n");
    out.push_str(&format!("--{boundary}\n"));
    if kind == "mime" {
        // NB: already a MIME document: its headers become the part's headers (nested multipart
        // is walked by cloud-init).
        out.push_str(own);
    } else {
        out.push_str(&format!(
            "Content-Type: {kind}; charset=\"utf-8\"\nMIME-Version: 1.0\n\
             Content-Disposition: attachment; filename=\"vendor-data\"\n\n{own}"
        ));
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!(
        "--{boundary}\nContent-Type: text/x-shellscript; charset=\"utf-8\"\nMIME-Version: 1.0\n\
         Content-Disposition: attachment; filename=\"{AGENT_PART_FILENAME}\"\n\n{script}"
    ));
    out.push_str(&format!("--{boundary}--\n"));
    out
}

fn write_iso(files: &[(&'static str, String)]) -> Result<Vec<u8>> {
    let input = InputFiles {
        path_separator: PathSeparator::ForwardSlash,
        files: files
            .iter()
            .map(|(name, contents)| IsoFile::File {
                name: Arc::new((*name).to_owned()),
                contents: contents.as_bytes().to_vec(),
            })
            .collect(),
    };
    let opts = IsoFormatOptions {
        volume_name: VOLUME_LABEL.to_owned(),
        system_id: None,
        volume_set_id: None,
        publisher_id: None,
        preparer_id: None,
        application_id: None,
        sector_size: 2048,
        path_separator: PathSeparator::ForwardSlash,
        features: CreationFeatures {
            filenames: BaseIsoLevel::Level2 {
                supports_lowercase: true,
                supports_rrip: true,
            },
            long_filenames: false,
            joliet: Some(JolietLevel::Level3),
            rock_ridge: Some(RripOptions::default()),
            ..CreationFeatures::default()
        },
        // NB: keep the label exactly `cidata` (lowercase), as genisoimage -volid does.
        strict_charset: false,
    };
    let out = IsoImageWriter::create(Cursor::new(Vec::new()), input, opts).map_err(|e| {
        ProviderError::transient(format!("encoding the cloud-init seed ISO failed: {e}"))
    })?;
    // NB: the writer grows its buffer by doubling; a create holds the image until its upload
    // is done, and hundreds of creates run at once on a large fleet, so the slack is given
    // back here.
    let mut image = out.into_inner();
    image.shrink_to_fit();
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid() -> ProxyUid {
        ProxyUid::parse_strict("0f8fad5b-d9cb-469f-a165-70867728950e").unwrap()
    }

    #[test]
    fn debug_of_a_seed_and_its_input_never_prints_the_user_data() {
        let guest = GuestSettings::default();
        let input = SeedInput {
            instance_id: &uid(),
            hostname: "p1",
            user_data: "#cloud-config\n# BasicAuth alice s3cr3t-pw-16chars\n",
            network_config: Some("version: 2 # n3t-s3cr3t\n"),
            guest: &guest,
        };
        let shown = format!("{input:?} {input:#?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(
            shown.contains("p1") && shown.contains("redacted"),
            "{shown}"
        );
        let seed = build(&input).unwrap();
        assert!(
            seed.files.iter().any(|(_, t)| t.contains("s3cr3t-pw")),
            "the seed holds it"
        );
        let shown = format!("{seed:?} {seed:#?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("user-data"), "{shown}");
    }

    #[test]
    fn hostile_hostnames_are_refused_as_permanent() {
        for bad in [
            "",
            "a\nb",
            "x: y",
            "-a",
            "a-",
            "a..b",
            &"a".repeat(64),
            "hé",
        ] {
            let e = validate_hostname(bad).unwrap_err();
            assert!(e.is_permanent(), "{bad:?}");
        }
        validate_hostname("proxy-1.example").unwrap();
    }

    #[test]
    fn payload_types_follow_cloud_inits_table() {
        assert_eq!(
            payload_type("x", "#cloud-config\n").unwrap(),
            "text/cloud-config"
        );
        assert_eq!(
            payload_type("x", "#cloud-config-archive\n").unwrap(),
            "text/cloud-config-archive"
        );
        assert_eq!(
            payload_type("x", "#!/bin/sh\n").unwrap(),
            "text/x-shellscript"
        );
        assert_eq!(
            payload_type("x", "Content-Type: multipart/mixed").unwrap(),
            "mime"
        );
        assert!(
            payload_type("x", "packages: [curl]")
                .unwrap_err()
                .is_permanent()
        );
    }

    #[test]
    fn meta_data_names_the_uid_and_hostname() {
        assert_eq!(
            meta_data(&uid(), "p1"),
            "instance-id: 0f8fad5b-d9cb-469f-a165-70867728950e\nlocal-hostname: p1\n"
        );
    }
}
