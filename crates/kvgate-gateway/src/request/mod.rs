//! One request's path: prepare (parse, tokenize, block keys), place (admission, the fleet's
//! decision, P/D plans), send (to an engine, retries before the first byte), relay (the
//! answer streamed back), and what they share (bookings, errors, affinity, traces).

pub(crate) mod adapter_load;
pub(crate) mod admission;
pub(crate) mod affinity;
pub(crate) mod booking;
pub(crate) mod conversation;
pub(crate) mod engine_client;
#[cfg(test)]
pub(crate) mod engine_fake;
pub(crate) mod forward;
pub(crate) mod forwarder;
pub(crate) mod pd_forward;
pub(crate) mod placement;
pub(crate) mod prepare;
pub(crate) mod relay;
pub(crate) mod request_error;
pub(crate) mod response;
pub(crate) mod route;
pub(crate) mod stored_responses;
pub(crate) mod stream_watch;
pub(crate) mod tenant_queue;
pub(crate) mod trace_context;
