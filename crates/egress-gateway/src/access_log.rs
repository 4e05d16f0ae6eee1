//! The access log: one JSON object per line per client connection, written when the
//! connection ends, to stderr or to a file rotated by size.
//!
//! Guarantees:
//! - The data path never waits on the log: lines go through a bounded queue
//!   ([`QUEUE_LINES`]) to one writer thread; when it falls behind, lines are dropped and
//!   counted (`egress_proxies_gateway_access_log_dropped_total`), never buffered without bound.
//! - Every field comes from a fixed set ([`Record`]); text a client sent (a target name, a
//!   session ID) is bounded and JSON-escaped, so a line is always one valid JSON object.
//! - With a file: when writing a line would take it past `max_bytes`, the file is renamed to
//!   `FILE.1` (`FILE.1` to `FILE.2`, ... up to `keep`, the oldest removed) and a new one
//!   started; a write error is reported once on stderr and the writer keeps trying with the
//!   next line.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::Duration;

use serde::Serialize;

use crate::metrics::GatewayMetrics;

/// Lines queued for the writer at most.
// NB: at 50,000 connections/s this is 0.3 s of lines; a disk slower than that for longer
// loses lines (counted) rather than memory.
pub const QUEUE_LINES: usize = 16 * 1024;
/// How often buffered lines are flushed when the queue is quiet.
const FLUSH_EVERY: Duration = Duration::from_millis(200);

/// Where the access log goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    /// Nowhere.
    Off,
    /// Standard error, one line per connection.
    Stderr,
    /// A file, rotated when it would pass `max_bytes`, `keep` old files kept.
    File {
        /// The file.
        path: PathBuf,
        /// Size at which it is rotated.
        max_bytes: u64,
        /// Rotated files kept (`FILE.1` … `FILE.keep`).
        keep: u32,
    },
}

/// One access-log line. Field names and meanings are documented in docs/gateway.md.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Record {
    /// When the connection ended (RFC 3339, milliseconds, UTC).
    pub time: String,
    /// The pool, `namespace/name`.
    pub pool: String,
    /// `http` or `socks5`: the listener.
    pub listener: &'static str,
    /// The client's address (`ip:port`).
    pub client: String,
    /// The identity (credential username) authenticated, when one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The session ID from the username, when one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// `connect` (a tunnel) or `forward` (an absolute-URI HTTP request), once known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The destination `host:port`, once known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The member that carried it (the last one tried when none did).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// The member's egress address(es).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub member_egress: Vec<String>,
    /// Members tried.
    pub attempts: u32,
    /// Bytes client → target.
    pub bytes_up: u64,
    /// Bytes target → client.
    pub bytes_down: u64,
    /// From accept to close, milliseconds.
    pub duration_ms: u64,
    /// How it ended (the `outcome` metric label).
    pub outcome: &'static str,
    /// Why it was refused or cut, in a sentence (absent for `ok`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The handle the data path writes through; cheap to clone.
#[derive(Debug, Clone)]
pub struct AccessLog {
    tx: Option<SyncSender<String>>,
    metrics: GatewayMetrics,
}

impl AccessLog {
    /// A log that writes nothing.
    pub fn off(metrics: GatewayMetrics) -> Self {
        Self { tx: None, metrics }
    }

    /// Starts the writer thread for `target`; it ends when every handle is dropped.
    pub fn start(target: LogTarget, metrics: GatewayMetrics) -> std::io::Result<Self> {
        let sink = match target {
            LogTarget::Off => return Ok(Self::off(metrics)),
            LogTarget::Stderr => Sink::Stderr,
            LogTarget::File {
                path,
                max_bytes,
                keep,
            } => {
                let file = open_append(&path)?;
                let size = file.metadata().map_or(0, |m| m.len());
                Sink::File {
                    w: std::io::BufWriter::new(file),
                    size,
                    path,
                    max_bytes: max_bytes.max(1),
                    keep,
                    failing: false,
                }
            }
        };
        let (tx, rx) = sync_channel(QUEUE_LINES);
        std::thread::Builder::new()
            .name("gateway-access-log".into())
            .spawn(move || writer(rx, sink))?;
        Ok(Self {
            tx: Some(tx),
            metrics,
        })
    }

    /// Whether lines are written at all (`false` for [`LogTarget::Off`]): the data path
    /// builds no [`Record`] when they are not.
    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues `r` (dropped and counted when the queue is full).
    pub fn write(&self, r: &Record) {
        let Some(tx) = &self.tx else { return };
        let Ok(mut line) = serde_json::to_string(r) else {
            return;
        };
        line.push('\n');
        match tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.metrics.log_dropped();
            }
        }
    }
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

enum Sink {
    Stderr,
    File {
        w: std::io::BufWriter<std::fs::File>,
        size: u64,
        path: PathBuf,
        max_bytes: u64,
        keep: u32,
        failing: bool,
    },
}

impl Sink {
    fn line(&mut self, line: &str) {
        match self {
            Self::Stderr => {
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
            }
            Self::File {
                w,
                size,
                path,
                max_bytes,
                keep,
                failing,
            } => {
                let n = line.len() as u64;
                if *size > 0 && size.saturating_add(n) > *max_bytes {
                    let _ = w.flush();
                    match rotate(path, *keep) {
                        Ok(f) => {
                            *w = std::io::BufWriter::new(f);
                            *size = 0;
                        }
                        Err(e) => report(failing, path, &e),
                    }
                }
                match w.write_all(line.as_bytes()) {
                    Ok(()) => {
                        *size += n;
                        *failing = false;
                    }
                    Err(e) => report(failing, path, &e),
                }
            }
        }
    }

    fn flush(&mut self) {
        if let Self::File { w, .. } = self {
            let _ = w.flush();
        }
    }
}

fn report(failing: &mut bool, path: &Path, e: &std::io::Error) {
    if !*failing {
        eprintln!(
            "error: gateway access log {}: {e} (lines are lost until it works again)",
            path.display()
        );
        *failing = true;
    }
}

fn numbered(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

/// Renames `path` to `path.1` (shifting older ones, the oldest beyond `keep` removed) and
/// opens a new `path`.
fn rotate(path: &Path, keep: u32) -> std::io::Result<std::fs::File> {
    if keep == 0 {
        let _ = std::fs::remove_file(path);
    } else {
        let _ = std::fs::remove_file(numbered(path, keep));
        for n in (1..keep).rev() {
            let _ = std::fs::rename(numbered(path, n), numbered(path, n + 1));
        }
        std::fs::rename(path, numbered(path, 1))?;
    }
    open_append(path)
}

fn writer(rx: Receiver<String>, mut sink: Sink) {
    loop {
        match rx.recv_timeout(FLUSH_EVERY) {
            Ok(line) => sink.line(&line),
            Err(RecvTimeoutError::Timeout) => sink.flush(),
            Err(RecvTimeoutError::Disconnected) => {
                sink.flush();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_file_log_rotates_by_size_and_keeps_every_line_as_json() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let log = AccessLog::start(
            LogTarget::File {
                path: path.clone(),
                max_bytes: 600,
                keep: 2,
            },
            GatewayMetrics::new(),
        )
        .unwrap();
        for i in 0..20 {
            log.write(&Record {
                pool: "default/web".into(),
                target: Some(format!("host{i}.example\n\"x:80")),
                outcome: "ok",
                ..Record::default()
            });
        }
        drop(log);
        // The writer thread drains and exits once the last handle is gone.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let lines: usize = [path.clone(), numbered(&path, 1), numbered(&path, 2)]
                .iter()
                .map(|p| {
                    std::fs::read_to_string(p)
                        .unwrap_or_default()
                        .lines()
                        .count()
                })
                .sum();
            if lines > 0 && std::fs::metadata(numbered(&path, 2)).is_ok() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no rotation seen");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(!numbered(&path, 3).exists(), "keep: 2");
        for p in [&path, &numbered(&path, 1), &numbered(&path, 2)] {
            let text = std::fs::read_to_string(p).unwrap();
            assert!(text.len() <= 600, "{}: {}", p.display(), text.len());
            for l in text.lines() {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                assert_eq!(v["pool"], "default/web");
            }
        }
    }
}
