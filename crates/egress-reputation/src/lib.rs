//! Egress address reputation: DNS blocklist (DNSBL) checks of the addresses the world sees
//! the proxies at.
//!
//! A blocklist publishes a DNS zone; an IPv4 address `a.b.c.d` is listed in zone `Z` when
//! `d.c.b.a.Z` has an `A` record (RFC 5782), an IPv6 address when its 32 nibbles, reversed,
//! do. The answer's address (`127.0.0.2`, …) says why it is listed; some blocklists (Spamhaus)
//! answer `127.255.255.252`, `.254` or `.255` to say the *query* was refused (a typo in the
//! zone, a public or open resolver, over quota): those are check failures, never listings.
//!
//! The pipeline, each step its own module:
//! - [`config`]: the `reputation:` section of the provider config, checked with field paths
//!   into [`Settings`](config::Settings);
//! - [`zone`]: zone names and the query name of an address in a zone;
//! - [`codes`]: what each answer means in a zone, and the [`Verdict`](codes::Verdict) of one
//!   answer;
//! - [`lookup`]: one query through the configured resolver, with a deadline;
//! - [`round`]: one check round over many addresses, with bounded concurrency and a deadline
//!   for the whole round;
//! - [`book`]: the results: per address and zone, listed since when, failing since when,
//!   last check; the changes a round made; counts per zone for metrics;
//! - [`status`]: what a Proxy's status shows of its addresses' results.
//!
//! The crate does no scheduling of its own beyond [`round`]: the operator's background
//! worker calls a round every `interval` with the addresses it knows.

pub mod book;
pub mod codes;
pub mod config;
pub mod lookup;
pub mod round;
pub mod status;
pub mod zone;

pub use book::{Book, Change};
pub use codes::{FailureKind, Verdict};
pub use config::{RawReputation, Settings};
pub use lookup::Resolver;
pub use round::{RoundReport, run_round};
pub use status::ProxyReputation;
