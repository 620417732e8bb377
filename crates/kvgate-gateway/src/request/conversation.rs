//! Where a Responses API conversation must go, and how its ids leave.
//!
//! A request that continues a stored response (`previous_response_id`), a
//! `GET /v1/responses/{id}` and a cancellation can only be served by the
//! engine holding that response (vLLM's store is its process memory). The
//! id names that replica (`affinity.rs`); this module finds it in the
//! directory and says whether it can still serve: in rotation (the
//! request is pinned to it: every other replica is excluded, so the
//! decision books its load there like any request's), or the
//! conversation's state is out of reach, which is the client's answer,
//! never another replica.

use std::time::Duration;

use kvgate_index::ReplicaId;
use kvgate_openai::ErrorResponse;

use crate::replicas::directory::Directory;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::replica::Replica;
use crate::request::affinity::{AffinityKey, Rewriter};
use crate::request::request_error::{Reason, RequestError};
use kvgate_fleet::{PoolId, Reachable};

/// The replica named `owner` when it can serve a request for a response
/// it holds (`what`, e.g. "previous_response_id 'resp_…'"), in pool
/// `pool` if given; otherwise the error that says why the state is out of
/// reach (boxed: it is large and travels in a `Result`). A draining owner
/// still answers reads (`read_only`: a GET or a cancel, no new work) but
/// takes no new turn.
pub(crate) fn owner(
    replicas: &Directory,
    fleet: &FleetHandle,
    owner: &str,
    pool: Option<PoolId>,
    what: &str,
    read_only: bool,
) -> Result<std::sync::Arc<Replica>, Box<RequestError>> {
    let gone = |why: String| {
        let e = ErrorResponse::not_found(format!(
            "the conversation's state is gone: {what} is held by replica {owner}, which {why}; \
             send the whole conversation as input, without previous_response_id"
        ));
        Box::new(RequestError::new(Reason::NoReplica, e))
    };
    let Some(replica) = replicas.by_name(owner) else {
        return Err(gone("is no longer in this fleet".into()));
    };
    match fleet.reachable(replica.id) {
        Reachable::Up(p) if pool.is_none_or(|want| want == p) => Ok(replica),
        Reachable::Up(_) => {
            let e = ErrorResponse::invalid_request(format!(
                "{what} belongs to another model's conversation (replica {owner})"
            ));
            Err(Box::new(RequestError::new(Reason::Invalid, e)))
        }
        Reachable::Draining(_) if read_only => Ok(replica),
        Reachable::Draining(_) => Err(gone("is being drained".into())),
        Reachable::Gone => Err(gone("is no longer in this fleet".into())),
        Reachable::Down(_, error) => {
            // It may come back with its memory (a failed probe, a blip):
            // worth a retry, unlike a drained or removed replica.
            let e = ErrorResponse::unavailable(format!(
                "{what} is held by replica {owner}, which is out of rotation ({error}); \
                 retry later, or send the whole conversation without previous_response_id"
            ));
            Err(Box::new(
                RequestError::new(Reason::NoReplica, e).retry_after(Duration::from_secs(1)),
            ))
        }
    }
}

/// Every replica but `owner`: the exclusions that pin a request to it.
pub(crate) fn all_but(replicas: &Directory, owner: ReplicaId) -> Vec<ReplicaId> {
    replicas.all().iter().map(|r| r.id).filter(|id| *id != owner).collect()
}

/// The rewriter of an answer from `owner`, knowing the previous
/// response's ids when the request continued one.
pub(crate) fn rewriter(
    key: &AffinityKey,
    owner: &Replica,
    previous: Option<(String, String)>,
) -> Rewriter {
    Rewriter::new(key.clone(), &owner.name, previous)
}
