//! Disk images that cannot reach outside themselves: qcow2 images crafted with `qemu-img`
//! (a backing file, an external data file, LUKS encryption) and a raw LUKS container are
//! refused from their first bytes while streaming, Permanent, naming the image and what its
//! header shows, before any byte reaches the upload, and leave nothing in the pool — against
//! libvirt-fake and the real libvirtd (where libvirt's own reading of an uploaded volume would
//! also refuse a backing file, but only after the whole image was uploaded).
//! Every file an image names is a decoy in the test's own scratch directory, never a system
//! file (libvirt relabels the files of a backing chain).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod image_fixtures;
mod image_support;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use egress_provider::libvirt::config::{Firmware, ImageFormat, ImageSpec};
use egress_provider::libvirt::image::format::SNIFF_LEN;
use egress_provider::libvirt::image::{self, Base, BulkConnect, FetchOptions, Target};
use egress_provider::{ErrorClass, NoProgress, Progress, ProviderError};
use image_fixtures::{FakeBulk, entry};
use image_support::{ImageServer, Route, sha};
use libvirt_fake::{FakeLibvirt, PoolSpec};
use libvirt_remote::Client;

const POOL: &str = "images";
const MIB: u64 = 1 << 20;
/// Data appended to each crafted image, so that a refusal "from the first bytes" is visible
/// as most of the body never being sent.
const PAD: usize = 24 << 20;

fn spec(url: &str, sha256: &str, format: ImageFormat) -> ImageSpec {
    ImageSpec {
        url: url.into(),
        sha256: Some(sha256.into()),
        format,
        firmware: Firmware::Bios,
        ca_file: None,
    }
}

/// `qemu-img create -q -f FORMAT EXTRA... DIR/NAME SIZE`, read back (then padded).
fn qemu_img(dir: &Path, format: &str, name: &str, extra: &[&str]) -> Vec<u8> {
    let p = dir.join(name);
    let out = Command::new("timeout")
        .args(["60", "qemu-img", "create", "-q", "-f", format])
        .args(extra)
        .arg(&p)
        .arg("16M")
        .output()
        .expect("qemu-img");
    assert!(
        out.status.success(),
        "qemu-img: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut b = std::fs::read(&p).unwrap();
    b.extend((0..PAD).map(|i| (i % 251) as u8));
    b
}

/// The crafted images: (route, declared format, bytes, what the refusal must say: the field
/// of the header that refused it).
fn crafted(dir: &Path) -> Vec<(&'static str, ImageFormat, Vec<u8>, &'static str)> {
    let decoy = dir.join("decoy.raw");
    std::fs::write(&decoy, vec![0x5a; 1 << 16]).unwrap();
    let decoy = decoy.to_str().unwrap().to_owned();
    let data = dir.join("data.raw").to_str().unwrap().to_owned();
    let secret = "secret,id=sec0,data=not-a-real-secret";
    vec![
        (
            "/backing.qcow2",
            ImageFormat::Qcow2,
            qemu_img(dir, "qcow2", "backing.qcow2", &["-b", &decoy, "-F", "raw"]),
            "backing file (qcow2 header backing_file_offset",
        ),
        (
            "/datafile.qcow2",
            ImageFormat::Qcow2,
            qemu_img(
                dir,
                "qcow2",
                "datafile.qcow2",
                &["-o", &format!("data_file={data}")],
            ),
            "external data file (qcow2 incompatible feature bit 2 set",
        ),
        (
            "/luks.qcow2",
            ImageFormat::Qcow2,
            qemu_img(
                dir,
                "qcow2",
                "luks.qcow2",
                &[
                    "--object",
                    secret,
                    "-o",
                    "encrypt.format=luks,encrypt.key-secret=sec0",
                ],
            ),
            "encrypted (LUKS; qcow2 header crypt_method 2)",
        ),
        (
            "/luks.raw",
            ImageFormat::Raw,
            qemu_img(
                dir,
                "luks",
                "luks.raw",
                &["--object", secret, "-o", "key-secret=sec0"],
            ),
            "LUKS-encrypted",
        ),
    ]
}

/// The refusal is Permanent and names the image (its URL) and what was refused.
fn assert_refused(r: &Result<Base, ProviderError>, path: &str, says: &str) {
    let e = r
        .as_ref()
        .expect_err("a self-escaping image must be refused");
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(e.message.contains("image http://127.0.0.1:"), "{e}");
    assert!(e.message.contains(path), "{e}");
    assert!(e.message.contains(says), "{path}: {e}");
}

/// The bytes an import handed on to its upload: its progress, reported as bytes are passed to
/// libvirt.
#[derive(Debug, Default)]
struct HandedOn(AtomicU64);

impl Progress for HandedOn {
    fn update(&self, done: u64, _total: Option<u64>) {
        self.0.fetch_max(done, Ordering::Relaxed);
    }
}

/// The refusal came from the header, before the upload went further: fewer bytes than the
/// header reached the upload (none once the first chunk holds the header), and the download
/// stopped long before the body's end.
fn assert_refused_before_the_upload(
    server: &ImageServer,
    path: &str,
    bytes: &[u8],
    handed: &HandedOn,
) {
    let up = handed.0.load(Ordering::Relaxed);
    assert!(
        up < SNIFF_LEN as u64,
        "{path}: {up} bytes were handed to the upload; the header alone must refuse the image"
    );
    assert!(
        server.body_bytes_sent(path) < bytes.len() as u64,
        "{path}: refused from the first bytes, not after the whole body ({} of {})",
        server.body_bytes_sent(path),
        bytes.len()
    );
}

/// Bound for each test body.
// NB: four imports of a few MiB and, for the real daemon, an sshd start-up: seconds on an
// idle box; two minutes covers a loaded 2-core CI machine.
const BUDGET: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_with_a_backing_file_a_data_file_or_encryption_are_refused_while_streaming_on_the_fake()
 {
    tokio::time::timeout(BUDGET, async {
        let scratch = tempfile::tempdir().unwrap();
        let fake = FakeLibvirt::new();
        fake.add_pool(PoolSpec::new(POOL).capacity(400 * MIB).path("/pool"))
            .unwrap();
        let bulk = FakeBulk(fake.clone());
        let client = bulk.open().await.unwrap();
        let pool = client.pool_lookup_by_name(POOL).await.unwrap();
        let server = ImageServer::start().await;
        let fetch = FetchOptions::default();
        let mut e = entry("home");
        let cases = crafted(scratch.path());
        for (i, (path, format, bytes, _)) in cases.iter().enumerate() {
            let url = server.route(path, Route::new(bytes.clone()));
            e.images
                .insert(format!("img{i}"), spec(&url, &sha(bytes), *format));
        }
        for (i, (path, _, bytes, says)) in cases.iter().enumerate() {
            let handed = HandedOn::default();
            let t = Target {
                entry: &e,
                host: "h1",
                client: &client,
                pool: &pool,
                reserve_bytes: 0,
                bulk: &bulk,
                progress: &handed,
                fetch: &fetch,
            };
            let key = format!("img{i}");
            let r = image::ensure_base(&t, &key).await;
            assert_refused(&r, path, says);
            assert_refused_before_the_upload(&server, path, bytes, &handed);
            assert!(
                fake.volumes(POOL).unwrap().is_empty(),
                "{path}: the part is removed: {:?}",
                fake.volumes(POOL).unwrap()
            );
        }
    })
    .await
    .expect("the fake refusal test exceeded its budget");
}

mod real {
    use super::*;
    use crate::image_fixtures::{SshBulk, unique, virsh};
    use ep_test_support::sshd::Sshd;
    use std::path::PathBuf;

    /// A transient dir pool of the test's own; destroyed (and its files removed) on drop.
    struct PoolGuard {
        name: String,
        dir: PathBuf,
    }

    impl PoolGuard {
        fn new() -> Self {
            let name = unique("selfcont");
            let dir = std::env::temp_dir().join(&name);
            std::fs::create_dir_all(&dir).unwrap();
            let out = virsh(&[
                "pool-create-as",
                &name,
                "dir",
                "--target",
                dir.to_str().unwrap(),
            ]);
            assert!(
                out.status.success(),
                "pool-create-as: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Self { name, dir }
        }

        fn files(&self) -> Vec<String> {
            let _ = virsh(&["pool-refresh", &self.name]);
            std::fs::read_dir(&self.dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        }
    }

    impl Drop for PoolGuard {
        fn drop(&mut self) {
            let _ = virsh(&["pool-destroy", &self.name]);
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn images_with_a_backing_file_a_data_file_or_encryption_are_refused_by_the_real_daemon_path()
     {
        tokio::time::timeout(BUDGET, async {
            let scratch = tempfile::tempdir().unwrap();
            let sshd = Sshd::start();
            let pg = PoolGuard::new();
            let bulk = SshBulk {
                target: sshd.target(),
            };
            let client = bulk.open().await.unwrap();
            let pool = client.pool_lookup_by_name(&pg.name).await.unwrap();
            let server = ImageServer::start().await;
            let fetch = FetchOptions::default();
            let mut e = entry("eptest");
            let cases = crafted(scratch.path());
            for (i, (path, format, bytes, _)) in cases.iter().enumerate() {
                let url = server.route(path, Route::new(bytes.clone()));
                e.images
                    .insert(format!("img{i}"), spec(&url, &sha(bytes), *format));
            }
            let decoy = scratch.path().join("decoy.raw");
            let before = std::fs::read(&decoy).unwrap();
            for (i, (path, _, bytes, says)) in cases.iter().enumerate() {
                let handed = HandedOn::default();
                let t = Target {
                    entry: &e,
                    host: "local",
                    client: &client,
                    pool: &pool,
                    reserve_bytes: 0,
                    bulk: &bulk,
                    progress: &handed,
                    fetch: &fetch,
                };
                let key = format!("img{i}");
                let r = image::ensure_base(&t, &key).await;
                // Refused by the header, not by libvirt's reading of an uploaded volume (which
                // refuses a backing file too, once the whole image was sent).
                assert_refused(&r, path, says);
                assert_refused_before_the_upload(&server, path, bytes, &handed);
                assert!(
                    pg.files().is_empty(),
                    "{path}: nothing left in the pool: {:?}",
                    pg.files()
                );
            }
            assert_eq!(
                std::fs::read(&decoy).unwrap(),
                before,
                "the decoy is untouched"
            );
        })
        .await
        .expect("the real refusal test exceeded its budget");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_uploaded_volume_the_real_daemon_reads_as_backed_by_a_file_is_refused_at_settle() {
        tokio::time::timeout(BUDGET, async {
            let scratch = tempfile::tempdir().unwrap();
            let sshd = Sshd::start();
            let pg = PoolGuard::new();
            let bulk = SshBulk {
                target: sshd.target(),
            };
            let client = bulk.open().await.unwrap();
            let pool = client.pool_lookup_by_name(&pg.name).await.unwrap();
            the_backing_store_check_after_upload_holds_alone(
                &client,
                &pool,
                &bulk,
                "eptest",
                scratch.path(),
            )
            .await;
            assert!(
                pg.files().is_empty(),
                "nothing left in the pool: {:?}",
                pg.files()
            );
        })
        .await
        .expect("the real settle test exceeded its budget");
    }
}

/// Imports the backing-file image with the header check skipped: the check after the upload
/// (libvirt's reading of the uploaded volume) must refuse it on its own.
async fn the_backing_store_check_after_upload_holds_alone(
    client: &Client,
    pool: &libvirt_remote::proto::StoragePool,
    bulk: &dyn BulkConnect,
    entry_name: &str,
    scratch: &Path,
) {
    let server = ImageServer::start().await;
    let fetch = FetchOptions {
        skip_header_check_for_tests: true,
        ..FetchOptions::default()
    };
    let (path, format, bytes, _) = crafted(scratch).swap_remove(0);
    let url = server.route(path, Route::new(bytes.clone()));
    let mut e = entry(entry_name);
    e.images
        .insert("back".into(), spec(&url, &sha(&bytes), format));
    let t = Target {
        entry: &e,
        host: "h1",
        client,
        pool,
        reserve_bytes: 0,
        bulk,
        progress: &NoProgress,
        fetch: &fetch,
    };
    let r = image::ensure_base(&t, "back").await;
    assert_refused(&r, path, "backed by");
    let decoy = scratch.join("decoy.raw");
    assert!(
        r.unwrap_err().message.contains(decoy.to_str().unwrap()),
        "names the backing store libvirt read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uploaded_volume_libvirt_reads_as_backed_by_a_file_is_refused_at_settle_on_the_fake() {
    tokio::time::timeout(BUDGET, async {
        let scratch = tempfile::tempdir().unwrap();
        let fake = FakeLibvirt::new();
        fake.add_pool(PoolSpec::new(POOL).capacity(400 * MIB).path("/pool"))
            .unwrap();
        let bulk = FakeBulk(fake.clone());
        let client = bulk.open().await.unwrap();
        let pool = client.pool_lookup_by_name(POOL).await.unwrap();
        the_backing_store_check_after_upload_holds_alone(
            &client,
            &pool,
            &bulk,
            "home",
            scratch.path(),
        )
        .await;
        assert!(
            fake.volumes(POOL).unwrap().is_empty(),
            "the part is removed: {:?}",
            fake.volumes(POOL).unwrap()
        );
    })
    .await
    .expect("the fake settle test exceeded its budget");
}
