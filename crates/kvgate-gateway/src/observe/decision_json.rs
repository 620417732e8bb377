//! Routing decisions as JSON, replica ids turned into names: what
//! `/admin/decisions` answers and what the dashboard's decision list shows.
//! A request that waited in its pool's tenant queue carries `tenant`: its
//! name, how long it waited and why (`fair_share`, `higher_band`, `busy`).
//! It lives apart from both so that neither imports the other.

use std::time::Instant;

use kvgate_router::{Explanation, Reason};
use serde_json::{json, Value};

use crate::replicas::directory::Directory;
use crate::replicas::fleet_view::FleetView;

fn reason_json(r: &Reason) -> Value {
    match r {
        Reason::NearTie { among } => json!({"kind": r.label(), "among": among}),
        Reason::ApproxMatch { matched } => json!({"kind": r.label(), "matched": matched}),
        _ => json!({"kind": r.label()}),
    }
}

/// One explanation as JSON, replica ids turned into names.
pub(crate) fn explanation_json(replicas: &Directory, e: &Explanation, now: Instant) -> Value {
    let name = |id| replicas.get(id).map_or_else(|| format!("#{}", id.0), |r| r.name.clone());
    let candidates: Vec<Value> = e
        .candidates
        .iter()
        .map(|c| {
            json!({
                "replica": name(c.replica),
                "health": c.health.name(),
                "busy": c.busy,
                "overlap_blocks": {"gpu": c.overlap_blocks[0], "cpu": c.overlap_blocks[1], "storage": c.overlap_blocks[2]},
                "tentative_blocks": c.tentative_blocks,
                "pending_prefill_tokens": c.pending_prefill_tokens,
                "decoding": c.decoding,
                "requests": c.requests,
                "predicted_ttft_s": c.predicted_ttft_s,
                "score": c.score,
            })
        })
        .collect();
    json!({
        "age_s": now.saturating_duration_since(e.at).as_secs_f64(),
        "booking": e.booking,
        "policy": e.policy.name(),
        "prompt_tokens": e.prompt_tokens,
        "prompt_blocks": e.prompt_blocks,
        "candidates_total": e.candidates_total,
        "chosen": e.chosen.map(name),
        "reason": reason_json(&e.reason),
        "candidates": candidates,
    })
}

/// The last `limit` decisions as JSON, newest first (`/admin/decisions` and
/// the dashboard).
pub(crate) fn recent_decisions_json(view: &FleetView, limit: usize, now: Instant) -> Vec<Value> {
    // Every pool's log, merged newest first.
    let mut recent: Vec<_> = view.fleet.with(|f| {
        let logs = f.routers().iter();
        logs.flat_map(|r| r.recent_decisions().rev().take(limit).cloned()).collect()
    });
    recent.sort_by_key(|e| std::cmp::Reverse(e.at));
    recent.truncate(limit);
    // Taken after the fleet lock is given back (a tenant queue's locks come
    // before it, never under it).
    let queues: Vec<_> =
        view.pools.all().iter().filter_map(|p| p.admission.tenants().cloned()).collect();
    let tenant_of = |booking: Option<u64>| {
        let b = booking?;
        let d = queues.iter().find_map(|q| q.note_of(b))?;
        let why = d.why.label();
        Some(json!({"name": d.tenant, "waited_s": d.waited.as_secs_f64(), "waited_for": why}))
    };
    let mut out = Vec::with_capacity(recent.len());
    for e in &recent {
        let mut v = explanation_json(&view.replicas, e, now);
        if let (Some(t), Some(o)) = (tenant_of(e.booking), v.as_object_mut()) {
            o.insert("tenant".to_owned(), t);
        }
        out.push(v);
    }
    out
}
