//! Adding, draining and removing replicas, at startup and at runtime: the
//! index, the router and the replica list change together, and each replica
//! gets its event subscriber and monitor tasks.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use kvgate_events::subscriber::SubscriberMetrics;
use kvgate_index::ReplicaSpec;
use kvgate_router::ReplicaInfo;
use tokio::sync::watch;

use crate::config::ReplicaConfig;
use crate::locks::{lock, read, write};
use crate::state::{Replica, ReplicaStatus, Shared};
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
    if read(&shared.replicas).iter().any(|r| same(r)) {
        return Err(format!("replica {name} is already registered"));
    }
    let route_urls = Replica::parse_route_urls(&base)?;
    let id = {
        let mut index = write(&shared.index);
        // Bounded from the start; the engine's reported cache size replaces
        // the bound once known (monitor).
        let mut spec = ReplicaSpec::new(name.clone(), cfg.dp_rank.unwrap_or(0), cfg.block_size);
        spec.capacity_blocks = [Some(shared.config.limits.index_blocks_per_tier); 3];
        let id = index.add_replica(spec).map_err(|e| e.to_string())?;
        let mut router = lock(&shared.router);
        if let Err(e) = router.add_replica(id, ReplicaInfo::new(name.clone(), cfg.block_size)) {
            let _ = index.remove_replica(id);
            return Err(e.to_string());
        }
        // Down until its first probe answers.
        let _ = router.set_health(id, kvgate_router::Health::Down);
        id
    };
    let (stop, _) = watch::channel(false);
    let replica = Arc::new(Replica {
        id,
        config: cfg,
        name,
        base,
        route_urls,
        status: Mutex::new(ReplicaStatus::default()),
        events: Arc::new(SubscriberMetrics::default()),
        routed: AtomicU64::new(0),
        stop,
    });
    if replica.config.events.is_none() {
        lock(&replica.status).problem(
            &replica.name,
            "no KV event stream configured (events=tcp://…): routed by load only".into(),
        );
    }
    write(&shared.replicas).push(Arc::clone(&replica));
    if replica.config.events.is_some() {
        supervise::spawn_replica_task(shared, &replica, Task::Feed, crate::feed::run);
    }
    supervise::spawn_replica_task(shared, &replica, Task::Monitor, |s, r| async move {
        crate::monitor::run(s, r).await;
        Ok(())
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
    lock(&replica.status).draining = true;
    shared.sync_health(replica, std::time::Instant::now());
    tracing::info!(replica = %replica.name, "replica draining");
}

/// Removes a replica: its tasks stop, its bookings are released and its
/// index entries dropped.
pub(crate) fn remove(shared: &Shared, replica: &Replica) {
    let _ = replica.stop.send(true);
    {
        let mut index = write(&shared.index);
        let _ = lock(&shared.router).remove_replica(replica.id);
        let _ = index.remove_replica(replica.id);
    }
    write(&shared.replicas).retain(|r| r.id != replica.id);
    tracing::info!(replica = %replica.name, "replica removed");
}
