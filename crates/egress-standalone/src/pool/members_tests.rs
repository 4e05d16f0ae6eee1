//! A member's object carries the egress addresses its create pins, and the member file keeps
//! them across restarts.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use egress_core::pool::spec::ProxyPoolSpec;

fn loaded() -> LoadedPool {
    let spec: ProxyPoolSpec = serde_json::from_str(
        r#"{"replicas":1,"template":{"spec":{"provider":"home","image":"tiny",
            "proxy":{"allowedClientCidrs":["10.0.0.0/8"]}}}}"#,
    )
    .unwrap();
    LoadedPool {
        namespace: "default".into(),
        name: "web".into(),
        policy: spec.validate().unwrap(),
        spec,
        credentials: None,
        gateway_clients: Vec::new(),
        file: PathBuf::from("web.yaml"),
        spec_hash: [0; 32],
    }
}

fn rec(pin: &[&str]) -> MemberRec {
    MemberRec {
        name: "web-bcdfgh".into(),
        host: "h1".into(),
        template_hash: "t".into(),
        created: "2026-01-01T00:00:00Z".into(),
        deleting: false,
        was_available: false,
        pin: pin.iter().map(|a| a.parse().unwrap()).collect(),
    }
}

#[test]
fn a_member_object_pins_the_kept_addresses_and_the_member_file_keeps_them() {
    let p = loaded();
    let uid = member_uid("default", "web", "web-bcdfgh");
    let r = rec(&["203.0.113.7", "2001:db8::7"]);
    let o = member_object(&p, &r, uid, None);
    assert_eq!(o.spec.host.as_deref(), Some("h1"));
    assert_eq!(o.spec.egress.address, ["203.0.113.7", "2001:db8::7"]);
    // The member file round-trips the pin (a restart recreates the same spec).
    let back: MemberRec = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back.pin, r.pin);
    // Without a pin: no declared address, and an older file without the field reads.
    let o = member_object(&p, &rec(&[]), uid, None);
    assert!(o.spec.egress.address.is_empty());
    let old: MemberRec = serde_json::from_str(
        r#"{"name":"web-x","host":"h1","templateHash":"t","created":"2026-01-01T00:00:00Z"}"#,
    )
    .unwrap();
    assert!(old.pin.is_empty());
}
