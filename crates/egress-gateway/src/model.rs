//! What a driver tells the gateway about one pool ([`PoolView`]): its settings, the client
//! credentials it accepts (each an accounting identity) and its published members, each with
//! the address, protocol and credentials the gateway dials it with.
//!
//! Guarantees: plain data, no I/O; the defaults are named constants documented for users in
//! docs/gateway.md; a [`Credential`]'s password never appears in `Debug` output.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::destinations::Destinations;

/// Time a client has to send its whole request (HTTP head, or SOCKS5 greeting, auth and
/// request) when the pool does not say (`timeouts.request`).
// NB: HAProxy's `timeout http-request` is commonly 10 s: generous for a client on a slow link,
// short enough that a slowloris ties up a connection for seconds, not minutes.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of one attempt at a member: TCP connect, the member's handshake and its answer to
/// the tunnel request (`failover.connectTimeout`).
// NB: the member answers only once it has connected to the target; 5 s covers a target a
// continent away and a loaded guest, and three attempts stay under 15 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Members tried for one connection before the client gets an error (`failover.attempts`).
pub const DEFAULT_ATTEMPTS: u32 = 3;
/// Longest a tunnel may stay silent both ways before it is closed (`timeouts.tunnel`).
// NB: HAProxy's `timeout tunnel` is often 1 h; a member's own proxy (tinyproxy `Timeout 600`)
// may close earlier.
pub const DEFAULT_TUNNEL_IDLE: Duration = Duration::from_secs(3600);
/// How long connections through a member that left publication keep running (`drainGrace`).
// NB: long enough for a download or a scraping session to finish, short enough that a
// quarantined or rotated member is really out within minutes.
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(300);
/// Longest session TTL a username may ask for (`sessions.maxTTL`).
// NB: commercial proxy networks offer sticky sessions from 60 s to 24 h.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// A username and password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// The username.
    pub username: String,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// How a member is dialled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberProtocol {
    /// An HTTP proxy: `CONNECT host:port` with basic auth (tinyproxy).
    Http,
    /// A SOCKS5 proxy with username/password auth (dante).
    Socks5,
}

/// What a listener speaks to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListenerProtocol {
    /// HTTP: `CONNECT host:port` and absolute-URI requests (`GET http://host/path`).
    Http,
    /// SOCKS5: CONNECT with username/password.
    Socks5,
}

impl ListenerProtocol {
    /// The name in logs and the access log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Socks5 => "socks5",
        }
    }
}

/// One published member of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// A stable identity (the member Proxy's UID): the rendezvous hash's node key, so every
    /// replica ranks members alike.
    pub uid: String,
    /// The member Proxy's name (access log).
    pub name: String,
    /// Where its proxy listens.
    pub addr: SocketAddr,
    /// How it is dialled.
    pub protocol: MemberProtocol,
    /// Its own credentials, when it requires them.
    pub credentials: Option<Credential>,
    /// The egress addresses its traffic leaves from (declared, or seen by the health check).
    pub egress: Vec<IpAddr>,
}

/// How connections without a session choose a member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Balance {
    /// Each connection goes to the next member in turn (members ordered by UID).
    #[default]
    RoundRobin,
    /// Each connection goes to the member with the fewest open connections through this
    /// gateway (ties: the next in turn).
    LeastConnections,
}

/// One listener of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Listener {
    /// Address and port to bind (port 0: any free port, see [`crate::GatewaySet::listening`]).
    pub addr: SocketAddr,
    /// What it speaks.
    pub protocol: ListenerProtocol,
}

/// Sticky sessions from the username (`NAME-session-ID[-ttl-DURATION]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sessions {
    /// Whether usernames may carry a session (otherwise such a username is refused).
    pub enabled: bool,
    /// The TTL of a session whose username gives none; `None`: it holds while its member is
    /// published.
    pub default_ttl: Option<Duration>,
    /// The longest TTL a username may ask for.
    pub max_ttl: Duration,
}

impl Default for Sessions {
    fn default() -> Self {
        Self {
            enabled: true,
            default_ttl: None,
            max_ttl: DEFAULT_MAX_TTL,
        }
    }
}

/// Per-identity limits (each gateway replica counts its own connections).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Open connections per identity.
    pub max_connections: Option<u32>,
    /// Bytes (both directions) per identity per period.
    pub bytes: Option<ByteBudget>,
}

/// A byte budget per fixed period (aligned to the Unix epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteBudget {
    /// Bytes per period.
    pub bytes: u64,
    /// The period.
    pub period: Duration,
}

/// One deadline per phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// The client's whole request (head, or SOCKS5 handshake).
    pub request: Duration,
    /// One attempt at a member.
    pub connect: Duration,
    /// A tunnel silent both ways.
    pub tunnel_idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            request: DEFAULT_REQUEST_TIMEOUT,
            connect: DEFAULT_CONNECT_TIMEOUT,
            tunnel_idle: DEFAULT_TUNNEL_IDLE,
        }
    }
}

/// How one pool's gateway behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSettings {
    /// Where it listens.
    pub listeners: Vec<Listener>,
    /// Choice for connections without a session.
    pub balance: Balance,
    /// Sticky sessions.
    pub sessions: Sessions,
    /// Members tried per connection (at least 1).
    pub attempts: u32,
    /// Deadlines.
    pub timeouts: Timeouts,
    /// How long connections through a member that left publication keep running.
    pub drain_grace: Duration,
    /// Per-identity limits.
    pub limits: Limits,
    /// Destinations refused before any member is tried.
    pub destinations: Destinations,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            listeners: Vec::new(),
            balance: Balance::default(),
            sessions: Sessions::default(),
            attempts: DEFAULT_ATTEMPTS,
            timeouts: Timeouts::default(),
            drain_grace: DEFAULT_DRAIN_GRACE,
            limits: Limits::default(),
            destinations: Destinations::default(),
        }
    }
}

/// Everything the gateway knows about one pool at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolView {
    /// `namespace/name` (metrics label, access log).
    pub key: String,
    /// Its settings.
    pub settings: PoolSettings,
    /// The client credentials it accepts, each an identity named by its username.
    pub clients: Vec<Credential>,
    /// Its published members (healthy, not quarantined, not being deleted).
    pub members: Vec<Member>,
}
