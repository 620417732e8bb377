//! Why a request is not served, as one value the gateway turns into a
//! response in one place: the status, the `Retry-After` hint and a message
//! that says which limit stood in the way.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A request answered without being served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The band's queue holds `max_queue` requests already (429).
    QueueFull {
        /// The band's name.
        band: Arc<str>,
        /// The band's `max_queue`.
        max_queue: usize,
        /// About how long the band's requests wait at present.
        retry_after: Duration,
    },
    /// The tenant has `max_in_flight` requests admitted and not finished (429).
    InFlightLimit {
        /// The tenant's `max_in_flight`.
        max_in_flight: u32,
        /// A fixed short hint: a slot frees when any request finishes.
        retry_after: Duration,
    },
    /// The tenant's tokens of the last minute, fleet-wide, leave no room
    /// for this request (429).
    TokenRate {
        /// The tenant's `tokens_per_minute`.
        tokens_per_minute: u64,
        /// Tokens counted in the window, all instances together.
        used: u64,
        /// This request's own count (prompt plus output allowance).
        requested: u64,
        /// When enough of the window will have passed.
        retry_after: Duration,
    },
    /// The request waited its band's `queue_ttl_ms` without a replica that
    /// could take it (503).
    Expired {
        /// The band's name.
        band: Arc<str>,
        /// How long it waited.
        waited: Duration,
        /// The band's queue TTL.
        queue_ttl: Duration,
    },
}

/// The reason of a [`Rejection`], without its details: a metrics label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RejectReason {
    /// [`Rejection::QueueFull`].
    QueueFull,
    /// [`Rejection::InFlightLimit`].
    InFlightLimit,
    /// [`Rejection::TokenRate`].
    TokenRate,
    /// [`Rejection::Expired`].
    Expired,
}

impl RejectReason {
    /// Every reason, in label order.
    pub const ALL: [RejectReason; 4] = [
        RejectReason::QueueFull,
        RejectReason::InFlightLimit,
        RejectReason::TokenRate,
        RejectReason::Expired,
    ];

    /// The snake_case label used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::QueueFull => "queue_full",
            RejectReason::InFlightLimit => "in_flight_limit",
            RejectReason::TokenRate => "token_rate",
            RejectReason::Expired => "expired",
        }
    }
}

impl Rejection {
    /// The reason, for counting.
    pub fn reason(&self) -> RejectReason {
        match self {
            Rejection::QueueFull { .. } => RejectReason::QueueFull,
            Rejection::InFlightLimit { .. } => RejectReason::InFlightLimit,
            Rejection::TokenRate { .. } => RejectReason::TokenRate,
            Rejection::Expired { .. } => RejectReason::Expired,
        }
    }

    /// The HTTP status: 429 for a limit, 503 for a queue expiry.
    pub fn status(&self) -> u16 {
        match self {
            Rejection::Expired { .. } => 503,
            _ => 429,
        }
    }

    /// The `Retry-After` hint (the header wants whole seconds, rounded up);
    /// none for an expiry.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Rejection::QueueFull { retry_after, .. }
            | Rejection::InFlightLimit { retry_after, .. }
            | Rejection::TokenRate { retry_after, .. } => Some(*retry_after),
            Rejection::Expired { .. } => None,
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::QueueFull { band, max_queue, .. } => write!(
                f,
                "the queue of priority band {band:?} is full ({max_queue} requests waiting)"
            ),
            Rejection::InFlightLimit { max_in_flight, .. } => {
                write!(f, "the tenant has {max_in_flight} requests in flight, its limit")
            }
            Rejection::TokenRate { tokens_per_minute, used, requested, .. } => write!(
                f,
                "the tenant used {used} of its {tokens_per_minute} tokens per minute; \
                 this request needs {requested} more"
            ),
            Rejection::Expired { band, waited, queue_ttl } => write!(
                f,
                "the request waited {} ms in priority band {band:?} (queue TTL {} ms) \
                 and no replica could take it within the band's TTFT target",
                waited.as_millis(),
                queue_ttl.as_millis()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_hints_and_messages() {
        let full = Rejection::QueueFull {
            band: "batch".into(),
            max_queue: 10,
            retry_after: Duration::from_secs(2),
        };
        assert_eq!(full.status(), 429);
        assert_eq!(full.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(full.reason().as_str(), "queue_full");
        assert!(full.to_string().contains("\"batch\""));
        let expired = Rejection::Expired {
            band: "interactive".into(),
            waited: Duration::from_millis(60_001),
            queue_ttl: Duration::from_secs(60),
        };
        assert_eq!(expired.status(), 503);
        assert_eq!(expired.retry_after(), None);
        assert!(expired.to_string().contains("60001 ms"), "{expired}");
    }
}
