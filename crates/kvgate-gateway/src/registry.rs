//! Adding, draining and removing replicas, at startup and at runtime: the
//! index, the router and the replica list change together, and each replica
//! gets its event subscriber and monitor tasks.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use kvgate_events::subscriber::SubscriberMetrics;
use tokio::sync::watch;

use crate::config::ReplicaConfig;
use crate::monitor::Prober;
use crate::replica::Replica;
use crate::state::Shared;
use crate::supervise::{self, Task};

/// Registers every entry `cfg` stands for (one per data-parallel rank, see
/// [`ReplicaConfig::ranks`]), all or none.
pub(crate) fn add_ranks(
    shared: &Arc<Shared>,
    cfg: ReplicaConfig,
) -> Result<Vec<Arc<Replica>>, String> {
    let mut added = Vec::new();
    for rank in cfg.ranks()? {
        match add(shared, rank) {
            Ok(r) => added.push(r),
            Err(e) => {
                for r in &added {
                    remove(shared, r);
                }
                return Err(e);
            }
        }
    }
    Ok(added)
}

/// Registers `cfg` and starts its tasks.
pub(crate) fn add(shared: &Arc<Shared>, cfg: ReplicaConfig) -> Result<Arc<Replica>, String> {
    let base = cfg.url.trim_end_matches('/').to_owned();
    let name = cfg.display_name().trim_end_matches('/').to_owned();
    if cfg.block_size != shared.block_size {
        return Err(format!(
            "block_size {} differs from the fleet's {}",
            cfg.block_size, shared.block_size
        ));
    }
    let same = |r: &Replica| (r.base == base && r.config.dp_rank == cfg.dp_rank) || r.name == name;
    if shared.replicas.any(same) {
        return Err(format!("replica {name} is already registered"));
    }
    let route_urls = Replica::parse_route_urls(&base)?;
    let has_events = cfg.events.is_some();
    let rank = cfg.dp_rank.unwrap_or(0);
    let id = shared.fleet.with(|f| f.add(&name, rank, cfg.block_size, has_events))?;
    let (stop, _) = watch::channel(false);
    let replica = Arc::new(Replica {
        id,
        config: cfg,
        name,
        base,
        route_urls,
        events: Arc::new(SubscriberMetrics::default()),
        routed: AtomicU64::new(0),
        stop,
    });
    shared.replicas.add(Arc::clone(&replica));
    let (fleet, metrics) = (&shared.fleet, &shared.metrics);
    if replica.config.events.is_some() {
        let feed_fleet = Arc::clone(fleet);
        supervise::spawn_replica_task(fleet, metrics, &replica, Task::Feed, move |r| {
            crate::feed::run(Arc::clone(&feed_fleet), r)
        });
    }
    let prober = Prober {
        engines: Arc::clone(&shared.engines),
        fleet: Arc::clone(fleet),
        timing: shared.settings.probes,
    };
    supervise::spawn_replica_task(fleet, metrics, &replica, Task::Monitor, move |r| {
        let prober = prober.clone();
        async move {
            crate::monitor::run(prober, r).await;
            Ok(())
        }
    });
    tracing::info!(
        replica = %replica.name,
        events = replica.config.events.as_deref().unwrap_or("none"),
        replay = replica.config.replay.as_deref().unwrap_or("none"),
        passthrough = replica.config.passthrough.name(),
        "replica registered"
    );
    Ok(replica)
}

/// Stops new requests to a replica; in-flight ones finish.
pub(crate) fn drain(shared: &Shared, replica: &Replica) {
    let now = std::time::Instant::now();
    shared.fleet.with(|f| f.set_draining(replica.id, true, now));
    tracing::info!(replica = %replica.name, "replica draining");
}

/// Removes a replica: its tasks stop, its bookings are released and its
/// index entries dropped.
pub(crate) fn remove(shared: &Shared, replica: &Replica) {
    let _ = replica.stop.send(true);
    shared.fleet.with(|f| f.remove(replica.id));
    shared.replicas.remove(replica.id);
    tracing::info!(replica = %replica.name, "replica removed");
}
