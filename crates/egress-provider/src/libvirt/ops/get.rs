//! Observing one instance: the domain named by the providerID, only if it carries our mark for
//! the expected UID, with its state, reason and our NIC's address.
//!
//! Guarantees: a domain that does not exist, vanishes while being read (finding L6), has no
//! mark, a mark in another namespace, of another entry, of another UID, or an invalid one, is
//! NotFound to us — never "ours" (finding M2); a providerID naming another entry or a name not
//! derived from the UID is NotFound without any call; paused is never Stopped (M1); a
//! connection-class failure at any step, the address read included, fails Transient (H3).
//!
//! Declared egress addresses: [`Instance::egress`] is what the mark records. On a host with an
//! address pool, the instance's address is the one we configured in the guest (the mark's,
//! IPv4 first) when it lies inside the pool's prefix for its family: the operator chose it and
//! wrote it into the seed, so it is trusted as the host's own answers are, and no lease, ARP
//! entry or agent is asked (a network without DHCP has no lease). A mark address outside the
//! prefix (the pool was changed since) is not used; the usual sources are asked then.

use std::sync::Arc;
use std::time::SystemTime;

use libvirt_remote::proto::Domain;
use libvirt_remote::{Client, Error as LvError};

use super::trust::{self, SubnetCache};
use super::{CODE_NO_DOMAIN, CODE_NO_DOMAIN_METADATA, address, classify, is_code, state};
use crate::error::{ProviderError, Result};
use crate::libvirt::config::HostConfig;
use crate::libvirt::{mark, names};
use crate::model::{Instance, ProviderId, ProxyUid};

/// Observes the instance `id` of `uid` in `entry` on `host`, whose connection is `client`.
/// Ok only for a domain whose mark is valid for `entry` and `uid`; NotFound otherwise. The
/// host's guest subnets are read for this call alone (see [`get_cached`]).
pub async fn get(
    client: &Client,
    entry: &str,
    installation: Option<&str>,
    host: &HostConfig,
    id: &ProviderId,
    uid: &ProxyUid,
) -> Result<Instance> {
    get_cached(client, entry, installation, host, id, uid, None).await
}

/// [`get`], reading the host's guest subnets through `cache` (with the control connection's
/// number, so a new connection reads them again) when given: no extra round trip per get in
/// the steady state. The subnets are read only for a domain whose address is wanted.
pub async fn get_cached(
    client: &Client,
    entry: &str,
    installation: Option<&str>,
    host: &HostConfig,
    id: &ProviderId,
    uid: &ProxyUid,
    cache: Option<(&SubnetCache, u64)>,
) -> Result<Instance> {
    let expected = names::domain(entry, uid);
    if id.entry != entry || id.host != host.name || id.name != expected {
        return Err(ProviderError::not_found(format!(
            "providerID {id} is not the instance of Proxy {uid} in entry {entry} on host {} \
             (expected domain {expected})",
            host.name
        )));
    }
    let vanished = |e: LvError| -> ProviderError {
        if is_code(&e, CODE_NO_DOMAIN) {
            ProviderError::not_found(format!(
                "domain {expected} does not exist on host {}",
                host.name
            ))
            .with_code(e.libvirt_code())
        } else {
            classify(
                &e,
                &format!("reading domain {expected} on host {}", host.name),
            )
        }
    };
    let dom = client
        .domain_lookup_by_name(&expected)
        .await
        .map_err(vanished)?;
    let m = own_mark(client, &dom, entry, installation, uid, &host.name)
        .await?
        .ok_or_else(|| {
            ProviderError::not_found(format!(
                "domain {expected} on host {} carries no valid mark of entry {entry} for \
                 Proxy {uid}; it is not ours and is left alone",
                host.name
            ))
        })?;
    let (st, reason) = client.domain_state(&dom).await.map_err(vanished)?;
    // NB: a guest created before the 40-bit MAC derivation keeps its legacy MAC: our NIC is
    // the one with either (both derive from this UID); the one the address was found by is
    // reported, else the current derivation.
    let macs = names::macs(entry, uid);
    let declared = declared_address(host, &m.addresses);
    let read = if state::wants_address(st) && declared.is_some() {
        address::AddressRead {
            ip: declared,
            note: None,
            mac: None,
        }
    } else if state::wants_address(st) {
        let subnets = match cache {
            Some((c, connection)) => c.get(client, host, connection).await,
            None => Arc::new(trust::read(client, host).await.0),
        };
        address::read_address_within(client, &dom, &macs, host, &subnets).await?
    } else {
        address::AddressRead::default()
    };
    Ok(Instance {
        id: id.clone(),
        uid: *uid,
        state: state::map(st, reason, read.ip.is_some()),
        ip: read.ip,
        mac: read.mac.unwrap_or_else(|| {
            let [current, _] = macs;
            current
        }),
        egress: m.addresses,
        address_note: read.note,
    })
}

/// The address of `addresses` (IPv4 first) inside its family's prefix of `host`'s address
/// pool; `None` without a pool or without such an address.
fn declared_address(host: &HostConfig, addresses: &[std::net::IpAddr]) -> Option<std::net::IpAddr> {
    if addresses.is_empty() {
        return None;
    }
    let pool = host.address_pool.as_ref()?.parse().ok()?;
    addresses
        .iter()
        .copied()
        .find(|a| pool.family(*a).is_some_and(|f| f.prefix.contains(a)))
}

/// What a domain's mark says about ownership by `entry` for `uid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkCheck {
    /// A valid mark of `entry` for `uid`.
    Ours,
    /// No metadata under our namespace.
    Unmarked,
    /// A valid mark of `entry`, for another UID.
    OtherUid(ProxyUid),
    /// A valid mark of `entry` written by another installation.
    OtherInstallation,
    /// Something under our namespace that is not a valid mark of `entry`.
    Invalid,
}

impl MarkCheck {
    /// Words for messages ("no mark of ours", "mark of Proxy X").
    pub fn describe(&self) -> String {
        match self {
            Self::Ours => "our mark".into(),
            Self::Unmarked => "no mark under our namespace".into(),
            Self::OtherUid(u) => format!("a mark of Proxy {u}"),
            Self::OtherInstallation => "a mark of another installation".into(),
            Self::Invalid => {
                "a mark that is not valid for this entry (other entry, unmanaged, padded or \
                 malformed)"
                    .into()
            }
        }
    }
}

/// Reads and checks the mark of `dom` for the installation `installation`. `Err` for
/// connection-class failures and for a domain that vanished (NotFound); `Ok(check)` otherwise.
/// A mark without an installation ID is ours (it predates installation identity; the listing
/// rewrites it); one with another installation's ID is [`MarkCheck::OtherInstallation`].
pub async fn check_mark(
    client: &Client,
    dom: &Domain,
    entry: &str,
    installation: Option<&str>,
    uid: &ProxyUid,
    host: &str,
) -> Result<MarkCheck> {
    match client.domain_metadata(dom, mark::NAMESPACE, 0).await {
        Ok(xml) => Ok(match mark::parse(&xml, entry, SystemTime::now()) {
            Some(m) if m.owner(installation) == mark::Owner::Foreign => {
                MarkCheck::OtherInstallation
            }
            Some(m) if m.uid == *uid => MarkCheck::Ours,
            Some(m) => MarkCheck::OtherUid(m.uid),
            None => MarkCheck::Invalid,
        }),
        Err(e) if is_code(&e, CODE_NO_DOMAIN_METADATA) => Ok(MarkCheck::Unmarked),
        Err(e) if is_code(&e, CODE_NO_DOMAIN) => Err(ProviderError::not_found(format!(
            "domain {} on host {host} vanished while its mark was read",
            dom.name
        ))
        .with_code(e.libvirt_code())),
        Err(e) => Err(classify(
            &e,
            &format!("reading the mark of domain {} on host {host}", dom.name),
        )),
    }
}

/// The mark of `dom` when it is a valid mark of `entry` for `uid` that is not another
/// installation's ([`MarkCheck::Ours`]); `None` otherwise. Errors as [`check_mark`].
async fn own_mark(
    client: &Client,
    dom: &Domain,
    entry: &str,
    installation: Option<&str>,
    uid: &ProxyUid,
    host: &str,
) -> Result<Option<mark::Mark>> {
    match client.domain_metadata(dom, mark::NAMESPACE, 0).await {
        Ok(xml) => Ok(mark::parse(&xml, entry, SystemTime::now())
            .filter(|m| m.owner(installation) != mark::Owner::Foreign && m.uid == *uid)),
        Err(e) if is_code(&e, CODE_NO_DOMAIN_METADATA) => Ok(None),
        Err(e) if is_code(&e, CODE_NO_DOMAIN) => Err(ProviderError::not_found(format!(
            "domain {} on host {host} vanished while its mark was read",
            dom.name
        ))
        .with_code(e.libvirt_code())),
        Err(e) => Err(classify(
            &e,
            &format!("reading the mark of domain {} on host {host}", dom.name),
        )),
    }
}
