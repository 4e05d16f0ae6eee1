//! The guest's destination firewall: the nftables script `firewall.sh` that user-data
//! stages, and the start-script lines that apply it before the proxy starts (fail closed)
//! and before every later start of the proxy's service (systemd and OpenRC).

use std::fmt::Write as _;

use super::STAGE_DIR;
use crate::proxy_policy::{GuestPolicy, Net};

/// The shell that applies the firewall (fail closed: the script exits when it fails) and
/// makes every later start of the proxy's service (a reboot, a restart) apply it first: on
/// systemd an `ExecStartPre=` drop-in for `unit`; on OpenRC a service
/// `egress-proxy-firewall` that tinyproxy, danted and sockd need (`rc_need` in their
/// `/etc/conf.d` files), so they do not start when it fails.
pub(super) fn apply_firewall(out: &mut String, unit: &str) {
    let _ = writeln!(
        out,
        "if ! sh {STAGE_DIR}/firewall.sh; then\n  \
         echo 'egress-proxy: the destination firewall could not be applied; not starting the proxy' >&2\n  \
         exit 1\nfi\n\
         if [ -d /run/systemd/system ]; then\n  \
         mkdir -p /etc/systemd/system/{unit}.service.d\n  \
         printf '[Service]\\nExecStartPre=/bin/sh {STAGE_DIR}/firewall.sh\\n' > /etc/systemd/system/{unit}.service.d/egress-proxy.conf\n  \
         systemctl daemon-reload\n\
         elif command -v rc-service >/dev/null 2>&1; then\n  \
         printf '#!/sbin/openrc-run\\ndescription=\"egress-proxy destination firewall\"\\ndepend() {{ need net; before tinyproxy danted sockd; }}\\nstart() {{ sh {STAGE_DIR}/firewall.sh; }}\\n' > /etc/init.d/egress-proxy-firewall\n  \
         chmod 0755 /etc/init.d/egress-proxy-firewall\n  \
         rc-update add egress-proxy-firewall default\n  \
         mkdir -p /etc/conf.d\n  \
         for s in tinyproxy danted sockd; do echo 'rc_need=\"egress-proxy-firewall\"' >> /etc/conf.d/$s; done\n\
         fi"
    );
}

/// The nftables set declaration `name` of `family` holding `nets` (none: an empty set).
fn nft_set(out: &mut String, name: &str, v4: bool, nets: &[Net]) {
    let ty = if v4 { "ipv4_addr" } else { "ipv6_addr" };
    let elems: Vec<String> = nets
        .iter()
        .filter(|n| n.addr.is_ipv4() == v4)
        .map(Net::to_string)
        .collect();
    let _ = write!(
        out,
        "  set {name} {{\n    type {ty}; flags interval; auto-merge;\n"
    );
    if !elems.is_empty() {
        let _ = writeln!(out, "    elements = {{ {} }}", elems.join(", "));
    }
    out.push_str("  }\n");
}

/// The guest's firewall script: replaces table `inet egress_proxy` with rules that police
/// `user`'s new connections (see the module docs), then opens DNS to the resolvers of
/// `/etc/resolv.conf` and denies the default gateway. Idempotent; fails when `nft` or the
/// user is missing.
pub fn firewall_script(policy: &GuestPolicy, user: &str) -> String {
    let is_host = |n: &&Net| n.len == if n.addr.is_ipv4() { 32 } else { 128 };
    let host: Vec<Net> = policy.denied.iter().filter(is_host).copied().collect();
    let denied: Vec<Net> = policy
        .denied
        .iter()
        .filter(|n| !is_host(n))
        .copied()
        .collect();
    let mut rules = String::from("table inet egress_proxy {\n");
    for (name, nets) in [
        ("denied", &denied),
        ("host", &host),
        ("lifted", &policy.lifted),
        ("allow", &policy.cidrs),
    ] {
        nft_set(&mut rules, &format!("{name}4"), true, nets);
        nft_set(&mut rules, &format!("{name}6"), false, nets);
    }
    let _ = writeln!(
        rules,
        "  chain output {{\n    type filter hook output priority 0; policy accept;\n    \
         meta skuid \"{user}\" jump proxy\n  }}\n  chain dns {{\n  }}"
    );
    rules.push_str("  chain proxy {\n    ct state established,related accept\n    jump dns\n");
    if !policy.ports.is_empty() {
        let ports: Vec<String> = policy.ports.iter().map(u16::to_string).collect();
        let _ = writeln!(
            rules,
            "    meta l4proto != tcp reject\n    tcp dport != {{ {} }} reject with tcp reset",
            ports.join(", ")
        );
    }
    rules.push_str(
        "    ip daddr @lifted4 goto dest\n    ip6 daddr @lifted6 goto dest\n    \
         ip daddr @host4 reject\n    ip6 daddr @host6 reject\n    \
         ip daddr @denied4 reject\n    ip6 daddr @denied6 reject\n    goto dest\n  }\n",
    );
    rules.push_str("  chain dest {\n");
    if !policy.cidrs.is_empty() {
        rules.push_str("    ip daddr @allow4 accept\n    ip6 daddr @allow6 accept\n    reject\n");
    }
    rules.push_str("  }\n}\n");
    let mut s = String::from(
        "#!/bin/sh\n# Applies the proxy's destination policy (nftables table inet egress_proxy).\n\
         set -e\ncommand -v nft >/dev/null 2>&1\n\
         nft delete table inet egress_proxy 2>/dev/null || true\n\
         nft -f - <<'EGRESS_PROXY_RULES'\n",
    );
    s.push_str(&rules);
    s.push_str(
        "EGRESS_PROXY_RULES\n\
         for ns in $(awk '/^nameserver/ {print $2}' /etc/resolv.conf 2>/dev/null); do\n  \
         ns=${ns%%%*}\n  \
         case \"$ns\" in\n    \
         ''|*[!0-9a-fA-F:.]*) continue ;;\n    \
         *:*) fam=ip6 ;;\n    \
         *) fam=ip ;;\n  \
         esac\n  \
         nft add rule inet egress_proxy dns $fam daddr \"$ns\" udp dport 53 accept\n  \
         nft add rule inet egress_proxy dns $fam daddr \"$ns\" tcp dport 53 accept\n\
         done\n\
         gw=$(ip -o -4 route show default 2>/dev/null | awk '{print $3; exit}')\n\
         case \"$gw\" in\n  \
         ''|*[!0-9.]*) ;;\n  \
         *) nft add element inet egress_proxy host4 \"{ $gw }\" ;;\n\
         esac\n",
    );
    s
}
