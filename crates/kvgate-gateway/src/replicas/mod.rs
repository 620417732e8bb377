//! The replicas: the registry that adds and removes them, their event feeds, health
//! monitors, metrics scrapes and DNS discovery, the directory, the fleet core's shell
//! (one lock), and the model pools.

pub(crate) mod directory;
pub(crate) mod discovery;
pub(crate) mod feed;
pub(crate) mod fleet_handle;
pub(crate) mod fleet_view;
pub(crate) mod monitor;
pub(crate) mod pool;
pub(crate) mod registry;
pub(crate) mod replica;
pub(crate) mod scrape;
pub(crate) mod supervise;
pub(crate) mod upkeep;
