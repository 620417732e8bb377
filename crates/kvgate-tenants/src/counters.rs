//! Every outcome of every request, counted per tenant in a plain struct the
//! gateway copies into its metrics. The counts close: a request that
//! arrived was rejected or admitted, and an admitted one was dispatched,
//! expired, cancelled or is still waiting ([`TenantCounters::balanced`]).

use std::ops::AddAssign;

use crate::rejection::RejectReason;

/// Rejections at admission, by reason (expiries are counted apart).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RejectCounts {
    /// The band's queue was full.
    pub queue_full: u64,
    /// The tenant was at `max_in_flight`.
    pub in_flight_limit: u64,
    /// The tenant was over `tokens_per_minute`.
    pub token_rate: u64,
}

impl RejectCounts {
    /// All rejections at admission.
    pub fn total(&self) -> u64 {
        self.queue_full + self.in_flight_limit + self.token_rate
    }

    /// The count for one reason (expiries are not here: 0).
    pub fn get(&self, reason: RejectReason) -> u64 {
        match reason {
            RejectReason::QueueFull => self.queue_full,
            RejectReason::InFlightLimit => self.in_flight_limit,
            RejectReason::TokenRate => self.token_rate,
            RejectReason::Expired => 0,
        }
    }

    pub(crate) fn count(&mut self, reason: RejectReason) {
        match reason {
            RejectReason::QueueFull => self.queue_full += 1,
            RejectReason::InFlightLimit => self.in_flight_limit += 1,
            RejectReason::TokenRate => self.token_rate += 1,
            RejectReason::Expired => {}
        }
    }
}

/// One tenant's outcomes on this instance since start (gauges as they are now).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantCounters {
    /// Requests offered to `enqueue`.
    pub arrived: u64,
    /// Requests admitted into the queue.
    pub queued: u64,
    /// Rejected at admission, by reason.
    pub rejected: RejectCounts,
    /// Taken from the queue to an engine.
    pub dispatched: u64,
    /// Left the queue after the band's TTL (answered 503).
    pub expired: u64,
    /// Left the queue because the client went away.
    pub cancelled: u64,
    /// Dispatched requests that have finished, however they ended.
    pub finished: u64,
    /// Prompt tokens of dispatched requests (settled with the engine's count).
    pub input_tokens_served: u64,
    /// Output tokens the engines produced for the tenant.
    pub output_tokens_served: u64,
    /// Gauge: requests waiting now.
    pub queue_depth: u64,
    /// Gauge: dispatched and not finished now.
    pub in_flight: u64,
}

impl TenantCounters {
    /// Whether the counts close: arrived = rejected + queued, queued =
    /// dispatched + expired + cancelled + waiting, dispatched = finished +
    /// in flight.
    pub fn balanced(&self) -> bool {
        self.arrived == self.rejected.total() + self.queued
            && self.queued == self.dispatched + self.expired + self.cancelled + self.queue_depth
            && self.dispatched == self.finished + self.in_flight
    }
}

impl AddAssign<&TenantCounters> for TenantCounters {
    fn add_assign(&mut self, o: &TenantCounters) {
        self.arrived += o.arrived;
        self.queued += o.queued;
        self.rejected.queue_full += o.rejected.queue_full;
        self.rejected.in_flight_limit += o.rejected.in_flight_limit;
        self.rejected.token_rate += o.rejected.token_rate;
        self.dispatched += o.dispatched;
        self.expired += o.expired;
        self.cancelled += o.cancelled;
        self.finished += o.finished;
        self.input_tokens_served += o.input_tokens_served;
        self.output_tokens_served += o.output_tokens_served;
        self.queue_depth += o.queue_depth;
        self.in_flight += o.in_flight;
    }
}
