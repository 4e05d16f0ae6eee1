//! Installation identity on the libvirt provider's list, get and delete, against
//! libvirt-fake: a mark written before installation identity existed is adopted once and
//! rewritten with this installation's ID; another installation's mark is never listed,
//! adopted, deleted or written to.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::{Duration, SystemTime};

use egress_provider::libvirt::config::{HostConfig, VirtType};
use egress_provider::libvirt::ops::{delete, get, list};
use egress_provider::libvirt::{mark, names};
use egress_provider::{ProviderId, ProxyUid};
use libvirt_fake::{DomainSpec, FakeLibvirt, PoolSpec};
use libvirt_remote::{Client, OpenOptions};

const ENTRY: &str = "home";
const OURS: &str = "site-a";
const THEIRS: &str = "site-b";
/// Deadline of every call in these tests (the fake answers at once).
const CALL_BUDGET: Duration = Duration::from_secs(10);

fn uid(n: u8) -> ProxyUid {
    ProxyUid::parse_strict(&format!("0f8fad5b-d9cb-469f-a165-7086772895{n:02x}")).unwrap()
}

fn created() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000)
}

fn host() -> HostConfig {
    HostConfig {
        name: "h1".into(),
        address: "127.0.0.1:22".into(),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: "default".into(),
        bridge: Some("br0".into()),
        network: None,
        virt_type: VirtType::Auto,
        pool_reserve_gib: 0,
        ssh_key_file: None,
        known_hosts_file: None,
        max_concurrent: 4,
        guest_cidr: Vec::new(),
        address_pool: None,
        maintenance: Default::default(),
        segment: None,
        fence: None,
        host_addresses: Vec::new(),
        capacity: Default::default(),
        access: None,
    }
}

async fn open(fake: &FakeLibvirt) -> Client {
    tokio::time::timeout(
        CALL_BUDGET,
        Client::open(fake.connect_duplex(), OpenOptions::default()),
    )
    .await
    .unwrap()
    .unwrap()
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(CALL_BUDGET, f)
        .await
        .expect("call exceeded its budget")
}

fn fake() -> FakeLibvirt {
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new("default")).unwrap();
    fake
}

#[tokio::test]
async fn a_mark_in_todays_format_is_adopted_once_and_rewritten_with_our_installation() {
    let fake = fake();
    let (a, renamed) = (uid(1), uid(2));
    let name = names::domain(ENTRY, &a);
    fake.add_domain(
        DomainSpec::new(name.clone())
            .running()
            .metadata(mark::NAMESPACE, mark::render(&a, ENTRY, created())),
    )
    .unwrap();
    // Under a name not derived from its UID: never written to.
    fake.add_domain(
        DomainSpec::new("renamed-by-hand")
            .metadata(mark::NAMESPACE, mark::render(&renamed, ENTRY, created())),
    )
    .unwrap();
    let c = open(&fake).await;
    let before = SystemTime::now() - Duration::from_secs(1);
    let first = within(list::list_owned(&c, ENTRY, Some(OURS), "h1"))
        .await
        .unwrap();
    let adopted = first.iter().find(|o| o.uid == a).expect("adopted, listed");
    assert!(
        adopted.created_at >= before,
        "the pass that adopts a mark reports it with age zero: {adopted:?}"
    );
    let stored = fake.domain_metadata(&name, mark::NAMESPACE).unwrap();
    let m = mark::parse(&stored, ENTRY, SystemTime::now()).expect("still a valid mark");
    assert_eq!(m.installation.as_deref(), Some(OURS), "{stored}");
    assert_eq!(
        (m.uid, m.recorded_at),
        (a, created()),
        "only the ID was added"
    );
    assert_eq!(
        fake.domain_metadata("renamed-by-hand", mark::NAMESPACE)
            .unwrap(),
        mark::render(&renamed, ENTRY, created()),
        "a domain GC may not collect is never written to"
    );
    // The next listing reads our mark: the recorded age, nothing rewritten again.
    let second = within(list::list_owned(&c, ENTRY, Some(OURS), "h1"))
        .await
        .unwrap();
    let again = second.iter().find(|o| o.uid == a).unwrap();
    assert_eq!(again.created_at, created());
    assert_eq!(
        fake.domain_metadata(&name, mark::NAMESPACE).unwrap(),
        stored
    );
    // And the instance is ours for get.
    let id = ProviderId {
        entry: ENTRY.into(),
        host: "h1".into(),
        name: name.clone(),
    };
    within(get::get(&c, ENTRY, Some(OURS), &host(), &id, &a))
        .await
        .unwrap();
    // Another installation now sees it as foreign.
    let theirs = within(list::list_owned(&c, ENTRY, Some(THEIRS), "h1"))
        .await
        .unwrap();
    assert!(theirs.iter().all(|o| o.uid != a), "{theirs:?}");
}

#[tokio::test]
async fn a_mark_of_another_installation_is_never_listed_adopted_deleted_or_rewritten() {
    let fake = fake();
    let b = uid(3);
    let name = names::domain(ENTRY, &b);
    let theirs = mark::render_for(&b, ENTRY, Some(THEIRS), created());
    fake.add_domain(
        DomainSpec::new(name.clone())
            .running()
            .metadata(mark::NAMESPACE, theirs.clone()),
    )
    .unwrap();
    let c = open(&fake).await;
    let got = within(list::list_owned(&c, ENTRY, Some(OURS), "h1"))
        .await
        .unwrap();
    assert!(got.is_empty(), "{got:?}");
    // An installation without an ID does not take it either.
    let got = within(list::list_owned(&c, ENTRY, None, "h1"))
        .await
        .unwrap();
    assert!(got.is_empty(), "{got:?}");
    let id = ProviderId {
        entry: ENTRY.into(),
        host: "h1".into(),
        name: name.clone(),
    };
    let e = within(get::get(&c, ENTRY, Some(OURS), &host(), &id, &b))
        .await
        .unwrap_err();
    assert!(e.message.contains("no valid mark"), "{e}");
    let e = within(delete::delete(&c, ENTRY, Some(OURS), &host(), &b))
        .await
        .unwrap_err();
    assert!(
        e.is_permanent() && e.message.contains("another installation"),
        "{e}"
    );
    assert!(fake.domain(&name).is_some(), "never deleted");
    assert_eq!(
        fake.domain_metadata(&name, mark::NAMESPACE).unwrap(),
        theirs,
        "never rewritten"
    );
    // Its own installation lists it as usual.
    let got = within(list::list_owned(&c, ENTRY, Some(THEIRS), "h1"))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
}
