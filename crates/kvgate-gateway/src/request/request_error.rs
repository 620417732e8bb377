//! The request path's one error type. A [`RequestError`] says why
//! ([`Reason`]: one enum for every refusal, retry and broken stream, whose
//! label the metrics use), where the fault lies ([`Source`]), whether
//! another replica might succeed ([`Reason::retryable`]), what it says
//! about the replica ([`RequestError::failure`]), and carries the
//! OpenAI-style body the client gets. `response::answer` is the one place it
//! becomes an HTTP answer and is counted.

use std::time::Duration;

use kvgate_fleet::Failure;
use kvgate_openai::ErrorResponse;

/// Where an error came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The request or its key: the client must change something.
    Client,
    /// An engine failed, stalled or could not be reached.
    Engine,
    /// kvgate itself declined: shutting down, overloaded, no replica free.
    Gateway,
}

impl Source {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Source::Client => "client",
            Source::Engine => "engine",
            Source::Gateway => "gateway",
        }
    }
}

/// Which counter a reason is counted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    /// `kvgate_rejected_total{reason}`: refused before or at routing.
    Rejected,
    /// `kvgate_retries_total{reason}`: an engine failed before the first
    /// byte, and another replica was (or could have been) tried.
    Retry,
    /// `kvgate_stream_errors_total{reason}`: a stream ended early.
    StreamError,
}

/// Why a request was refused, retried or cut short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    AllBusy,
    NoReplica,
    Overloaded,
    ShuttingDown,
    Unauthorized,
    Invalid,
    KeyThrottled,
    PeerUnauthorized,
    Connect,
    Status5xx,
    Timeout,
    Upstream,
    IdleTimeout,
    ClientDisconnect,
    /// The tenant queue's band is full.
    TenantQueueFull,
    /// The tenant has `max_in_flight` requests admitted.
    TenantInFlight,
    /// The tenant's tokens per minute leave no room.
    TenantTokenRate,
    /// The request waited its band's queue TTL.
    QueueExpired,
}

impl Reason {
    pub(crate) const ALL: [Reason; 18] = [
        Reason::AllBusy,
        Reason::NoReplica,
        Reason::Overloaded,
        Reason::ShuttingDown,
        Reason::Unauthorized,
        Reason::Invalid,
        Reason::KeyThrottled,
        Reason::PeerUnauthorized,
        Reason::Connect,
        Reason::Status5xx,
        Reason::Timeout,
        Reason::Upstream,
        Reason::IdleTimeout,
        Reason::ClientDisconnect,
        Reason::TenantQueueFull,
        Reason::TenantInFlight,
        Reason::TenantTokenRate,
        Reason::QueueExpired,
    ];

    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Reason::AllBusy => "all_busy",
            Reason::NoReplica => "no_replica",
            Reason::Overloaded => "overloaded",
            Reason::ShuttingDown => "shutting_down",
            Reason::Unauthorized => "unauthorized",
            Reason::Invalid => "invalid",
            Reason::KeyThrottled => "key_throttled",
            Reason::PeerUnauthorized => "peer_unauthorized",
            Reason::Connect => "connect",
            Reason::Status5xx => "status_5xx",
            Reason::Timeout => "timeout",
            Reason::Upstream => "upstream",
            Reason::IdleTimeout => "idle_timeout",
            Reason::ClientDisconnect => "client_disconnect",
            Reason::TenantQueueFull => "tenant_queue_full",
            Reason::TenantInFlight => "tenant_in_flight_limit",
            Reason::TenantTokenRate => "tenant_token_rate",
            Reason::QueueExpired => "queue_expired",
        }
    }

    pub(crate) fn family(self) -> Family {
        match self {
            Reason::Connect | Reason::Status5xx | Reason::Timeout => Family::Retry,
            Reason::Upstream | Reason::IdleTimeout | Reason::ClientDisconnect => {
                Family::StreamError
            }
            _ => Family::Rejected,
        }
    }

    pub(crate) fn source(self) -> Source {
        match self {
            Reason::Unauthorized
            | Reason::Invalid
            | Reason::KeyThrottled
            | Reason::PeerUnauthorized
            | Reason::ClientDisconnect
            | Reason::TenantInFlight
            | Reason::TenantTokenRate => Source::Client,
            Reason::AllBusy
            | Reason::NoReplica
            | Reason::Overloaded
            | Reason::ShuttingDown
            | Reason::TenantQueueFull
            | Reason::QueueExpired => Source::Gateway,
            Reason::Connect
            | Reason::Status5xx
            | Reason::Timeout
            | Reason::Upstream
            | Reason::IdleTimeout => Source::Engine,
        }
    }

    /// Another replica might succeed where this attempt failed (the engine
    /// failed before any byte reached the client).
    pub(crate) fn retryable(self) -> bool {
        self.family() == Family::Retry
    }
}

/// An error on the request path.
#[derive(Debug)]
pub(crate) struct RequestError {
    pub(crate) reason: Reason,
    /// What the client gets (its status included).
    pub(crate) body: ErrorResponse,
    /// `Retry-After` on the answer, for refusals a client should retry.
    pub(crate) retry_after: Option<Duration>,
    /// What caused it, where something did (an engine's send error, whose
    /// own chain reaches the I/O error): `source()`.
    cause: Option<Box<dyn std::error::Error + Send + Sync>>,
    /// What it says about the replica it came from: [`RequestError::failure`].
    failure: Option<Failure>,
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (HTTP {})", self.reason.label(), self.status())
    }
}

impl std::error::Error for RequestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let e = self.cause.as_deref()?;
        Some(e as &(dyn std::error::Error + 'static))
    }
}

impl RequestError {
    /// An error for `reason`; one whose source is an engine counts as that
    /// replica's failure ([`Failure::Error`]).
    pub(crate) fn new(reason: Reason, body: ErrorResponse) -> RequestError {
        let failure = (reason.source() == Source::Engine).then_some(Failure::Error);
        RequestError { reason, body, retry_after: None, cause: None, failure }
    }

    /// A connection that found nothing listening: the replica is gone, not
    /// slow, and leaves rotation at once ([`Failure::Unreachable`]).
    pub(crate) fn unreachable(mut self) -> RequestError {
        self.failure = Some(Failure::Unreachable);
        self
    }

    /// What this error says about the replica that answered (or did not):
    /// [`Failure::Unreachable`] for a connection that found nothing
    /// listening, [`Failure::Error`] for any other engine failure (5xx,
    /// timeout, a broken or stalled answer), `None` for the client's and
    /// the gateway's own refusals. The request path reports it to the fleet
    /// once, where the attempt ends (`forward::report`, the relay).
    pub(crate) fn failure(&self) -> Option<Failure> {
        self.failure
    }

    /// The error that caused this one.
    pub(crate) fn caused_by(
        mut self,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> RequestError {
        self.cause = Some(Box::new(cause));
        self
    }

    /// This error and each of its causes, `: `-separated (for the log).
    pub(crate) fn chain(&self) -> String {
        with_causes(self)
    }

    /// A tenant queue's refusal: 429 with `Retry-After` over a tenant or
    /// band limit, 503 when the band's queue TTL ran out; the body says
    /// which limit and its numbers.
    pub(crate) fn from_tenant(r: &kvgate_tenants::Rejection) -> RequestError {
        use kvgate_tenants::RejectReason as R;
        let reason = match r.reason() {
            R::QueueFull => Reason::TenantQueueFull,
            R::InFlightLimit => Reason::TenantInFlight,
            R::TokenRate => Reason::TenantTokenRate,
            R::Expired => Reason::QueueExpired,
        };
        let body = match r.status() {
            503 => ErrorResponse::unavailable(r.to_string()),
            _ => ErrorResponse::rate_limited(r.to_string()),
        };
        let e = RequestError::new(reason, body);
        match r.retry_after() {
            Some(after) => e.retry_after(after),
            None => e,
        }
    }

    pub(crate) fn retry_after(mut self, after: Duration) -> RequestError {
        self.retry_after = Some(after);
        self
    }

    pub(crate) fn status(&self) -> u16 {
        self.body.status()
    }
}

/// `e` and each of its causes, `: `-separated, each said once (a send
/// error's own text already names its causes): reqwest's own message says
/// only that sending failed, the reason (refused, a TLS certificate that
/// expired or chains to no trusted CA...) is in its sources.
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_one_label_and_only_engine_failures_before_the_first_byte_retry() {
        let mut labels: Vec<_> = Reason::ALL.iter().map(|r| r.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Reason::ALL.len());
        for r in Reason::ALL {
            assert_eq!(r.retryable(), r.family() == Family::Retry, "{r:?}");
            if r.retryable() {
                assert_eq!(r.source(), Source::Engine, "{r:?}");
            }
        }
        let retry: Vec<_> =
            Reason::ALL.iter().filter(|r| r.retryable()).map(|r| r.label()).collect();
        assert_eq!(retry, ["connect", "status_5xx", "timeout"]);
    }

    #[test]
    fn only_engine_errors_count_against_a_replica_and_only_a_dead_one_is_unreachable() {
        let body = || ErrorResponse::bad_gateway("x");
        for r in Reason::ALL {
            let want = (r.source() == Source::Engine).then_some(Failure::Error);
            assert_eq!(RequestError::new(r, body()).failure(), want, "{r:?}");
        }
        let dead = RequestError::new(Reason::Connect, body()).unreachable();
        assert_eq!(dead.failure(), Some(Failure::Unreachable));
    }

    #[test]
    fn a_cause_is_the_source_and_its_own_causes_follow() {
        #[derive(Debug)]
        struct Send(std::io::Error);
        impl std::fmt::Display for Send {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("send failed")
            }
        }
        impl std::error::Error for Send {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let e = RequestError::new(Reason::Connect, ErrorResponse::bad_gateway("unreachable"))
            .caused_by(Send(io));
        let source = std::error::Error::source(&e).expect("a source");
        assert_eq!(source.to_string(), "send failed");
        let io = source.source().and_then(|s| s.downcast_ref::<std::io::Error>()).expect("io");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
        assert_eq!(e.chain(), "connect (HTTP 502): send failed: reset by peer");
        let plain = RequestError::new(Reason::NoReplica, ErrorResponse::bad_gateway("none"));
        assert!(std::error::Error::source(&plain).is_none());
    }
}
