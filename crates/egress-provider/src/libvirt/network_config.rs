//! The cloud-init network-config (version 2) that gives a guest its declared egress
//! addresses: our NIC matched by its MAC, static addresses, default routes and DNS, no DHCP.
//!
//! Guarantees:
//! - only the interface whose MAC is ours is configured (matched by `macaddress`, whatever
//!   name the image gives it; the name is left as the image chose), and DHCP and router
//!   advertisements are off on it (`accept-ra: false`, for renderers that honour it: with
//!   DHCP off, cloud-init's own systemd-networkd renderer ignores it and the guest accepts
//!   them as systemd-networkd does by default: a segment that sends them adds addresses), so the guest takes no address other than the
//!   declared ones from the host;
//! - every value written is an IP address, a prefix length or a MAC we checked, so the YAML
//!   needs no quoting beyond the fixed strings here (nothing from a Proxy author is inserted);
//! - pure: the same inputs give the same bytes.

use std::fmt::Write as _;
use std::net::IpAddr;

use super::address_pool::ParsedPool;

/// The interface's id in the document (cloud-init's key for it; the guest keeps its own
/// interface name: renaming is left out because not every renderer supports it).
pub const INTERFACE: &str = "egress0";

/// One static address of the guest and its family's prefix length and gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaticAddress {
    /// The address.
    pub address: IpAddr,
    /// The prefix length of its network.
    pub prefix_len: u8,
    /// The default gateway for its family.
    pub gateway: IpAddr,
}

impl StaticAddress {
    /// `address` with the prefix and gateway of its family in `pool`, if the pool has it.
    pub fn in_pool(address: IpAddr, pool: &ParsedPool) -> Option<Self> {
        let f = pool.family(address)?;
        Some(Self {
            address,
            prefix_len: f.prefix.prefix_len(),
            gateway: f.gateway,
        })
    }
}

/// Whether `mac` is six colon-separated hex octets (the only MAC form rendered).
fn is_mac(mac: &str) -> bool {
    let parts: Vec<&str> = mac.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The network-config for the NIC with `mac`: `addresses` (at most one per family), their
/// default routes, and `dns`. `None` when `mac` is not a MAC or `addresses` is empty.
pub fn render(mac: &str, addresses: &[StaticAddress], dns: &[IpAddr]) -> Option<String> {
    if !is_mac(mac) || addresses.is_empty() {
        return None;
    }
    let mut s = String::new();
    // NB: write! to a String cannot fail.
    let _ = writeln!(s, "version: 2");
    let _ = writeln!(s, "ethernets:");
    let _ = writeln!(s, "  {INTERFACE}:");
    let _ = writeln!(s, "    match:");
    let _ = writeln!(s, "      macaddress: \"{}\"", mac.to_ascii_lowercase());
    let _ = writeln!(s, "    dhcp4: false");
    let _ = writeln!(s, "    dhcp6: false");
    let _ = writeln!(s, "    accept-ra: false");
    let _ = writeln!(s, "    addresses:");
    for a in addresses {
        let _ = writeln!(s, "      - \"{}/{}\"", a.address, a.prefix_len);
    }
    let _ = writeln!(s, "    routes:");
    for a in addresses {
        let to = if a.address.is_ipv4() {
            "0.0.0.0/0"
        } else {
            "::/0"
        };
        let _ = writeln!(s, "      - to: \"{to}\"");
        let _ = writeln!(s, "        via: \"{}\"", a.gateway);
    }
    if !dns.is_empty() {
        let _ = writeln!(s, "    nameservers:");
        let _ = writeln!(s, "      addresses:");
        for d in dns {
            let _ = writeln!(s, "        - \"{d}\"");
        }
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::libvirt::address_pool::{AddressPool, FamilyPool};

    #[test]
    fn both_families_static_no_dhcp_matched_by_mac() {
        let pool = AddressPool {
            ipv4: Some(FamilyPool {
                prefix: "203.0.113.0/28".into(),
                gateway: "203.0.113.1".into(),
                ranges: vec!["203.0.113.2-203.0.113.14".into()],
            }),
            ipv6: Some(FamilyPool {
                prefix: "2001:db8:1::/64".into(),
                gateway: "2001:db8:1::1".into(),
                ranges: vec!["2001:db8:1::100/120".into()],
            }),
            dns: vec!["203.0.113.53".into()],
            access: None,
            hold_released: crate::libvirt::address_pool::DEFAULT_HOLD_RELEASED,
        }
        .parse()
        .unwrap();
        let a4 = StaticAddress::in_pool("203.0.113.5".parse().unwrap(), &pool).unwrap();
        let a6 = StaticAddress::in_pool("2001:db8:1::105".parse().unwrap(), &pool).unwrap();
        let out = render("52:54:00:AB:cd:01", &[a4, a6], &pool.dns).unwrap();
        assert_eq!(
            out,
            "version: 2\nethernets:\n  egress0:\n    match:\n      macaddress: \"52:54:00:ab:cd:01\"\n    \
         dhcp4: false\n    dhcp6: false\n    accept-ra: false\n    addresses:\n      \
             - \"203.0.113.5/28\"\n      - \"2001:db8:1::105/64\"\n    routes:\n      - to: \"0.0.0.0/0\"\n        \
             via: \"203.0.113.1\"\n      - to: \"::/0\"\n        via: \"2001:db8:1::1\"\n    nameservers:\n      \
             addresses:\n        - \"203.0.113.53\"\n"
        );
    }

    #[test]
    fn nothing_rendered_for_a_bad_mac_or_no_address() {
        let a = StaticAddress {
            address: "203.0.113.5".parse().unwrap(),
            prefix_len: 28,
            gateway: "203.0.113.1".parse().unwrap(),
        };
        assert!(render("52:54:00:ab:cd", &[a], &[]).is_none());
        assert!(render("52:54:00:ab:cd:0g", &[a], &[]).is_none());
        assert!(render("52:54:00:ab:cd:01\n", &[a], &[]).is_none());
        assert!(render("52:54:00:ab:cd:01", &[], &[]).is_none());
        assert!(
            !render("52:54:00:ab:cd:01", &[a], &[])
                .unwrap()
                .contains("nameservers")
        );
    }
}
