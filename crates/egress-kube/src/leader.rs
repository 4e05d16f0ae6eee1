//! Leader election with a `coordination.k8s.io/v1` Lease, client-go style: every
//! `retry_period` a replica reads the Lease and takes it when it is free or its holder has not
//! renewed it for `lease_duration` (measured on this replica's monotonic clock from when it
//! last saw the record change, so clock skew between nodes does not matter); the holder
//! renews every `retry_period`. Writes are `replace`s carrying the read `resourceVersion`, so
//! two replicas racing for the Lease cannot both win (the loser gets a 409).
//!
//! Guarantees:
//! - A replica reports itself leader only after a successful write naming it holder, and
//!   reports leadership lost as soon as it cannot renew within `renew_deadline` (before the
//!   Lease can expire for others, since `renew_deadline < lease_duration`).
//! - [`Elector::stop_and_release`] (called on graceful shutdown, after the leader's work has
//!   stopped) clears the holder, so another replica takes over within one `retry_period`
//!   instead of a whole `lease_duration` (finding APX-3).
//! - Every API call is bounded by `renew_deadline`; no lock is held across an `.await`.
//!
//! Hand-written rather than kube-lease-manager 0.13 (which supports kube 5): its followers
//! sleep until the Lease's expiry time before looking again, so a released Lease is only
//! taken a lease period later, which is exactly the slow hand-over a release should avoid;
//! it also judges expiry by comparing wall clocks across nodes.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Default time a Lease stays valid without renewal.
// NB: client-go's default (15 s): a crashed leader is replaced within ~15 s, while an API
// server hiccup of a few seconds does not flap leadership.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// Default time the holder keeps trying to renew before it gives leadership up.
// NB: client-go's default (10 s): below the lease duration, so the old leader stops its
// work before anyone else may start.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Default interval between attempts (acquire or renew).
// NB: client-go's default (2 s): a released Lease is taken within ~2 s.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// How the elector behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This replica's identity (the pod name).
    pub identity: String,
    /// See [`DEFAULT_LEASE_DURATION`].
    pub lease_duration: Duration,
    /// See [`DEFAULT_RENEW_DEADLINE`].
    pub renew_deadline: Duration,
    /// See [`DEFAULT_RETRY_PERIOD`].
    pub retry_period: Duration,
}

impl LeaseSettings {
    /// Settings with the documented defaults.
    pub fn new(name: &str, namespace: &str, identity: &str) -> Self {
        Self {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            identity: identity.to_owned(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }
}

/// A running elector: [`Elector::leader`] tells whether this replica leads.
#[derive(Debug)]
pub struct Elector {
    rx: watch::Receiver<bool>,
    api_ok: watch::Receiver<bool>,
    stop: CancellationToken,
    task: JoinHandle<()>,
    api: Api<Lease>,
    settings: LeaseSettings,
}

/// The last Lease record seen and when (on this replica's clock) it changed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    holder: Option<String>,
    renew: Option<String>,
}

impl Elector {
    /// Starts electing. Nothing is reported as leader until the Lease is held.
    pub fn spawn(client: kube::Client, settings: LeaseSettings) -> Self {
        let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
        let (tx, rx) = watch::channel(false);
        let (ok_tx, api_ok) = watch::channel(false);
        let stop = CancellationToken::new();
        let task = tokio::spawn(elect(
            api.clone(),
            settings.clone(),
            tx,
            ok_tx,
            stop.clone(),
        ));
        Self {
            rx,
            api_ok,
            stop,
            task,
            api,
            settings,
        }
    }

    /// A receiver of leadership: `true` while this replica holds the Lease.
    pub fn leader(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }

    /// A receiver of API health: `true` while this replica's last Lease attempt got an
    /// answer from the API server (held or not), `false` before the first one and after a
    /// failed or timed-out attempt. Readiness of a follower is based on it.
    pub fn api_ok(&self) -> watch::Receiver<bool> {
        self.api_ok.clone()
    }

    /// Stops electing and, when this replica holds the Lease, clears its holder so another
    /// replica can take it at its next attempt (finding APX-3). Bounded by the renew deadline.
    pub async fn stop_and_release(self) {
        self.stop.cancel();
        let _ = self.task.await;
        match tokio::time::timeout(
            self.settings.renew_deadline,
            release(&self.api, &self.settings),
        )
        .await
        {
            Ok(Ok(true)) => tracing::info!(lease = %self.settings.name, "lease released"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not release the lease"),
            Err(_) => tracing::warn!("releasing the lease timed out"),
        }
    }
}

async fn elect(
    api: Api<Lease>,
    s: LeaseSettings,
    tx: watch::Sender<bool>,
    api_ok: watch::Sender<bool>,
    stop: CancellationToken,
) {
    let mut seen: Option<(Observed, Instant)> = None;
    let mut last_renew: Option<Instant> = None;
    let mut first = true;
    loop {
        if !first {
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(s.retry_period) => {}
            }
        }
        first = false;
        let r = tokio::select! {
            () = stop.cancelled() => break,
            r = tokio::time::timeout(s.renew_deadline, try_acquire_or_renew(&api, &s, &mut seen)) => r,
        };
        let now = Instant::now();
        api_ok.send_if_modified(|v| {
            let ok = matches!(r, Ok(Ok(_)));
            std::mem::replace(v, ok) != ok
        });
        let leading = match r {
            Ok(Ok(true)) => {
                last_renew = Some(now);
                true
            }
            Ok(Ok(false)) => false,
            Ok(Err(e)) => {
                tracing::warn!(error = %with_causes(&e), "lease attempt failed");
                last_renew.is_some_and(|t| now.duration_since(t) < s.renew_deadline)
            }
            Err(_) => {
                tracing::warn!("lease attempt timed out");
                last_renew.is_some_and(|t| now.duration_since(t) < s.renew_deadline)
            }
        };
        if !leading {
            last_renew = None;
        }
        if *tx.borrow() != leading {
            tracing::info!(identity = %s.identity, leading, "leadership changed");
            tx.send_replace(leading);
        }
    }
    tx.send_replace(false);
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// One attempt: `Ok(true)` when this replica holds the Lease afterwards.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    s: &LeaseSettings,
    seen: &mut Option<(Observed, Instant)>,
) -> Result<bool, kube::Error> {
    // rbac: LEASES get
    let lease = match api.get_opt(&s.name).await? {
        Some(l) => l,
        None => {
            let mut l = Lease::default();
            l.metadata.name = Some(s.name.clone());
            l.spec = Some(LeaseSpec {
                holder_identity: Some(s.identity.clone()),
                acquire_time: Some(now_micro()),
                renew_time: Some(now_micro()),
                lease_duration_seconds: Some(secs(s.lease_duration)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            });
            // rbac: LEASES create
            return match api.create(&PostParams::default(), &l).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        }
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let obs = Observed {
        holder: holder.clone(),
        renew: spec.renew_time.as_ref().map(|t| t.0.to_string()),
    };
    let now = Instant::now();
    let changed_at = match seen {
        Some((o, at)) if *o == obs => *at,
        _ => {
            *seen = Some((obs, now));
            now
        }
    };
    let mine = holder.as_deref() == Some(s.identity.as_str());
    let held_by_other = holder.is_some() && !mine;
    if held_by_other && now.duration_since(changed_at) < s.lease_duration {
        return Ok(false);
    }
    let mut next = lease.clone();
    next.spec = Some(LeaseSpec {
        holder_identity: Some(s.identity.clone()),
        acquire_time: if mine {
            spec.acquire_time.clone()
        } else {
            Some(now_micro())
        },
        renew_time: Some(now_micro()),
        lease_duration_seconds: Some(secs(s.lease_duration)),
        lease_transitions: Some(
            spec.lease_transitions
                .unwrap_or(0)
                .saturating_add(i32::from(!mine && holder.is_some())),
        ),
        ..spec
    });
    // rbac: LEASES update
    match api.replace(&s.name, &PostParams::default(), &next).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// `e` and its sources, joined with ": ": kube's client errors say only "client error
/// (Connect)"; the cause (an unknown certificate issuer, a refused connection) is in the
/// sources. A source whose text is already included is skipped.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        src = c.source();
    }
    s
}

/// Clears the holder when it is `s.identity`; `Ok(true)` when it did.
async fn release(api: &Api<Lease>, s: &LeaseSettings) -> Result<bool, kube::Error> {
    let Some(lease) = api.get_opt(&s.name).await? else {
        return Ok(false);
    };
    let spec = lease.spec.clone().unwrap_or_default();
    if spec.holder_identity.as_deref() != Some(s.identity.as_str()) {
        return Ok(false);
    }
    let mut next = lease;
    next.spec = Some(LeaseSpec {
        holder_identity: None,
        renew_time: Some(now_micro()),
        lease_duration_seconds: Some(1),
        ..spec
    });
    // rbac: LEASES update
    api.replace(&s.name, &PostParams::default(), &next).await?;
    Ok(true)
}
