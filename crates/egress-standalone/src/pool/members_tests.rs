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
        drain: None,
        replaces: None,
    }
}

#[test]
fn a_member_object_pins_the_kept_addresses_and_the_member_file_keeps_them() {
    let p = loaded();
    let uid = member_uid("default", "web", "web-bcdfgh");
    let r = rec(&["203.0.113.7", "2001:db8::7"]);
    let o = member_object(&p, &r, uid, None, &|_| false);
    assert_eq!(o.spec.host.as_deref(), Some("h1"));
    assert_eq!(o.spec.egress.address, ["203.0.113.7", "2001:db8::7"]);
    // The member file round-trips the pin (a restart recreates the same spec).
    let back: MemberRec = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back.pin, r.pin);
    // Without a pin: no declared address, and an older file without the field reads.
    let o = member_object(&p, &rec(&[]), uid, None, &|_| false);
    assert!(o.spec.egress.address.is_empty());
    let old: MemberRec = serde_json::from_str(
        r#"{"name":"web-x","host":"h1","templateHash":"t","created":"2026-01-01T00:00:00Z"}"#,
    )
    .unwrap();
    assert!(old.pin.is_empty());
}

#[test]
fn the_temporary_state_file_is_never_written_through_a_planted_link() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = state_path(dir.path(), "default", "web");
    let tmp = path.with_extension("tmp");
    // Someone who may write the directory plants PATH.tmp -> a file of their choice.
    let decoy = dir.path().join("decoy");
    std::fs::write(&decoy, "decoy\n").unwrap();
    std::os::unix::fs::symlink(&decoy, &tmp).unwrap();
    let e = write_atomic(&path, b"{}").unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert!(e.to_string().contains(&tmp.display().to_string()), "{e}");
    assert_eq!(std::fs::read_to_string(&decoy).unwrap(), "decoy\n");
    assert!(
        std::fs::symlink_metadata(&tmp)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(!path.exists());
    // A dangling link (to where a file would be created) is refused the same way.
    std::fs::remove_file(&tmp).unwrap();
    let target = dir.path().join("created-through-link");
    std::os::unix::fs::symlink(&target, &tmp).unwrap();
    assert!(write_atomic(&path, b"{}").is_err());
    assert!(!target.exists());
    // A regular file left by a crash is replaced; the member file is written, mode 0600.
    std::fs::remove_file(&tmp).unwrap();
    std::fs::write(&tmp, "half-written").unwrap();
    write_atomic(&path, b"{\"members\":[]}").unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"members\":[]}");
    assert!(!tmp.exists());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn a_fifo_at_the_member_file_reads_as_empty_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let path = state_path(dir.path(), "default", "web");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap()
            .success()
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let _ = tx.send(StateFile::read(&p).members.len());
    });
    let n = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("reading a FIFO member file hung");
    assert_eq!(n, 0);
}

#[test]
fn the_member_it_replaces_is_vouched_for_only_while_it_is_a_member_of_this_pool() {
    let p = loaded();
    let uid = member_uid("default", "web", "web-bcdfgh");
    let mut r = rec(&["203.0.113.7"]);
    r.replaces = Some("web-lost".into());
    let o = member_object(&p, &r, uid, None, &|m| m == "web-lost");
    assert_eq!(o.replaces, Some(member_uid("default", "web", "web-lost")));
    // Not (or no longer) a member of this pool: nothing vouched for.
    let o = member_object(&p, &r, uid, None, &|_| false);
    assert_eq!(o.replaces, None);
    // Itself: nothing.
    r.replaces = Some(r.name.clone());
    let o = member_object(&p, &r, uid, None, &|_| true);
    assert_eq!(o.replaces, None);
    // The member file keeps it.
    r.replaces = Some("web-lost".into());
    let back: MemberRec = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back.replaces.as_deref(), Some("web-lost"));
}
