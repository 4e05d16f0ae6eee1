//! Fault injection: what a connection should get wrong, settable at any time.
//!
//! A [`Faults`] handle holds one [`FaultSpec`]. The fake has one handle that applies to every
//! connection ([`FakeLibvirt::faults`](crate::FakeLibvirt::faults)) and each connection has its
//! own ([`ConnHandle::faults`](crate::ConnHandle::faults)); a connection suffers the union of
//! both. Guarantees: a change is seen by live connections at their next step (a frozen
//! connection stops reading and writing at once and resumes when thawed); one-shot faults
//! (the next N duplicates, the next bad frame, a failing call's remaining count) are consumed
//! exactly once even with many connections.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// Which malformed length word replaces a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadLength {
    /// A length below the 28-byte minimum (12), followed by 8 bytes.
    Short,
    /// A length above the 32 MiB maximum (`0xFFFF_FFF0`), followed by 8 bytes.
    Huge,
}

/// Which replies are sent twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Duplicate {
    /// None.
    #[default]
    Off,
    /// Every reply to a plain call.
    All,
    /// The next N replies to plain calls.
    Next(u64),
}

/// A procedure that fails with a chosen error instead of running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailCall {
    /// Procedure number (see `libvirt_remote::proto::procs`).
    pub procedure: i32,
    /// `virErrorNumber` to return.
    pub code: i32,
    /// `virErrorDomain` to return.
    pub domain: i32,
    /// Message to return.
    pub message: String,
    /// How many more calls fail (`None`: all of them).
    pub times: Option<u32>,
}

/// Everything that can be made to go wrong. `Default` is a healthy daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultSpec {
    /// Stop reading and writing (the socket stays open, nothing is answered, not even PINGs).
    pub frozen: bool,
    /// Close the connection right after the `CONNECT_OPEN` reply is written.
    pub close_after_open: bool,
    /// Send replies twice.
    pub duplicate_replies: Duplicate,
    /// Replace the next reply with a frame whose length word is invalid.
    pub bad_length_next_reply: Option<BadLength>,
    /// Delay every call's execution and reply by this long. Delayed calls run each in its own
    /// task, so pipelined calls may complete in any order (as with libvirtd's worker pool).
    pub reply_delay: Option<Duration>,
    /// Fail every upload stream with ENOSPC (code 38) once it has stored this many bytes.
    pub upload_fail_after: Option<u64>,
    /// The guest agent does not answer: source AGENT interface queries fail with code 86.
    pub agent_unresponsive: bool,
    /// The host's ARP table cannot be read: source ARP interface queries fail with code 1
    /// (`VIR_ERR_INTERNAL_ERROR`) and this message (libvirtd 11.3 answers "malformed netlink
    /// response message" when the neighbour table is empty, "error dumping neighbor table: …"
    /// when the dump fails).
    pub arp_error: Option<String>,
    /// Calls that fail with a chosen error.
    pub fail_calls: Vec<FailCall>,
}

/// A live, shared handle to one [`FaultSpec`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Faults {
    tx: Arc<watch::Sender<FaultSpec>>,
}

impl Default for Faults {
    fn default() -> Self {
        Self::new()
    }
}

impl Faults {
    /// A handle with no faults.
    pub fn new() -> Self {
        Self::from_spec(FaultSpec::default())
    }

    /// A handle starting from `spec`.
    pub fn from_spec(spec: FaultSpec) -> Self {
        let (tx, _) = watch::channel(spec);
        Self { tx: Arc::new(tx) }
    }

    /// The current faults.
    pub fn snapshot(&self) -> FaultSpec {
        self.tx.borrow().clone()
    }

    /// Replaces every fault.
    pub fn set(&self, spec: FaultSpec) {
        self.tx.send_replace(spec);
    }

    /// Edits the faults in place.
    pub fn update(&self, f: impl FnOnce(&mut FaultSpec)) {
        self.tx.send_modify(f);
    }

    /// Removes every fault (thaws, stops duplicating, ...).
    pub fn clear(&self) {
        self.set(FaultSpec::default());
    }

    /// Stops reading and writing; the socket stays open.
    pub fn freeze(&self) {
        self.update(|s| s.frozen = true);
    }

    /// Resumes a frozen connection.
    pub fn thaw(&self) {
        self.update(|s| s.frozen = false);
    }

    /// Closes each connection right after its `CONNECT_OPEN` reply.
    pub fn close_after_open(&self, on: bool) {
        self.update(|s| s.close_after_open = on);
    }

    /// Sends replies twice.
    pub fn duplicate_replies(&self, d: Duplicate) {
        self.update(|s| s.duplicate_replies = d);
    }

    /// Replaces the next reply with a frame of invalid length.
    pub fn bad_length_next_reply(&self, b: BadLength) {
        self.update(|s| s.bad_length_next_reply = Some(b));
    }

    /// Delays every call (`None`: no delay).
    pub fn delay_replies(&self, d: Option<Duration>) {
        self.update(|s| s.reply_delay = d);
    }

    /// Fails uploads with ENOSPC after `bytes` stored (`None`: never).
    pub fn fail_uploads_after(&self, bytes: Option<u64>) {
        self.update(|s| s.upload_fail_after = bytes);
    }

    /// Makes the guest agent unresponsive (code 86).
    pub fn agent_unresponsive(&self, on: bool) {
        self.update(|s| s.agent_unresponsive = on);
    }

    /// Makes the ARP address source fail with `message` (`None`: it works).
    pub fn arp_error(&self, message: Option<&str>) {
        self.update(|s| s.arp_error = message.map(str::to_owned));
    }

    /// Fails the next `times` calls of `procedure` (all of them with `None`) with the given
    /// error instead of running them.
    pub fn fail_calls(
        &self,
        procedure: i32,
        code: i32,
        domain: i32,
        message: impl Into<String>,
        times: Option<u32>,
    ) {
        let fc = FailCall {
            procedure,
            code,
            domain,
            message: message.into(),
            times,
        };
        self.update(|s| s.fail_calls.push(fc));
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<FaultSpec> {
        self.tx.subscribe()
    }

    fn read<T>(&self, f: impl FnOnce(&FaultSpec) -> T) -> T {
        f(&self.tx.borrow())
    }

    fn take_duplicate(&self) -> bool {
        let mut hit = false;
        self.tx.send_if_modified(|s| match s.duplicate_replies {
            Duplicate::Off => false,
            Duplicate::All => {
                hit = true;
                false
            }
            Duplicate::Next(n) => {
                hit = n > 0;
                s.duplicate_replies = match n {
                    0 | 1 => Duplicate::Off,
                    n => Duplicate::Next(n - 1),
                };
                true
            }
        });
        hit
    }

    fn take_bad_length(&self) -> Option<BadLength> {
        let mut out = None;
        self.tx.send_if_modified(|s| {
            out = s.bad_length_next_reply.take();
            out.is_some()
        });
        out
    }

    fn take_fail(&self, procedure: i32) -> Option<FailCall> {
        let mut out = None;
        self.tx.send_if_modified(|s| {
            let Some(idx) = s
                .fail_calls
                .iter()
                .position(|f| f.procedure == procedure && f.times != Some(0))
            else {
                return false;
            };
            let Some(fc) = s.fail_calls.get_mut(idx) else {
                return false;
            };
            out = Some(fc.clone());
            match fc.times {
                None => false,
                Some(n) if n <= 1 => {
                    s.fail_calls.remove(idx);
                    true
                }
                Some(n) => {
                    fc.times = Some(n - 1);
                    true
                }
            }
        });
        out
    }
}

/// The faults one connection suffers: its own and the fake's.
#[derive(Debug, Clone)]
pub(crate) struct FaultScope {
    pub conn: Faults,
    pub global: Faults,
}

impl FaultScope {
    fn either(&self, f: impl Fn(&FaultSpec) -> bool) -> bool {
        self.conn.read(&f) || self.global.read(&f)
    }

    pub fn frozen(&self) -> bool {
        self.either(|s| s.frozen)
    }

    pub fn close_after_open(&self) -> bool {
        self.either(|s| s.close_after_open)
    }

    pub fn agent_unresponsive(&self) -> bool {
        self.either(|s| s.agent_unresponsive)
    }

    /// The connection's ARP failure, else the fake's.
    pub fn arp_error(&self) -> Option<String> {
        self.conn
            .read(|s| s.arp_error.clone())
            .or_else(|| self.global.read(|s| s.arp_error.clone()))
    }

    /// The longer of the two delays.
    pub fn delay(&self) -> Option<Duration> {
        let a = self.conn.read(|s| s.reply_delay);
        let b = self.global.read(|s| s.reply_delay);
        a.max(b).filter(|d| !d.is_zero())
    }

    /// The smaller of the two upload budgets.
    pub fn upload_fail_after(&self) -> Option<u64> {
        let a = self.conn.read(|s| s.upload_fail_after);
        let b = self.global.read(|s| s.upload_fail_after);
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn take_duplicate(&self) -> bool {
        self.conn.take_duplicate() || self.global.take_duplicate()
    }

    pub fn take_bad_length(&self) -> Option<BadLength> {
        self.conn
            .take_bad_length()
            .or_else(|| self.global.take_bad_length())
    }

    pub fn take_fail(&self, procedure: i32) -> Option<FailCall> {
        self.conn
            .take_fail(procedure)
            .or_else(|| self.global.take_fail(procedure))
    }

    pub fn watch(&self) -> FaultWatch {
        FaultWatch {
            scope: self.clone(),
            conn: self.conn.subscribe(),
            global: self.global.subscribe(),
        }
    }
}

/// Waits for the frozen state of a [`FaultScope`] to change.
pub(crate) struct FaultWatch {
    scope: FaultScope,
    conn: watch::Receiver<FaultSpec>,
    global: watch::Receiver<FaultSpec>,
}

impl FaultWatch {
    async fn changed(&mut self) {
        // NB: a sender never goes away while a connection runs (the fake and the connection
        // own them); if one did, nothing could change any more, so wait forever.
        tokio::select! {
            r = self.conn.changed() => if r.is_err() { std::future::pending::<()>().await },
            r = self.global.changed() => if r.is_err() { std::future::pending::<()>().await },
        }
    }

    fn mark_seen(&mut self) {
        self.conn.borrow_and_update();
        self.global.borrow_and_update();
    }

    /// Returns once the connection is not frozen.
    pub async fn wait_thawed(&mut self) {
        loop {
            self.mark_seen();
            if !self.scope.frozen() {
                return;
            }
            self.changed().await;
        }
    }

    /// Returns once the connection is frozen.
    pub async fn until_frozen(&mut self) {
        loop {
            self.mark_seen();
            if self.scope.frozen() {
                return;
            }
            self.changed().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope() -> FaultScope {
        FaultScope {
            conn: Faults::new(),
            global: Faults::new(),
        }
    }

    #[test]
    fn next_n_duplicates_are_consumed_exactly() {
        let s = scope();
        s.global.duplicate_replies(Duplicate::Next(2));
        assert!(s.take_duplicate());
        assert!(s.take_duplicate());
        assert!(!s.take_duplicate());
        s.conn.duplicate_replies(Duplicate::All);
        assert!(s.take_duplicate() && s.take_duplicate());
    }

    #[test]
    fn bad_length_is_one_shot_and_connection_scope_wins() {
        let s = scope();
        s.conn.bad_length_next_reply(BadLength::Short);
        s.global.bad_length_next_reply(BadLength::Huge);
        assert_eq!(s.take_bad_length(), Some(BadLength::Short));
        assert_eq!(s.take_bad_length(), Some(BadLength::Huge));
        assert_eq!(s.take_bad_length(), None);
    }

    #[test]
    fn failing_calls_count_down_and_unlimited_ones_stay() {
        let s = scope();
        s.global.fail_calls(9, 55, 10, "no", Some(2));
        s.conn.fail_calls(14, 1, 7, "always", None);
        assert!(s.take_fail(9).is_some());
        assert!(s.take_fail(9).is_some());
        assert!(s.take_fail(9).is_none());
        for _ in 0..3 {
            assert_eq!(s.take_fail(14).map(|f| f.code), Some(1));
        }
        assert!(s.take_fail(23).is_none());
    }

    #[test]
    fn scopes_combine_delay_and_upload_budget() {
        let s = scope();
        s.conn.delay_replies(Some(Duration::from_millis(5)));
        s.global.delay_replies(Some(Duration::from_millis(9)));
        assert_eq!(s.delay(), Some(Duration::from_millis(9)));
        s.global.fail_uploads_after(Some(10));
        s.conn.fail_uploads_after(Some(4));
        assert_eq!(s.upload_fail_after(), Some(4));
        s.global.freeze();
        assert!(s.frozen());
        s.global.thaw();
        assert!(!s.frozen());
    }
}
