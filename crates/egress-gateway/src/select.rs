//! Which members a connection tries, in order: rendezvous (highest-random-weight) hashing
//! for a sticky session, round robin or least connections otherwise.
//!
//! **Rendezvous hashing.** A session's key is `IDENTITY 0x00 SESSION-ID` (and, with a TTL,
//! `0x00` and the session's current TTL window as 8 big-endian bytes). Each member's weight
//! is `SipHash-2-4(k0, k1; key 0xFF member-UID)` with the fixed keys [`HRW_K0`] and
//! [`HRW_K1`]; the session goes to the member of highest weight, then the next, in failover
//! order. Every replica computing this over the same members ranks them alike without
//! talking to the others; removing a member moves only the sessions it held first, and adding
//! one takes from each member only the sessions it now outweighs. The keys never change
//! between versions (changing them would move every session).
//!
//! **TTL windows.** A session with a TTL is re-hashed once per TTL: its window is
//! `floor((unix_time + offset) / ttl)` with `offset = SipHash-2-4(k0, k1; key) mod ttl`, so
//! sessions of one TTL do not all move at the same second. Replicas agree while their clocks
//! agree (a connection opened within the clock skew of a window's end may land on either
//! side).
//!
//! **Suspects.** A member whose last dial from this replica failed within
//! [`crate::pool::SUSPECT_FOR`] goes last in every order (the others keep theirs), so a dead
//! member costs one failed attempt, not one per connection.
//!
//! Guarantees: pure; at most `k` members returned; an empty member list returns none.

use std::hash::Hasher as _;

use siphasher::sip::SipHasher24;

/// First SipHash key of the rendezvous weight (`"egress-p"` as a big-endian u64).
pub const HRW_K0: u64 = 0x6567_7265_7373_2d70;
/// Second SipHash key of the rendezvous weight (`"roxies-g"`).
pub const HRW_K1: u64 = 0x726f_7869_6573_2d67;

/// A member as the choice sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Its index in the pool's member list.
    pub index: usize,
    /// A dial from this replica failed recently.
    pub suspect: bool,
    /// Open connections through it from this replica.
    pub active: u32,
}

/// The rendezvous weight of `member_uid` for `key`.
pub fn weight(key: &[u8], member_uid: &str) -> u64 {
    let mut h = SipHasher24::new_with_keys(HRW_K0, HRW_K1);
    h.write(key);
    h.write(&[0xff]);
    h.write(member_uid.as_bytes());
    h.finish()
}

/// The session key of `session` of `identity`, in TTL window terms when `ttl_secs` is set
/// (`unix_secs`: the current Unix time).
pub fn session_key(
    identity: &str,
    session: &str,
    ttl_secs: Option<u64>,
    unix_secs: u64,
) -> Vec<u8> {
    let mut key = Vec::with_capacity(identity.len() + session.len() + 10);
    key.extend_from_slice(identity.as_bytes());
    key.push(0);
    key.extend_from_slice(session.as_bytes());
    if let Some(ttl) = ttl_secs.filter(|t| *t > 0) {
        let mut h = SipHasher24::new_with_keys(HRW_K0, HRW_K1);
        h.write(&key);
        let offset = h.finish() % ttl;
        let window = unix_secs.saturating_add(offset) / ttl;
        key.push(0);
        key.extend_from_slice(&window.to_be_bytes());
    }
    key
}

/// A short hash of a session key (the per-replica "which member had it last" memory).
pub fn key_hash(key: &[u8]) -> u64 {
    let mut h = SipHasher24::new_with_keys(HRW_K1, HRW_K0);
    h.write(key);
    h.finish()
}

/// The first `k` of `cands` by rendezvous weight for `key` (suspects last).
pub fn sticky(cands: &[Candidate], uids: &[&str], key: &[u8], k: usize) -> Vec<usize> {
    let mut ranked: Vec<(bool, u64, usize)> = cands
        .iter()
        .filter_map(|c| {
            let uid = uids.get(c.index)?;
            Some((c.suspect, weight(key, uid), c.index))
        })
        .collect();
    // Not suspect first, then the highest weight; the index breaks a (2^-64) tie.
    ranked.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    ranked.into_iter().take(k).map(|(_, _, i)| i).collect()
}

/// The first `k` of `cands` in turn from position `start` (suspects last).
pub fn round_robin(cands: &[Candidate], start: usize, k: usize) -> Vec<usize> {
    let n = cands.len();
    if n == 0 {
        return Vec::new();
    }
    let mut order: Vec<(bool, usize, usize)> = cands
        .iter()
        .enumerate()
        .map(|(pos, c)| (c.suspect, (pos + n - start % n) % n, c.index))
        .collect();
    order.sort_unstable();
    order.into_iter().take(k).map(|(_, _, i)| i).collect()
}

/// The first `k` of `cands` by fewest open connections, ties in turn from `start` (suspects
/// last).
pub fn least_connections(cands: &[Candidate], start: usize, k: usize) -> Vec<usize> {
    let n = cands.len();
    if n == 0 {
        return Vec::new();
    }
    let mut order: Vec<(bool, u32, usize, usize)> = cands
        .iter()
        .enumerate()
        .map(|(pos, c)| (c.suspect, c.active, (pos + n - start % n) % n, c.index))
        .collect();
    order.sort_unstable();
    order.into_iter().take(k).map(|(_, _, _, i)| i).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn cands(n: usize) -> Vec<Candidate> {
        (0..n)
            .map(|index| Candidate {
                index,
                suspect: false,
                active: 0,
            })
            .collect()
    }

    fn uids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("uid-{i:04}")).collect()
    }

    /// The weight is a documented function: these values are what every replica and every
    /// version must compute (a change here moves every session).
    #[test]
    fn the_weight_is_stable() {
        assert_eq!(
            weight(b"alice\0s1", "uid-0000"),
            weight(b"alice\0s1", "uid-0000")
        );
        let expected = {
            let mut h = SipHasher24::new_with_keys(0x6567_7265_7373_2d70, 0x726f_7869_6573_2d67);
            h.write(b"alice\0s1\xffuid-0000");
            h.finish()
        };
        assert_eq!(weight(b"alice\0s1", "uid-0000"), expected);
        assert_eq!(&HRW_K0.to_be_bytes(), b"egress-p");
        assert_eq!(&HRW_K1.to_be_bytes(), b"roxies-g");
    }

    #[test]
    fn sessions_spread_evenly_over_members() {
        // 16 members, 64,000 sessions: each member's share within 5% of 4,000 (the standard
        // deviation of a fair split is ~61, so 5% is over 3 sigma).
        let n = 16;
        let u = uids(n);
        let ur: Vec<&str> = u.iter().map(String::as_str).collect();
        let c = cands(n);
        let mut counts = vec![0u32; n];
        for s in 0..64_000 {
            let key = session_key("alice", &format!("s{s}"), None, 0);
            counts[sticky(&c, &ur, &key, 1)[0]] += 1;
        }
        for (i, n) in counts.iter().enumerate() {
            assert!(
                (3800..=4200).contains(n),
                "member {i}: {n} of 64000 ({counts:?})"
            );
        }
    }

    #[test]
    fn removing_a_member_moves_only_its_own_sessions() {
        let n = 8;
        let u = uids(n);
        let ur: Vec<&str> = u.iter().map(String::as_str).collect();
        // The list without member 3, indexed afresh as a new view is.
        let rest: Vec<&str> = ur.iter().copied().filter(|x| *x != ur[3]).collect();
        let mut moved = 0;
        for s in 0..10_000 {
            let key = session_key("alice", &format!("s{s}"), None, 0);
            let before: Vec<&str> = sticky(&cands(n), &ur, &key, 2)
                .iter()
                .map(|i| ur[*i])
                .collect();
            let after = rest[sticky(&cands(n - 1), &rest, &key, 1)[0]];
            if before[0] == ur[3] {
                // The session moves to its second choice, which every replica agrees on.
                assert_eq!(after, before[1]);
                moved += 1;
            } else {
                assert_eq!(
                    after, before[0],
                    "session s{s} moved though its member stayed"
                );
            }
        }
        assert!((1000..1500).contains(&moved), "{moved}");
    }

    #[test]
    fn a_suspect_goes_last_and_the_others_keep_their_order() {
        let u = uids(4);
        let ur: Vec<&str> = u.iter().map(String::as_str).collect();
        let key = session_key("a", "s", None, 0);
        let order = sticky(&cands(4), &ur, &key, 4);
        let mut c = cands(4);
        c[order[0]].suspect = true;
        let again = sticky(&c, &ur, &key, 4);
        assert_eq!(&again[..3], &order[1..]);
        assert_eq!(again[3], order[0]);
        assert_eq!(round_robin(&c, order[0], 2)[0], (order[0] + 1) % 4);
    }

    #[test]
    fn ttl_windows_change_the_key_once_per_ttl_at_a_per_session_offset() {
        let k = |t| session_key("a", "s", Some(600), t);
        let changes = (0..6000u64).filter(|t| k(*t) != k(t + 1)).count();
        assert_eq!(changes, 10);
        assert_eq!(
            session_key("a", "s", None, 5),
            session_key("a", "s", None, 999)
        );
        let first_change = |s: &str| {
            (0..600u64).find(|t| {
                session_key("a", s, Some(600), *t) != session_key("a", s, Some(600), t + 1)
            })
        };
        let offsets: std::collections::BTreeSet<_> =
            (0..20).map(|i| first_change(&format!("s{i}"))).collect();
        assert!(
            offsets.len() > 10,
            "sessions roll at different seconds: {offsets:?}"
        );
    }

    #[test]
    fn round_robin_turns_and_least_connections_prefers_the_idle() {
        let c = cands(3);
        assert_eq!(round_robin(&c, 0, 3), [0, 1, 2]);
        assert_eq!(round_robin(&c, 4, 3), [1, 2, 0]);
        let mut busy = cands(3);
        busy[0].active = 5;
        busy[1].active = 1;
        busy[2].active = 1;
        assert_eq!(least_connections(&busy, 2, 3), [2, 1, 0]);
        assert_eq!(least_connections(&busy, 1, 1), [1]);
        assert!(round_robin(&[], 0, 3).is_empty());
    }
}
