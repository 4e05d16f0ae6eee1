//! An in-process libvirtd that speaks libvirt's real remote wire protocol over any byte
//! stream, for deterministic tests of `libvirt-remote` and of everything built on it.
//!
//! It reuses `libvirt_remote::{frame, xdr, proto}` for every packet and structure, holds
//! domains, storage pools, volumes and networks in memory, and answers with the error codes,
//! error domains and messages libvirtd 11.3 sends (checked against the real daemon). Faults
//! can be injected per fake or per connection, at any time: freeze, close after open,
//! duplicate replies, malformed frame lengths, slow calls, ENOSPC mid-upload, an unresponsive
//! guest agent, or any procedure failing with a chosen error.
//!
//! Modules: [`xml`] reads names, sizes and namespaced metadata from definitions (no XML
//! model); `state` holds the objects with libvirt's semantics (pure, no I/O); `dispatch`
//! routes one call through libvirtd's gates; `server` runs connections (one task each) and
//! owns [`FakeLibvirt`]; `faults` says what goes wrong ([`Faults`]); `errors` builds the
//! `remote_error`s ([`codes`], [`domains`]).
//!
//! Guarantees: every reply is built with `libvirt_remote`'s own codecs; a connection that
//! ends leaves nothing running (findings L21, L22); faults apply to live connections; no lock
//! is held across an `.await`.
//!
//! Behaviour worth knowing (all as the real daemon does it):
//! - `AUTH_LIST` must come first and answers `[NONE]` (or `[POLKIT]`, see [`AuthMode`]); calls
//!   before `CONNECT_OPEN` fail with code 1 ("hypervisor connection not open").
//! - Unknown procedure numbers fail with code 39 (`VIR_ERR_RPC`); real procedures the fake
//!   does not implement fail with code 3 (`VIR_ERR_NO_SUPPORT`).
//! - Undefining a *running* domain succeeds and makes it transient (it disappears when
//!   destroyed); undefining a transient domain fails with code 55.
//! - A pool's `STORAGE_POOL_GET_INFO` figures only change on `STORAGE_POOL_REFRESH`.
//! - Uploads: the call is answered, data is stored at the offset, a finish *and* a client
//!   abort are confirmed with an empty STREAM/OK, and a storage failure (free space, declared
//!   length, injected budget) is a REPLY/ERROR code 38 on the stream's serial.
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use libvirt_fake::{FakeLibvirt, PoolSpec, codes};
//! use libvirt_remote::{Client, OpenOptions};
//!
//! let fake = FakeLibvirt::new();
//! fake.add_pool(PoolSpec::new("default").capacity(10 << 30))?;
//! let client = Client::open(fake.connect_duplex(), OpenOptions::default()).await?;
//!
//! let pool = client.pool_lookup_by_name("default").await?;
//! let xml = "<volume><name>disk</name><capacity unit='MiB'>1</capacity></volume>";
//! let vol = client.vol_create_xml(&pool, xml, 0).await?;
//! assert_eq!(client.vol_info(&vol).await?.capacity, 1 << 20);
//!
//! let err = client.domain_lookup_by_name("nope").await.unwrap_err();
//! assert_eq!(err.libvirt_code(), Some(codes::NO_DOMAIN));
//!
//! fake.faults().freeze(); // the connection now neither reads nor writes
//! # Ok(())
//! # }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
//! #     .block_on(demo()).unwrap();
//! ```

mod dispatch;
mod errors;
mod faults;
mod nwfilter;
mod server;
mod spec;
mod state;
pub mod xml;

pub use dispatch::REMOTE_PROC_MAX;
pub use errors::{codes, domains};
pub use faults::{BadLength, Duplicate, FailCall, FaultSpec, Faults};
pub use server::{
    ConnHandle, DEFAULT_CAPABILITIES, DEFAULT_DOMAIN_CAPABILITIES, DEFAULT_HOSTNAME,
    DEFAULT_HV_VERSION, DEFAULT_KEEPALIVE_COUNT, DEFAULT_KEEPALIVE_INTERVAL, DEFAULT_LIB_VERSION,
    DUPLEX_BUFFER, FakeLibvirt, JOURNAL_CAP, JournalEntry, KeepaliveConfig,
};
pub use spec::{
    AuthMode, DomainInfo, DomainSpec, Interface, IpAddress, Lease, NetworkSpec, PoolInfo, PoolSpec,
    VolumeInfo, VolumeSpec, domain_state,
};
pub use state::{SeedError, VOLUME_CONTENT_LIMIT, events};
