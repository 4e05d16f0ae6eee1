//! One blocklist query through the configured resolver, with a deadline.
//!
//! NB: the DNS client is `hickory-resolver` (the maintained successor of trust-dns, used by
//! reqwest, kube's ecosystem and the hickory DNS server itself). Why not write the queries by
//! hand: a DNSBL check is an ordinary `A` query, and what makes a client trustworthy is the
//! rest — UDP with source-port randomisation, retry over TCP on a truncated answer, ID and
//! question matching, several name servers with failover, EDNS — which hickory has and a
//! hand-written client would have to earn. Why not `hickory-client` (the lower-level client):
//! its 0.26 line is only an alpha, and the resolver gives the same control here. It is built
//! with no default features: no `system-config`, so `/etc/resolv.conf` is never read (the
//! resolver is always the one the config names: a shared public resolver gets refused by the
//! blocklists), and no TLS transport, so no second TLS stack or crypto provider enters the
//! workspace (`cargo tree -i ring` stays empty). Its answer cache is off (`cache_size: 0`):
//! every round asks afresh, and memory does not grow with the fleet.
//!
//! Guarantees:
//! - [`Resolver::query`] ends within the configured timeout (both attempts included), every
//!   path: the whole query runs under one `tokio::time::timeout`;
//! - it never returns a listing by itself: it returns the raw [`Outcome`] (the `A` answers,
//!   "no record", or a failure with its [`FailureKind`]); [`crate::codes::classify`] decides;
//! - NXDOMAIN and "the name exists but has no `A` record" are the only "no record" outcomes;
//!   REFUSED, SERVFAIL, a timeout or an unreachable resolver are failures.
//! - dropping the future abandons the query only.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::{RData, RecordType};

use crate::codes::{FailureKind, Outcome};

/// A resolver for blocklist queries: the configured servers, nothing else.
#[derive(Clone)]
pub struct Resolver {
    inner: hickory_resolver::Resolver<TokioRuntimeProvider>,
    timeout: Duration,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The resolver could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the DNS resolver for reputation checks: {0}")]
pub struct BuildError(String);

/// Attempts per query: a lost UDP datagram is retried once within the timeout.
const ATTEMPTS: usize = 2;

impl Resolver {
    /// A resolver sending to `servers` (UDP, TCP when an answer is truncated), each query
    /// bounded by `timeout`, at most `concurrency` queries in flight per connection.
    /// Must be called inside a tokio runtime.
    pub fn new(
        servers: &[SocketAddr],
        timeout: Duration,
        concurrency: usize,
    ) -> Result<Self, BuildError> {
        if servers.is_empty() {
            return Err(BuildError("no resolver configured".into()));
        }
        let name_servers = servers
            .iter()
            .map(|s| {
                let mut udp = ConnectionConfig::udp();
                udp.port = s.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = s.port();
                // NB: an NXDOMAIN from one configured server is the answer (no second opinion
                // from another: they all ask the same blocklist).
                NameServerConfig::new(s.ip(), true, vec![udp, tcp])
            })
            .collect();
        let config = ResolverConfig::from_parts(None, vec![], name_servers);
        let mut opts = ResolverOpts::default();
        // Each attempt gets its share of the deadline; the outer timeout bounds the whole.
        opts.timeout = timeout / u32::try_from(ATTEMPTS).unwrap_or(1);
        opts.attempts = ATTEMPTS;
        opts.cache_size = 0;
        opts.ndots = 0;
        opts.num_concurrent_reqs = 1;
        opts.max_active_requests = concurrency.max(1);
        opts.preserve_intermediates = false;
        let inner = hickory_resolver::Resolver::builder_with_config(
            config,
            TokioRuntimeProvider::default(),
        )
        .with_options(opts)
        .build()
        .map_err(|e| BuildError(e.to_string()))?;
        Ok(Self { inner, timeout })
    }

    /// The deadline of one query.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Asks for the `A` records of `name` (fully qualified, trailing dot).
    pub async fn query(&self, name: &str) -> Outcome {
        match tokio::time::timeout(self.timeout, self.inner.lookup(name, RecordType::A)).await {
            Err(_) => Outcome::Failed(
                FailureKind::Timeout,
                format!("no answer within {} s", self.timeout.as_secs_f32()),
            ),
            Ok(Ok(lookup)) => Outcome::Answers(
                lookup
                    .answers()
                    .iter()
                    .filter_map(|r| match &r.data {
                        RData::A(a) => Some(std::net::IpAddr::V4(a.0)),
                        _ => None,
                    })
                    .collect(),
            ),
            Ok(Err(e)) => outcome_of_error(&e),
        }
    }
}

/// Maps the client's error to "no record" or a classed failure.
fn outcome_of_error(e: &NetError) -> Outcome {
    let detail = || bounded(&e.to_string());
    match e {
        NetError::Dns(DnsError::NoRecordsFound(nr))
            if matches!(
                nr.response_code,
                ResponseCode::NXDomain | ResponseCode::NoError
            ) =>
        {
            Outcome::NoRecord
        }
        NetError::Dns(DnsError::ResponseCode(ResponseCode::Refused)) => Outcome::Failed(
            FailureKind::Refused,
            "the resolver refused the query (REFUSED)".into(),
        ),
        NetError::Dns(DnsError::ResponseCode(code)) => Outcome::Failed(
            FailureKind::ServFail,
            format!("the resolver answered {code}"),
        ),
        NetError::Dns(DnsError::NoRecordsFound(nr)) => Outcome::Failed(
            FailureKind::ServFail,
            format!("the resolver answered {}", nr.response_code),
        ),
        NetError::Timeout => Outcome::Failed(FailureKind::Timeout, detail()),
        NetError::Io(_) | NetError::NoConnections => {
            Outcome::Failed(FailureKind::Network, detail())
        }
        _ => Outcome::Failed(FailureKind::Other, detail()),
    }
}

/// Longest failure detail kept.
const MAX_DETAIL: usize = 200;

fn bounded(s: &str) -> String {
    s.chars().take(MAX_DETAIL).collect()
}
