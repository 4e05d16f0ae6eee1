//! One client connection, start to end, in one task: read the request (HTTP or SOCKS5)
//! within the request deadline → authenticate → check the username's options, the limits and
//! the destination → try members in order, each under the attempt deadline → answer the
//! client → copy → one access-log line and the metrics.
//!
//! Guarantees:
//! - **No buffer while idle**: the connection waits for the client's first byte before it
//!   takes a head buffer, and the copy holds buffers only while bytes are in flight.
//! - **Failover before the first byte**: the client gets its first byte (the `200` or the
//!   SOCKS5 success reply, or for an absolute-URI request the origin's answer) only once a
//!   member opened the tunnel; a member that fails before that is skipped for the next (at
//!   most `failover.attempts` in all), and only a policy refusal stops the attempts.
//! - **Every refusal is clear**: an HTTP status with a sentence and `Proxy-Status`, or the
//!   SOCKS5 reply code; a wrong username and a wrong password get the same answer.
//! - Every phase has its deadline (request, each attempt, tunnel idle); a cut (drain grace,
//!   shutdown) ends the tunnel; exactly one access-log line per connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::access_log::{AccessLog, Record};
use crate::bufpool::{HEAD, PooledBuf};
use crate::copy::{self, End, write_all};
use crate::dial::{self, DialError};
use crate::http::{self, Kind};
use crate::identity::Admission;
use crate::metrics::Outcome;
use crate::model::ListenerProtocol;
use crate::pool::{MemberHold, PoolRt, PoolState};
use crate::socks::{self, reply};
use crate::target::Target;

/// What a connection needs besides its socket.
#[derive(Debug, Clone)]
pub struct ConnCtx {
    /// Its pool.
    pub pool: Arc<PoolRt>,
    /// Its listener's protocol.
    pub protocol: ListenerProtocol,
    /// The access log.
    pub log: AccessLog,
    /// Cancelled when the gateway's shutdown grace is over.
    pub shutdown: CancellationToken,
}

/// A refusal, as the client will see it.
#[derive(Debug)]
struct Refusal {
    outcome: Outcome,
    http_status: u16,
    proxy_status: &'static str,
    socks_code: Option<u8>,
    message: String,
}

impl Refusal {
    fn new(outcome: Outcome, http_status: u16, socks_code: Option<u8>, message: String) -> Self {
        let proxy_status = match http_status {
            403 => "destination_ip_prohibited",
            407 | 429 => "http_request_denied",
            408 => "http_request_error",
            431 => "http_request_error",
            502 => "proxy_internal_response",
            503 => "destination_unavailable",
            504 => "connection_timeout",
            _ => "http_request_error",
        };
        Self {
            outcome,
            http_status,
            proxy_status,
            socks_code,
            message,
        }
    }

    fn auth() -> Self {
        Self::new(
            Outcome::AuthFailed,
            407,
            None,
            "authentication required: the pool's client credentials, as \
             NAME[-session-ID[-ttl-DURATION]][-egress-ADDRESS] and the password"
                .into(),
        )
    }
}

/// The access-log line in the making: filled only when the log is on
/// ([`AccessLog::enabled`]), so a gateway with the log off formats no text per connection.
// NB: `scripts/bench gateway` runs with the log off; the record's strings (peer, pool,
// target, identity, member, time) were a dozen allocations and formats per connection.
struct Trace {
    rec: Option<Record>,
    /// Members tried (also in refusal messages, so always counted).
    attempts: u32,
}

impl Trace {
    /// Runs `f` on the record when the log is on.
    fn note(&mut self, f: impl FnOnce(&mut Record)) {
        if let Some(r) = &mut self.rec {
            f(r);
        }
    }
}

/// What a handshake produced.
struct Asked {
    kind: Kind,
    target: Target,
    forward_head: Option<Vec<u8>>,
    /// Bytes after the request (CONNECT early data, a request body's start).
    early: Option<(PooledBuf, std::ops::Range<usize>)>,
    username: String,
    password: Vec<u8>,
}

/// Serves one client connection to its end.
pub async fn serve(ctx: Arc<ConnCtx>, client: TcpStream, peer: SocketAddr) {
    let started = Instant::now();
    // NB: TCP_NODELAY comes from the listener (set.rs `bind`), one setsockopt less here.
    let pool = Arc::clone(&ctx.pool);
    pool.metrics.active.inc();
    let state = pool.state();
    let mut trace = Trace {
        rec: ctx.log.enabled().then(|| Record {
            pool: pool.key.clone(),
            listener: ctx.protocol.as_str(),
            client: peer.to_string(),
            ..Record::default()
        }),
        attempts: 0,
    };
    let (outcome, reason) = match run(&ctx, &state, &client, &mut trace).await {
        Ok(end) => match end {
            End::Closed | End::Error(_) => (Outcome::Ok, None),
            End::Idle => (
                Outcome::IdleTimeout,
                Some("the tunnel was silent for the idle timeout".to_owned()),
            ),
            End::Cut if ctx.shutdown.is_cancelled() => {
                (Outcome::Shutdown, Some("the gateway shut down".to_owned()))
            }
            End::Cut => (
                Outcome::Drained,
                Some("the member left the pool and its drain grace ended".to_owned()),
            ),
        },
        Err(r) => {
            if r.outcome != Outcome::ClientGone {
                refuse(&client, ctx.protocol, &r).await;
            }
            if r.outcome == Outcome::AuthFailed {
                pool.metrics.auth_failures.inc();
            }
            (r.outcome, Some(r.message))
        }
    };
    pool.metrics.connection(outcome);
    pool.metrics.active.dec();
    let Some(mut rec) = trace.rec else { return };
    rec.attempts = trace.attempts;
    rec.outcome = outcome.as_str();
    rec.reason = reason;
    rec.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    rec.time = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    ctx.log.write(&rec);
}

/// Writes the refusal in the listener's protocol (best effort, bounded by a short deadline).
async fn refuse(client: &TcpStream, protocol: ListenerProtocol, r: &Refusal) {
    // NB: a client that does not read its refusal must not hold the task.
    const WRITE_DEADLINE: Duration = Duration::from_secs(5);
    let bytes = match protocol {
        ListenerProtocol::Http => http::error_reply(r.http_status, r.proxy_status, &r.message),
        ListenerProtocol::Socks5 => match r.socks_code {
            Some(code) => socks::reply(code).to_vec(),
            None => return,
        },
    };
    let _ = tokio::time::timeout(WRITE_DEADLINE, write_all(client, &bytes)).await;
}

async fn run(
    ctx: &ConnCtx,
    state: &PoolState,
    client: &TcpStream,
    trace: &mut Trace,
) -> Result<End, Refusal> {
    let settings = &state.settings;
    let deadline = Instant::now() + settings.timeouts.request;
    let asked = match ctx.protocol {
        ListenerProtocol::Http => http_handshake(client, deadline).await?,
        ListenerProtocol::Socks5 => socks_handshake(client, deadline, state).await?,
    };
    trace.note(|r| {
        r.kind = Some(asked.kind.as_str());
        r.target = Some(crate::text::clip(&asked.target.to_string(), 300).to_owned());
    });
    let Some((identity, split)) = state
        .identities
        .authenticate(&asked.username, &asked.password)
    else {
        return Err(Refusal::auth());
    };
    trace.note(|r| r.identity = Some(identity.name().to_owned()));
    let options = split
        .options(&settings.sessions)
        .map_err(|e| Refusal::new(Outcome::BadRequest, 400, Some(reply::FAILURE), e.0))?;
    trace.note(|r| r.session.clone_from(&options.session));
    settings
        .destinations
        .check(&asked.target)
        .map_err(|e| Refusal::new(Outcome::Denied, 403, Some(reply::NOT_ALLOWED), e.0))?;
    let admission = identity.admit(&settings.limits).map_err(|hit| {
        ctx.pool.metrics.limited(hit.label());
        Refusal::new(
            Outcome::Limited,
            429,
            Some(reply::NOT_ALLOWED),
            hit.to_string(),
        )
    })?;
    let choice = ctx
        .pool
        .choose(state, identity.name(), &options)
        .map_err(|e| Refusal::new(Outcome::NoMember, 503, Some(reply::FAILURE), e.0))?;
    let (index, dialed, _hold) = attempt(ctx, state, &choice.order, &asked.target, trace).await?;
    let Some(live) = state.members.get(index) else {
        return Err(Refusal::new(
            Outcome::MemberFailed,
            502,
            Some(reply::FAILURE),
            "internal: the chosen member vanished".into(),
        ));
    };
    if let Some(session) = choice.session {
        ctx.pool
            .metrics
            .sticky(ctx.pool.remember(session, &live.member.uid));
    }
    // Open: the client's first byte.
    let member = dialed.stream;
    match (ctx.protocol, asked.kind) {
        (ListenerProtocol::Http, Kind::Connect) => {
            write_all(client, http::CONNECTED).await.map_err(gone)?;
        }
        (ListenerProtocol::Socks5, _) => {
            write_all(client, &socks::reply(reply::OK))
                .await
                .map_err(gone)?;
        }
        (ListenerProtocol::Http, Kind::Forward) => {}
    }
    let mut early_up = 0u64;
    if let Some(h) = &asked.forward_head {
        write_all(&member, h).await.map_err(gone)?;
        early_up += h.len() as u64;
    }
    if let Some((buf, range)) = &asked.early {
        let b = buf.get(range.clone()).unwrap_or_default();
        write_all(&member, b).await.map_err(gone)?;
        early_up += b.len() as u64;
    }
    drop(asked);
    let mut early_down = 0u64;
    if let Some((buf, range)) = &dialed.early {
        let b = buf.get(range.clone()).unwrap_or_default();
        write_all(client, b).await.map_err(gone)?;
        early_down = b.len() as u64;
    }
    drop(dialed.early);
    count(ctx, &admission, early_up, true);
    count(ctx, &admission, early_down, false);
    let on_bytes = |n: u64, up: bool| count(ctx, &admission, n, up);
    let cut = async {
        tokio::select! {
            () = live.rt.cut.cancelled() => {}
            () = ctx.shutdown.cancelled() => {}
        }
    };
    let copied = copy::tunnel(
        client,
        &member,
        settings.timeouts.tunnel_idle,
        cut,
        &on_bytes,
    )
    .await;
    trace.note(|r| {
        r.bytes_up = copied.up + early_up;
        r.bytes_down = copied.down + early_down;
    });
    Ok(copied.end)
}

fn count(ctx: &ConnCtx, admission: &Admission, n: u64, up: bool) {
    if n == 0 {
        return;
    }
    if up {
        ctx.pool.metrics.bytes_up.inc_by(n);
    } else {
        ctx.pool.metrics.bytes_down.inc_by(n);
    }
    admission.add_bytes(n, up);
}

fn gone(_: std::io::Error) -> Refusal {
    Refusal::new(
        Outcome::ClientGone,
        400,
        None,
        "the connection closed before the tunnel was open".into(),
    )
}

/// Tries the members of `order`, each under the attempt deadline, until one opens the tunnel.
async fn attempt(
    ctx: &ConnCtx,
    state: &PoolState,
    order: &[usize],
    target: &Target,
    trace: &mut Trace,
) -> Result<(usize, dial::Dialed, MemberHold), Refusal> {
    let mut last: Option<DialError> = None;
    for (n, &i) in order.iter().enumerate() {
        let Some(m) = state.members.get(i) else {
            continue;
        };
        if n > 0 {
            ctx.pool.metrics.failovers.inc();
        }
        trace.attempts += 1;
        trace.note(|r| {
            r.member = Some(m.member.name.clone());
            r.member_egress = m.member.egress.iter().map(ToString::to_string).collect();
        });
        // Counted while dialling too, so least-connections sees attempts in flight.
        let hold = m.rt.hold();
        let r = tokio::time::timeout(
            state.settings.timeouts.connect,
            dial::dial(
                m.member.addr,
                m.member.protocol,
                m.auth.as_deref(),
                m.member.credentials.as_ref(),
                target,
            ),
        )
        .await
        .unwrap_or(Err(DialError::Timeout));
        match r {
            Ok(d) => return Ok((i, d, hold)),
            Err(e) => {
                tracing::debug!(pool = %ctx.pool.key, member = %m.member.name, error = %e, "member attempt failed");
                ctx.pool.metrics.dial_failure(e.label());
                if e.suspect() {
                    m.rt.mark_suspect();
                }
                let stop = !e.retry();
                last = Some(e);
                if stop {
                    break;
                }
            }
        }
    }
    let e = last.unwrap_or(DialError::Unreachable("no member to try".into()));
    Err(match &e {
        DialError::Denied(_) => Refusal::new(
            Outcome::Denied,
            403,
            Some(e.socks_code()),
            format!("the destination is refused: {e}"),
        ),
        DialError::Timeout => Refusal::new(
            Outcome::MemberFailed,
            504,
            Some(e.socks_code()),
            format!("{} member(s) tried; the last: {e}", trace.attempts),
        ),
        _ => Refusal::new(
            Outcome::MemberFailed,
            502,
            Some(e.socks_code()),
            format!("{} member(s) tried; the last: {e}", trace.attempts),
        ),
    })
}

/// Waits for `client` to be readable by `deadline`.
async fn readable(client: &TcpStream, deadline: Instant) -> Result<(), Refusal> {
    match tokio::time::timeout_at(deadline, client.readable()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(gone(e)),
        Err(_) => Err(timeout()),
    }
}

fn timeout() -> Refusal {
    Refusal::new(
        Outcome::RequestTimeout,
        408,
        None,
        "the request did not arrive within the request timeout".into(),
    )
}

/// Reads more of the client's bytes into `buf[*filled..]` by `deadline`.
async fn fill(
    client: &TcpStream,
    buf: &mut PooledBuf,
    filled: &mut usize,
    deadline: Instant,
) -> Result<(), Refusal> {
    loop {
        readable(client, deadline).await?;
        let Some(space) = buf.get_mut(*filled..).filter(|s| !s.is_empty()) else {
            return Err(Refusal::new(
                Outcome::BadRequest,
                431,
                Some(reply::FAILURE),
                "the request is larger than the gateway accepts".into(),
            ));
        };
        match client.try_read(space) {
            Ok(0) => {
                return Err(Refusal::new(
                    Outcome::ClientGone,
                    400,
                    None,
                    format!("the client closed the connection after {} bytes", *filled),
                ));
            }
            Ok(n) => {
                *filled += n;
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(gone(e)),
        }
    }
}

/// Waits for the client's first bytes and reads them into a head buffer taken only once the
/// socket is readable (and given back at once when the read finds nothing), so a connection
/// that sends nothing holds none between its wake-ups.
// NB: readiness alone is not enough: tokio assumes an accepted socket readable until a read
// says otherwise, so the first `readable()` returns at once. One read into the head buffer
// (not a few bytes first, then the rest) saves a system call per connection.
async fn first_bytes(client: &TcpStream, deadline: Instant) -> Result<(PooledBuf, usize), Refusal> {
    loop {
        readable(client, deadline).await?;
        let mut buf = HEAD.take();
        match client.try_read(&mut buf) {
            Ok(0) => {
                return Err(Refusal::new(
                    Outcome::ClientGone,
                    400,
                    None,
                    "the client closed the connection without a request".into(),
                ));
            }
            Ok(n) => return Ok((buf, n)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(gone(e)),
        }
    }
}

fn early(buf: PooledBuf, from: usize, to: usize) -> Option<(PooledBuf, std::ops::Range<usize>)> {
    (to > from).then_some((buf, from..to))
}

async fn http_handshake(client: &TcpStream, deadline: Instant) -> Result<Asked, Refusal> {
    let (mut buf, mut filled) = first_bytes(client, deadline).await?;
    loop {
        match http::parse(buf.get(..filled).unwrap_or_default()) {
            Ok(None) => fill(client, &mut buf, &mut filled, deadline).await?,
            Ok(Some(req)) => {
                let Some((username, password)) = req.credentials else {
                    return Err(Refusal::auth());
                };
                return Ok(Asked {
                    kind: req.kind,
                    target: req.target,
                    forward_head: req.forward_head,
                    username,
                    password,
                    early: early(buf, req.head_len, filled),
                });
            }
            Err(e) => {
                return Err(Refusal::new(Outcome::BadRequest, e.status, None, e.message));
            }
        }
    }
}

async fn socks_handshake(
    client: &TcpStream,
    deadline: Instant,
    state: &PoolState,
) -> Result<Asked, Refusal> {
    let bad = |e: socks::SocksError| Refusal::new(Outcome::BadRequest, 400, e.code, e.message);
    let (mut buf, mut filled) = first_bytes(client, deadline).await?;
    let mut at = 0;
    let greeting = loop {
        if let Some(g) =
            socks::parse_greeting(buf.get(at..filled).unwrap_or_default()).map_err(bad)?
        {
            break g;
        }
        fill(client, &mut buf, &mut filled, deadline).await?;
    };
    at += greeting.len;
    if !greeting.userpass {
        let _ = write_all(client, &[5, 0xff]).await;
        return Err(Refusal::new(
            Outcome::AuthFailed,
            407,
            None,
            "the client offered no username/password method; the gateway requires it".into(),
        ));
    }
    write_all(client, &[5, 2]).await.map_err(gone)?;
    let (username, password) = loop {
        if let Some(up) =
            socks::parse_userpass(buf.get(at..filled).unwrap_or_default()).map_err(bad)?
        {
            at += up.len;
            break (
                String::from_utf8_lossy(up.username).into_owned(),
                up.password.to_vec(),
            );
        }
        fill(client, &mut buf, &mut filled, deadline).await?;
    };
    // RFC 1929: the status comes before the request; a failure closes the connection.
    if state
        .identities
        .authenticate(&username, &password)
        .is_none()
    {
        let _ = write_all(client, &[1, 1]).await;
        return Err(Refusal::auth());
    }
    write_all(client, &[1, 0]).await.map_err(gone)?;
    let target = loop {
        if let Some((t, len)) =
            socks::parse_request(buf.get(at..filled).unwrap_or_default()).map_err(bad)?
        {
            at += len;
            break t;
        }
        fill(client, &mut buf, &mut filled, deadline).await?;
    };
    Ok(Asked {
        kind: Kind::Connect,
        target,
        forward_head: None,
        username,
        password,
        early: early(buf, at, filled),
    })
}
