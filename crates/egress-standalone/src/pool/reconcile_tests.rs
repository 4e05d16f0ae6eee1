//! The credentials digest of the members' template hash.

#![allow(clippy::unwrap_used)]
use super::*;

#[test]
fn a_chosen_password_enters_the_template_hash_only_keyed() {
    let dir = tempfile::tempdir().unwrap();
    let chosen = ProxyCredentials {
        username: "alice".into(),
        password: "hunter2".into(),
    };
    let d = template_digest_in(dir.path(), false, &chosen).unwrap();
    // What someone who read the template hash could compute from a guess, without the key.
    assert_ne!(d, credentials::digest(&chosen));
    let key = ensure_digest_key(dir.path()).unwrap();
    assert_eq!(d, credentials::keyed_digest(&key, &chosen));
    assert_eq!(
        template_digest_in(dir.path(), false, &chosen).unwrap(),
        d,
        "stable"
    );
    // Generated credentials keep their unkeyed digest (their members are not replaced).
    assert_eq!(
        template_digest_in(dir.path(), true, &chosen).unwrap(),
        credentials::digest(&chosen)
    );
}
