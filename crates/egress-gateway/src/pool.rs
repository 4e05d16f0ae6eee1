//! One pool's gateway at run time: the current view (settings, identities, published
//! members) as an immutable snapshot each connection reads once, the members' live state
//! (open connections, suspicion, drain), and the choice of members for a connection.
//!
//! **Drain.** A member that leaves the view (unpublished: rotated, quarantined, scaled in,
//! unhealthy) is no longer chosen from that instant; connections already through it keep
//! running for the pool's `drainGrace`, then are cut. A member that comes back before the
//! grace ends is simply published again and nothing is cut. One timer per drained member,
//! none per connection.
//!
//! Guarantees: a view update never blocks a connection (the snapshot is swapped under a
//! short lock, never held across I/O); the per-replica session memory (for the sticky
//! hit/moved metric) is bounded by [`STICKY_MEMORY`]; per-event cost is O(members of this
//! pool).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::auth::{Identities, basic_value};
use crate::identity::IdentityRt;
use crate::metrics::{GatewayMetrics, PoolMetrics};
use crate::model::{Balance, Member, PoolSettings, PoolView};
use crate::select::{self, Candidate};
use crate::username::Options;

/// How long a member whose dial failed from this replica goes last in every order.
// NB: HAProxy's `observe layer4` marks a server down after a few errors and re-checks it; we
// never unpublish (the health engine decides that), we only stop sending first tries to it.
// 10 s costs a dead member one failed attempt per 10 s instead of one per connection.
pub const SUSPECT_FOR: Duration = Duration::from_secs(10);
/// Sessions remembered per pool for the sticky hit/moved metric (16 bytes each).
pub const STICKY_MEMORY: usize = 65_536;

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn now_ms() -> u64 {
    u64::try_from(EPOCH.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A member's live state on this replica.
#[derive(Debug)]
pub struct MemberRt {
    active: AtomicU32,
    suspect_until: AtomicU64,
    draining: AtomicBool,
    /// Cancelled when its drain grace ends (or the gateway shuts down): its tunnels are cut.
    pub cut: CancellationToken,
    timer: Mutex<Option<JoinHandle<()>>>,
}

impl MemberRt {
    fn new() -> Self {
        Self {
            active: AtomicU32::new(0),
            suspect_until: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            cut: CancellationToken::new(),
            timer: Mutex::new(None),
        }
    }

    /// Open connections through it.
    pub fn active(&self) -> u32 {
        self.active.load(Ordering::Relaxed)
    }

    fn suspect(&self) -> bool {
        self.suspect_until.load(Ordering::Relaxed) > now_ms()
    }

    /// Marks it suspect for [`SUSPECT_FOR`].
    pub fn mark_suspect(&self) {
        let until = now_ms().saturating_add(u64::try_from(SUSPECT_FOR.as_millis()).unwrap_or(0));
        self.suspect_until.store(until, Ordering::Relaxed);
    }

    /// Counts a connection through it until the guard drops.
    pub fn hold(self: &Arc<Self>) -> MemberHold {
        self.active.fetch_add(1, Ordering::AcqRel);
        MemberHold(Arc::clone(self))
    }

    fn start_drain(&self, grace: Duration) {
        if self.draining.swap(true, Ordering::AcqRel) {
            return;
        }
        if grace.is_zero() {
            self.cut.cancel();
            return;
        }
        let cut = self.cut.clone();
        // NB: one timer per drained member; connections only wait on `cut`.
        let t = tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            cut.cancel();
        });
        *lock(&self.timer) = Some(t);
    }

    fn stop_drain(&self) {
        if self.draining.swap(false, Ordering::AcqRel)
            && let Some(t) = lock(&self.timer).take()
        {
            t.abort();
        }
    }
}

/// A connection through a member, counted while held.
#[derive(Debug)]
pub struct MemberHold(Arc<MemberRt>);

impl Drop for MemberHold {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A published member with its live state.
#[derive(Debug)]
pub struct LiveMember {
    /// What the driver said.
    pub member: Member,
    /// Its live state.
    pub rt: Arc<MemberRt>,
    /// The `Proxy-Authorization` value the gateway sends it (HTTP members).
    pub auth: Option<String>,
}

/// One pool's view at one moment.
#[derive(Debug)]
pub struct PoolState {
    /// Its settings.
    pub settings: PoolSettings,
    /// Published members, ordered by UID.
    pub members: Vec<LiveMember>,
    /// Client identities.
    pub identities: Identities,
}

/// The member order for one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// Indices into [`PoolState::members`], in the order to try.
    pub order: Vec<usize>,
    /// The session key's short hash, for a sticky session.
    pub session: Option<u64>,
}

/// Why no member can be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoMember(pub String);

/// One pool's gateway.
#[derive(Debug)]
pub struct PoolRt {
    /// `namespace/name`.
    pub key: String,
    state: RwLock<Arc<PoolState>>,
    members: Mutex<HashMap<String, Arc<MemberRt>>>,
    rr: AtomicUsize,
    sticky: Mutex<HashMap<u64, u64>>,
    /// Its metric series.
    pub metrics: PoolMetrics,
    all_metrics: GatewayMetrics,
}

impl PoolRt {
    /// A pool with an empty view.
    pub fn new(key: &str, metrics: &GatewayMetrics) -> Self {
        Self {
            key: key.to_owned(),
            state: RwLock::new(Arc::new(PoolState {
                settings: PoolSettings::default(),
                members: Vec::new(),
                identities: Identities::default(),
            })),
            members: Mutex::new(HashMap::new()),
            rr: AtomicUsize::new(0),
            sticky: Mutex::new(HashMap::new()),
            metrics: metrics.pool(key),
            all_metrics: metrics.clone(),
        }
    }

    /// The current snapshot.
    pub fn state(&self) -> Arc<PoolState> {
        Arc::clone(&self.state.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Applies a new view: members gone start draining, members back stop, identities keep
    /// their counters.
    pub fn update(&self, view: &PoolView) {
        let prev = self.state();
        let grace = view.settings.drain_grace;
        let mut members: Vec<Member> = view.members.clone();
        members.sort_by(|a, b| a.uid.cmp(&b.uid));
        members.dedup_by(|a, b| a.uid == b.uid);
        let live = {
            let mut rts = lock(&self.members);
            // Drains that ended are forgotten (a member back later starts afresh).
            rts.retain(|_, rt| !rt.cut.is_cancelled());
            let live: Vec<LiveMember> = members
                .into_iter()
                .map(|m| {
                    let rt = Arc::clone(
                        rts.entry(m.uid.clone())
                            .or_insert_with(|| Arc::new(MemberRt::new())),
                    );
                    rt.stop_drain();
                    LiveMember {
                        auth: m.credentials.as_ref().map(basic_value),
                        member: m,
                        rt,
                    }
                })
                .collect();
            let published: HashSet<&str> = live.iter().map(|l| l.member.uid.as_str()).collect();
            for (uid, rt) in rts.iter() {
                if !published.contains(uid.as_str()) {
                    rt.start_drain(grace);
                }
            }
            live
        };
        let identities = Identities::build(&view.clients, Some(&prev.identities), |name| {
            Arc::new(IdentityRt::with_metrics(
                name,
                self.all_metrics.identity(&self.key, name),
            ))
        });
        for old in prev.identities.all() {
            if !identities.contains(old.name()) {
                self.all_metrics.forget_identity(&self.key, old.name());
            }
        }
        self.metrics
            .members
            .set(i64::try_from(live.len()).unwrap_or(i64::MAX));
        let next = Arc::new(PoolState {
            settings: view.settings.clone(),
            members: live,
            identities,
        });
        *self.state.write().unwrap_or_else(PoisonError::into_inner) = next;
    }

    /// Drains every member (the pool is no longer served).
    pub fn drain_all(&self, grace: Duration) {
        for rt in lock(&self.members).values() {
            rt.start_drain(grace);
        }
    }

    /// Cuts every tunnel at once (shutdown grace over).
    pub fn cut_all(&self) {
        for rt in lock(&self.members).values() {
            rt.cut.cancel();
        }
    }

    /// The members to try for a connection of `identity` with `options`, in order.
    pub fn choose(
        &self,
        state: &PoolState,
        identity: &str,
        options: &Options,
    ) -> Result<Choice, NoMember> {
        let cands: Vec<Candidate> = state
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| options.egress.is_none_or(|e| m.member.egress.contains(&e)))
            .map(|(index, m)| Candidate {
                index,
                suspect: m.rt.suspect(),
                active: m.rt.active(),
            })
            .collect();
        if cands.is_empty() {
            return Err(NoMember(match options.egress {
                Some(e) if !state.members.is_empty() => {
                    format!("no published member of the pool has egress address {e}")
                }
                _ => "the pool has no published member".to_owned(),
            }));
        }
        let k = usize::try_from(state.settings.attempts.max(1)).unwrap_or(1);
        if let Some(session) = &options.session {
            let ttl = options.ttl.or(state.settings.sessions.default_ttl);
            let unix = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let key = select::session_key(identity, session, ttl.map(|t| t.as_secs()), unix);
            let uids: Vec<&str> = state
                .members
                .iter()
                .map(|m| m.member.uid.as_str())
                .collect();
            return Ok(Choice {
                order: select::sticky(&cands, &uids, &key, k),
                session: Some(select::key_hash(&key)),
            });
        }
        let start = self.rr.fetch_add(1, Ordering::Relaxed);
        let order = match state.settings.balance {
            Balance::RoundRobin => select::round_robin(&cands, start, k),
            Balance::LeastConnections => select::least_connections(&cands, start, k),
        };
        Ok(Choice {
            order,
            session: None,
        })
    }

    /// Records that session `session` went to member `uid`: `hit`, `moved` or `new`.
    pub fn remember(&self, session: u64, uid: &str) -> &'static str {
        let member = select::key_hash(uid.as_bytes());
        let mut m = lock(&self.sticky);
        if m.len() >= STICKY_MEMORY && !m.contains_key(&session) {
            // NB: forgetting everything at the cap keeps this O(1) and bounded; the next
            // connection of each session then counts as `new` once.
            m.clear();
        }
        match m.insert(session, member) {
            None => "new",
            Some(prev) if prev == member => "hit",
            Some(_) => "moved",
        }
    }
}
