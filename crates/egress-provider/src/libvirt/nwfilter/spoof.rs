//! Anti-spoofing: the layer-2 (ebtables) part of a guest NIC's filter set, in the style of
//! libvirt's own `clean-traffic` filters but written here (so an admin's edit of the
//! built-in filters changes nothing) and covering IPv6: four child filters of the root,
//! each a chain of `return` (allowed, go on) rules ending in a drop, all for frames leaving
//! the guest, and the NIC's own parameters ([`nic_params`]) they are instantiated with.
//!
//! | chain | allows (everything else out of the guest is dropped) |
//! |---|---|
//! | `mac` | frames from the NIC's MAC (`$MAC`) |
//! | `ipv4-ip` | a DHCP request from 0.0.0.0; packets from `$IP`; never a DHCP server reply (source port 67) |
//! | `ipv6-ip` | packets from `$IPV6`; from `$IPV6_LL` or `::` except neighbour advertisements; never a router advertisement, redirect or DHCPv6 server reply |
//! | `arp-ip` | ARP with sender MAC `$MAC` and sender address `$IP` or 0.0.0.0 (a probe) |
//!
//! In the root: IPv4, IPv6 and ARP frames that came back from their chain are accepted, any
//! other frame type leaving the guest is dropped.
//!
//! Guarantees: pure rendering, deterministic; the parameters are the NIC's MAC, the
//! addresses the operator declared, and addresses derived from the MAC — never a value a
//! Proxy author wrote.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr};

use ipnet::IpNet;

use super::uuid;

/// The child filters: suffix, libvirt chain, chain priority, rules `(action, priority,
/// protocol element or "")`.
type Child = (
    &'static str,
    &'static str,
    i32,
    &'static [(&'static str, i32, &'static str)],
);

const CHILDREN: &[Child] = &[
    (
        "mac",
        "mac",
        -800,
        &[
            ("return", 500, "<mac srcmacaddr='$MAC'/>"),
            ("drop", 1000, "<mac/>"),
        ],
    ),
    (
        "ipv4",
        "ipv4-ip",
        -710,
        &[
            // A guest never answers as a DHCP server.
            ("drop", 100, "<ip protocol='udp' srcportstart='67'/>"),
            (
                "return",
                200,
                "<ip srcipaddr='0.0.0.0' dstipaddr='255.255.255.255' protocol='udp' \
                 srcportstart='68' dstportstart='67'/>",
            ),
            ("return", 500, "<ip srcipaddr='$IP'/>"),
            ("drop", 1000, ""),
        ],
    ),
    (
        "ipv6",
        "ipv6-ip",
        -610,
        &[
            // Router advertisements and redirects: a guest is never a router.
            ("drop", 100, "<ipv6 protocol='icmpv6' type='134'/>"),
            ("drop", 110, "<ipv6 protocol='icmpv6' type='137'/>"),
            // DHCPv6 server and relay replies.
            ("drop", 120, "<ipv6 protocol='udp' srcportstart='547'/>"),
            ("return", 200, "<ipv6 srcipaddr='$IPV6'/>"),
            // A neighbour advertisement names its target in its body, which no rule can
            // match: only the NIC's own (global) addresses may send one.
            ("drop", 300, "<ipv6 protocol='icmpv6' type='136'/>"),
            ("return", 400, "<ipv6 srcipaddr='$IPV6_LL'/>"),
            ("return", 410, "<ipv6 srcipaddr='::'/>"),
            ("drop", 1000, ""),
        ],
    ),
    (
        "arp",
        "arp-ip",
        -510,
        &[
            (
                "return",
                400,
                "<arp arpsrcmacaddr='$MAC' arpsrcipaddr='$IP'/>",
            ),
            (
                "return",
                410,
                "<arp arpsrcmacaddr='$MAC' arpsrcipaddr='0.0.0.0'/>",
            ),
            ("drop", 1000, ""),
        ],
    ),
];

/// The name of `root`'s child `suffix` (`mac`, `ipv4`, `ipv6`, `arp`).
pub fn child_name(root: &str, suffix: &str) -> String {
    format!("{root}-{suffix}")
}

/// The four child filters of `root`, each `(name, xml)`.
pub fn children(root: &str) -> Vec<(String, String)> {
    CHILDREN
        .iter()
        .map(|(suffix, chain, prio, rules)| {
            let name = child_name(root, suffix);
            let mut x = format!(
                "<filter name='{name}' chain='{chain}' priority='{prio}'>\n  <uuid>{}</uuid>\n",
                uuid(&name).hyphenated()
            );
            for (action, p, body) in *rules {
                if body.is_empty() {
                    let _ = writeln!(
                        x,
                        "  <rule action='{action}' direction='out' priority='{p}'/>"
                    );
                } else {
                    let _ = write!(
                        x,
                        "  <rule action='{action}' direction='out' priority='{p}'>\n    {body}\n  </rule>\n"
                    );
                }
            }
            x.push_str("</filter>\n");
            (name, x)
        })
        .collect()
}

/// The root's layer-2 part: the children referenced, the frame types they checked accepted,
/// every other frame type leaving the guest dropped.
pub(super) fn root_rules(x: &mut String, root: &str) {
    let child = |x: &mut String, s: &str| {
        let _ = writeln!(x, "  <filterref filter='{}'/>", child_name(root, s));
    };
    let accept = |x: &mut String, prio: i32, proto: &str| {
        let _ = write!(
            x,
            "  <rule action='accept' direction='out' priority='{prio}'>\n    <mac protocolid='{proto}'/>\n  </rule>\n"
        );
    };
    child(x, "mac");
    child(x, "ipv4");
    accept(x, -650, "ipv4");
    child(x, "ipv6");
    accept(x, -550, "ipv6");
    child(x, "arp");
    accept(x, -500, "arp");
    let _ = writeln!(x, "  <rule action='drop' direction='out' priority='1000'/>");
}

/// The modified EUI-64 interface identifier of `mac` (`aa:bb:cc:dd:ee:ff`), as the low 64
/// bits of an address; `None` when `mac` is not a MAC.
fn eui64(mac: &str) -> Option<u64> {
    let b: Vec<u8> = mac
        .split(':')
        .map(|p| u8::from_str_radix(p, 16).ok())
        .collect::<Option<_>>()?;
    let [a, b1, c, d, e, f] = <[u8; 6]>::try_from(b).ok()?;
    Some(u64::from_be_bytes([a ^ 0x02, b1, c, 0xff, 0xfe, d, e, f]))
}

/// The link-local address a guest forms from `mac` (EUI-64, the kernel's default).
pub fn link_local(mac: &str) -> Option<Ipv6Addr> {
    eui64(mac).map(|id| Ipv6Addr::from((0xfe80u128 << 112) | u128::from(id)))
}

/// The parameters of a NIC's `<filterref>`: `MAC`; `IP` (its declared IPv4 address, or
/// 0.0.0.0 when it has declared addresses but none of IPv4, with learning off; without any
/// declared address `IP` is left for libvirt to learn from the DHCP lease it watches the
/// guest get, `CTRL_IP_LEARNING=dhcp`); `IPV6` (its declared IPv6 addresses, else the
/// SLAAC address its MAC forms in each IPv6 /64 of `guest_cidrs`, else `::`, which adds
/// nothing); `IPV6_LL` (its link-local address).
pub fn nic_params(
    mac: &str,
    declared: &[IpAddr],
    guest_cidrs: &[IpNet],
) -> Vec<(&'static str, String)> {
    let mut p = vec![("MAC", mac.to_ascii_lowercase())];
    let v4: Vec<&IpAddr> = declared.iter().filter(|a| a.is_ipv4()).collect();
    if !v4.is_empty() {
        p.extend(v4.iter().map(|a| ("IP", a.to_string())));
        p.push(("CTRL_IP_LEARNING", "none".into()));
    } else if !declared.is_empty() {
        p.push(("IP", "0.0.0.0".into()));
        p.push(("CTRL_IP_LEARNING", "none".into()));
    } else {
        p.push(("CTRL_IP_LEARNING", "dhcp".into()));
    }
    let mut v6: Vec<String> = declared
        .iter()
        .filter(|a| a.is_ipv6())
        .map(ToString::to_string)
        .collect();
    if declared.is_empty()
        && let Some(id) = eui64(mac)
    {
        for n in guest_cidrs {
            if let IpNet::V6(n) = n
                && n.prefix_len() <= 64
            {
                let net = u128::from(n.network()) & !u128::from(u64::MAX);
                v6.push(Ipv6Addr::from(net | u128::from(id)).to_string());
            }
        }
    }
    if v6.is_empty() {
        v6.push("::".into());
    }
    p.extend(v6.into_iter().map(|a| ("IPV6", a)));
    if let Some(ll) = link_local(mac) {
        p.push(("IPV6_LL", ll.to_string()));
    }
    p
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn get<'a>(p: &'a [(&str, String)], k: &str) -> Vec<&'a str> {
        p.iter()
            .filter(|(n, _)| *n == k)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    #[test]
    fn a_declared_nic_is_pinned_to_its_addresses_and_learns_nothing() {
        let d: Vec<IpAddr> = vec!["198.18.5.50".parse().unwrap(), "fd00::50".parse().unwrap()];
        let p = nic_params("52:54:00:AB:CD:EF", &d, &[]);
        assert_eq!(get(&p, "MAC"), ["52:54:00:ab:cd:ef"]);
        assert_eq!(get(&p, "IP"), ["198.18.5.50"]);
        assert_eq!(get(&p, "CTRL_IP_LEARNING"), ["none"]);
        assert_eq!(get(&p, "IPV6"), ["fd00::50"]);
        assert_eq!(get(&p, "IPV6_LL"), ["fe80::5054:ff:feab:cdef"]);
        // IPv6 only: no IPv4 address at all.
        let p = nic_params("52:54:00:ab:cd:ef", &d[1..], &[]);
        assert_eq!(get(&p, "IP"), ["0.0.0.0"]);
    }

    #[test]
    fn a_dhcp_nic_has_its_lease_learned_and_its_slaac_address_derived() {
        let cidrs: Vec<IpNet> = vec![
            "10.0.0.0/24".parse().unwrap(),
            "2001:db8:1::/64".parse().unwrap(),
        ];
        let p = nic_params("52:54:00:12:34:56", &[], &cidrs);
        assert!(get(&p, "IP").is_empty());
        assert_eq!(get(&p, "CTRL_IP_LEARNING"), ["dhcp"]);
        assert_eq!(get(&p, "IPV6"), ["2001:db8:1:0:5054:ff:fe12:3456"]);
        let p = nic_params("52:54:00:12:34:56", &[], &[]);
        assert_eq!(get(&p, "IPV6"), ["::"]);
    }

    #[test]
    fn every_child_ends_in_a_drop_of_what_it_did_not_return() {
        let set = children("ep-e-filter2");
        let names: Vec<&str> = set.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "ep-e-filter2-mac",
                "ep-e-filter2-ipv4",
                "ep-e-filter2-ipv6",
                "ep-e-filter2-arp"
            ]
        );
        for (n, x) in &set {
            let last_rule = x.rfind("<rule").unwrap();
            assert!(x[last_rule..].contains("action='drop'"), "{n}: {x}");
            assert!(!x.contains("direction='in"), "{n}: only frames out: {x}");
        }
        let mut root = String::new();
        root_rules(&mut root, "ep-e-filter2");
        for (n, _) in &set {
            assert!(
                root.contains(&format!("<filterref filter='{n}'/>")),
                "{root}"
            );
        }
    }
}
