//! Throttling of wrong keys: a client address that presents more than
//! `limits.key_failures_per_minute` wrong keys of one kind (client, admin,
//! dashboard login, peer) within a minute gets 429 for that kind until its
//! minute is over, without its keys being checked. Guessing a key over HTTP
//! is then bounded by that rate per address, however fast the network.
//!
//! Only keys that were presented and wrong count: a request without any
//! key is no guess (and gets its 401 as before). The map of addresses is
//! bounded (100,000 entries); when it is full of live entries, new
//! addresses are not tracked: availability over strictness.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Which key was wrong: each kind has its own budget, so that a client
/// with a stale API key does not lock its operators out of the admin API.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(crate) enum KeyKind {
    Client,
    Admin,
    Peer,
}

/// The address of the client of a request, set per connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClientAddr(pub(crate) IpAddr);

#[derive(Debug)]
struct Slot {
    since: Instant,
    failures: u32,
}

/// Wrong-key counts per (address, kind) over fixed one-minute windows.
#[derive(Debug)]
pub(crate) struct KeyThrottle {
    limit: u32,
    window: Duration,
    max_entries: usize,
    slots: Mutex<HashMap<(IpAddr, KeyKind), Slot>>,
    /// When the last throttled window ends, in nanoseconds since `epoch`:
    /// the request path reads this and takes the lock only while some
    /// address is throttled, not merely because one once failed.
    throttled_until: AtomicU64,
    epoch: Instant,
}

impl KeyThrottle {
    /// `limit` wrong keys per minute per address and kind; 0 disables.
    pub(crate) fn new(limit: u32) -> KeyThrottle {
        KeyThrottle::with(limit, Duration::from_secs(60), 100_000)
    }

    fn with(limit: u32, window: Duration, max_entries: usize) -> KeyThrottle {
        KeyThrottle {
            limit,
            window,
            max_entries,
            slots: Mutex::new(HashMap::new()),
            throttled_until: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(IpAddr, KeyKind), Slot>> {
        // Counters only: a panic elsewhere cannot leave them unusable.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Some(retry after)` when `addr` has used up its wrong keys of `kind`.
    pub(crate) fn blocked(&self, addr: IpAddr, kind: KeyKind, now: Instant) -> Option<Duration> {
        if self.limit == 0 || self.nanos(now) >= self.throttled_until.load(Ordering::Relaxed) {
            return None;
        }
        let slots = self.lock();
        let slot = slots.get(&(addr, kind))?;
        let end = slot.since + self.window;
        (slot.failures >= self.limit && now < end).then(|| end - now)
    }

    /// Counts one wrong key of `kind` from `addr`.
    pub(crate) fn failed(&self, addr: IpAddr, kind: KeyKind, now: Instant) {
        if self.limit == 0 {
            return;
        }
        let mut slots = self.lock();
        if slots.len() >= self.max_entries && !slots.contains_key(&(addr, kind)) {
            let window = self.window;
            slots.retain(|_, s| now < s.since + window);
            if slots.len() >= self.max_entries {
                return;
            }
        }
        let slot = slots.entry((addr, kind)).or_insert(Slot { since: now, failures: 0 });
        if now >= slot.since + self.window {
            *slot = Slot { since: now, failures: 0 };
        }
        slot.failures = slot.failures.saturating_add(1);
        if slot.failures >= self.limit {
            let end = self.nanos(slot.since + self.window);
            self.throttled_until.fetch_max(end, Ordering::Relaxed);
        }
    }
}

/// What a key check decided, throttling included.
pub(crate) enum KeyVerdict {
    Allowed,
    /// A 401 is the caller's to write (its message differs per route).
    Denied,
    /// 429 with `Retry-After`, ready to send.
    Throttled(axum::response::Response),
}

/// Applies the throttle around a key check of `kind`: `presented` says
/// whether the request carried a key at all, `ok` whether it was right.
/// While the address is throttled the answer is 429 whatever the key, so
/// a guess learns nothing; a wrong presented key is counted.
pub(crate) fn verdict(
    throttle: &KeyThrottle,
    metrics: &crate::observe::metrics::Metrics,
    addr: Option<&ClientAddr>,
    kind: KeyKind,
    presented: bool,
    ok: bool,
) -> KeyVerdict {
    let now = Instant::now();
    if let Some(ClientAddr(ip)) = addr {
        if let Some(wait) = throttle.blocked(*ip, kind, now) {
            metrics.count(crate::request::request_error::Reason::KeyThrottled);
            let e = kvgate_openai::ErrorResponse::rate_limited(
                "too many wrong keys from this address; retry later",
            );
            let r = crate::request::response::error_response(&e);
            return KeyVerdict::Throttled(crate::request::response::with_retry_after(r, wait));
        }
    }
    if ok {
        return KeyVerdict::Allowed;
    }
    if let (true, Some(ClientAddr(ip))) = (presented, addr) {
        throttle.failed(*ip, kind, now);
    }
    KeyVerdict::Denied
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn blocks_after_the_limit_until_the_window_ends() {
        let t = KeyThrottle::with(3, Duration::from_secs(60), 100);
        let t0 = Instant::now();
        for i in 0..3 {
            assert_eq!(t.blocked(A, KeyKind::Admin, t0), None, "after {i} failures");
            t.failed(A, KeyKind::Admin, t0);
        }
        let wait = t.blocked(A, KeyKind::Admin, t0 + Duration::from_secs(10)).unwrap();
        assert_eq!(wait, Duration::from_secs(50));
        // Other addresses and other kinds keep their own budgets.
        assert_eq!(t.blocked(B, KeyKind::Admin, t0), None);
        assert_eq!(t.blocked(A, KeyKind::Client, t0), None);
        // A new window starts afresh.
        let later = t0 + Duration::from_secs(61);
        assert_eq!(t.blocked(A, KeyKind::Admin, later), None);
        t.failed(A, KeyKind::Admin, later);
        assert_eq!(t.blocked(A, KeyKind::Admin, later), None);
    }

    #[test]
    fn zero_disables_and_the_map_stays_bounded() {
        let off = KeyThrottle::with(0, Duration::from_secs(60), 100);
        let t0 = Instant::now();
        for _ in 0..10 {
            off.failed(A, KeyKind::Peer, t0);
        }
        assert_eq!(off.blocked(A, KeyKind::Peer, t0), None);

        let t = KeyThrottle::with(1, Duration::from_secs(60), 2);
        t.failed(A, KeyKind::Client, t0);
        t.failed(B, KeyKind::Client, t0);
        let c = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 3));
        t.failed(c, KeyKind::Client, t0);
        assert_eq!(t.lock().len(), 2, "full of live entries: new addresses are not tracked");
        // Once the old entries expire, room is made.
        t.failed(c, KeyKind::Client, t0 + Duration::from_secs(61));
        assert!(t.blocked(c, KeyKind::Client, t0 + Duration::from_secs(62)).is_some());
    }
}
