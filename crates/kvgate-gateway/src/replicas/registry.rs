//! Adding, draining and removing replicas, at startup and at runtime: the
//! index, the router and the replica list change together, and each replica
//! gets its event subscriber and monitor tasks.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use kvgate_events::subscriber::SubscriberMetrics;
use tokio::sync::watch;

use crate::config::settings::ProbeTiming;
use crate::config::ReplicaConfig;
use crate::observe::metrics::Metrics;
use crate::replicas::directory::Directory;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::monitor::Prober;
use crate::replicas::pool::Pools;
use crate::replicas::replica::Replica;
use crate::replicas::supervise::{self, Task};
use crate::request::engine_client::EngineClient;

/// What registering a replica touches: the fleet and the directory change
/// together, and the new replica's feed and monitor get their handles from
/// here. The admin API and discovery hold this, not the gateway's state.
#[derive(Debug)]
pub(crate) struct Registry {
    pub(crate) fleet: Arc<FleetHandle>,
    pub(crate) replicas: Arc<Directory>,
    /// For each replica's monitor.
    pub(crate) engines: Arc<dyn EngineClient>,
    /// For the supervisor's restart counts.
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) probes: ProbeTiming,
    /// The fleet's one block size: a replica with another is refused.
    pub(crate) block_size: u32,
    /// The pools a replica's `pool` key names.
    pub(crate) pools: Arc<Pools>,
}

impl Registry {
    /// Registers every entry `cfg` stands for (one per data-parallel rank, see
    /// [`ReplicaConfig::ranks`]), all or none.
    pub(crate) fn add_ranks(&self, cfg: ReplicaConfig) -> Result<Vec<Arc<Replica>>, String> {
        let mut added = Vec::new();
        for rank in cfg.ranks()? {
            match self.add(rank) {
                Ok(r) => added.push(r),
                Err(e) => {
                    for r in &added {
                        self.remove(r);
                    }
                    return Err(e);
                }
            }
        }
        Ok(added)
    }

    /// Registers `cfg` and starts its tasks.
    pub(crate) fn add(&self, cfg: ReplicaConfig) -> Result<Arc<Replica>, String> {
        let base = cfg.url.trim_end_matches('/').to_owned();
        let name = cfg.display_name().trim_end_matches('/').to_owned();
        if cfg.block_size != self.block_size {
            return Err(format!(
                "block_size {} differs from the fleet's {}",
                cfg.block_size, self.block_size
            ));
        }
        let Some(pool) = self.pools.by_name(cfg.pool.as_deref()) else {
            return Err(format!("no pool is named {:?}", cfg.pool.as_deref().unwrap_or("")));
        };
        let (pool, pool_name, model) = (pool.id, pool.name.clone(), pool.model.served_name.clone());
        let same =
            |r: &Replica| (r.base == base && r.config.dp_rank == cfg.dp_rank) || r.name == name;
        if self.replicas.any(same) {
            return Err(format!("replica {name} is already registered"));
        }
        let route_urls = Replica::parse_route_urls(&base)?;
        let has_events = cfg.events.is_some();
        let rank = cfg.dp_rank.unwrap_or(0);
        let role = cfg.role;
        let id = self
            .fleet
            .with(|f| f.add_with_role(&name, rank, cfg.block_size, has_events, pool, role))?;
        let (stop, _) = watch::channel(false);
        let replica = Arc::new(Replica {
            id,
            config: cfg,
            name,
            base,
            endpoint: Replica::endpoint_of(&route_urls[0]),
            route_urls,
            events: Arc::new(SubscriberMetrics::default()),
            routed: AtomicU64::new(0),
            stop,
        });
        self.replicas.add(Arc::clone(&replica));
        let (fleet, metrics) = (&self.fleet, &self.metrics);
        if replica.config.events.is_some() {
            let feed_fleet = Arc::clone(fleet);
            supervise::spawn_replica_task(fleet, metrics, &replica, Task::Feed, move |r| {
                crate::replicas::feed::run(Arc::clone(&feed_fleet), r)
            });
        }
        let prober = Prober {
            engines: Arc::clone(&self.engines),
            fleet: Arc::clone(fleet),
            timing: self.probes,
            model,
        };
        supervise::spawn_replica_task(fleet, metrics, &replica, Task::Monitor, move |r| {
            let prober = prober.clone();
            async move {
                crate::replicas::monitor::run(prober, r).await;
                Ok(())
            }
        });
        tracing::info!(
            replica = %replica.name,
            pool = %pool_name,
            events = replica.config.events.as_deref().unwrap_or("none"),
            replay = replica.config.replay.as_deref().unwrap_or("none"),
            passthrough = replica.config.passthrough.name(),
            "replica registered"
        );
        Ok(replica)
    }

    /// Stops new requests to a replica; in-flight ones finish.
    pub(crate) fn drain(&self, replica: &Replica) {
        let now = crate::clock::now();
        self.fleet.with(|f| f.set_draining(replica.id, true, now));
        tracing::info!(replica = %replica.name, "replica draining");
    }

    /// Puts a draining replica back in rotation.
    pub(crate) fn undrain(&self, replica: &Replica, now: std::time::Instant) {
        self.fleet.with(|f| f.set_draining(replica.id, false, now));
    }

    /// Whether `replica` has no request in flight.
    pub(crate) fn idle(&self, replica: &Replica) -> bool {
        self.fleet.with(|f| f.idle(replica.id))
    }

    /// By display name or base URL.
    pub(crate) fn by_name(&self, name: &str) -> Option<Arc<Replica>> {
        self.replicas.by_name(name)
    }

    /// Removes a replica: its tasks stop, its bookings are released and its
    /// index entries dropped.
    pub(crate) fn remove(&self, replica: &Replica) {
        let _ = replica.stop.send(true);
        self.fleet.with(|f| f.remove(replica.id));
        self.replicas.remove(replica.id);
        tracing::info!(replica = %replica.name, "replica removed");
    }
}
