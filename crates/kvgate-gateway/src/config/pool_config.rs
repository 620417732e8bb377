//! The `[[pools]]` section of `GatewayConfig`: one entry per model served.
//! A pool is the engines of one base model (and its LoRA adapters), with
//! its own tokenizer, index view, ledger, calibration and router settings;
//! `model` in a request selects it. Without `[[pools]]` the top-level
//! `model`, `replicas`, `discovery` and `router` are the one pool, named
//! [`DEFAULT_POOL`], so a single-model configuration reads as it always did.

use kvgate_router::RouterConfig;
use serde::{Deserialize, Serialize};

use crate::config::cluster_config::DiscoveryConfig;
use crate::config::model_config::ModelConfig;
use crate::config::replica_config::ReplicaConfig;
use crate::error::ConfigError;

/// The name of the pool a configuration without `[[pools]]` stands for.
pub const DEFAULT_POOL: &str = "default";

/// The most pools one gateway serves.
pub(crate) const MAX_POOLS: usize = 64;

/// One model pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Its name in metrics (`pool` label), `/admin/*`, logs and a replica's
    /// `pool` key; empty takes `model.served_name`.
    pub name: String,
    /// The model: the name engines serve (`served_name`), other names
    /// clients may use for it (`aliases`, rewritten to `served_name` before
    /// forwarding), its tokenizer (`dir`), adapters and limits.
    pub model: ModelConfig,
    /// Its engines.
    pub replicas: Vec<ReplicaConfig>,
    /// Its engines found through DNS.
    pub discovery: DiscoveryConfig,
    /// Its routing settings: the top-level `[router]` table with the keys
    /// of this one laid over it (in a file; `--print-config` shows the
    /// result).
    pub router: RouterConfig,
}

impl PoolConfig {
    /// The name, or the model's when none is given.
    pub fn display_name(&self) -> &str {
        if self.name.is_empty() {
            &self.model.served_name
        } else {
            &self.name
        }
    }

    /// Every name a request's `model` may use to reach this pool: the
    /// served name, the aliases and the declared adapters.
    pub fn model_names(&self) -> impl Iterator<Item = &str> {
        let m = &self.model;
        let loadable = m
            .loadable_adapters
            .iter()
            .map(|e| e.split_once('=').map_or(e.as_str(), |x| x.0.trim()));
        std::iter::once(m.served_name.as_str())
            .chain(m.aliases.iter().map(String::as_str))
            .chain(m.lora_adapters.iter().map(String::as_str))
            .chain(loadable)
    }
}

/// Lays each `[[pools]]` entry's `router` table over the top-level
/// `[router]` (tables merged key by key, any other value replaced), so a
/// pool inherits every routing setting it does not name.
pub(crate) fn inherit_router(doc: &mut toml::Table) {
    let Some(top) = doc.get("router").and_then(toml::Value::as_table).cloned() else { return };
    let Some(pools) = doc.get_mut("pools").and_then(toml::Value::as_array_mut) else { return };
    for pool in pools.iter_mut().filter_map(toml::Value::as_table_mut) {
        let mut merged = top.clone();
        if let Some(own) = pool.get("router").and_then(toml::Value::as_table) {
            merge(&mut merged, own);
        }
        pool.insert("router".into(), toml::Value::Table(merged));
    }
}

fn merge(base: &mut toml::Table, over: &toml::Table) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Pool-level checks: names unique, every model name reaching one pool.
pub(crate) fn validate_pools(pools: &[PoolConfig]) -> Result<(), ConfigError> {
    let bad = |m: String| Err(ConfigError::Invalid(m));
    if pools.len() > MAX_POOLS {
        return bad(format!("{} pools: at most {MAX_POOLS}", pools.len()));
    }
    let mut names = std::collections::HashSet::new();
    let mut models = std::collections::HashMap::new();
    for p in pools {
        let name = p.display_name();
        if name.is_empty() || !names.insert(name) {
            return bad(format!("pools: the name {name:?} is empty or used twice"));
        }
        p.router.validate().map_err(|e| ConfigError::Invalid(format!("pool {name}: {e}")))?;
        p.model.loadable()?;
        if p.model.served_name.is_empty() {
            return bad(format!("pool {name}: model.served_name must not be empty"));
        }
        for m in p.model_names() {
            if m.is_empty() {
                return bad(format!("pool {name}: a model name or adapter is empty"));
            }
            if let Some(other) = models.insert(m, name) {
                return bad(format!(
                    "the model name {m:?} is used twice (pool {other} and pool {name}): \
                     a request's model must select one pool"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GatewayConfig;

    const TWO: &str = r#"
        [router]
        policy = "least_load"
        cost.work_weight = 2.0

        [[pools]]
        name = "qwen"
        model.served_name = "Qwen/Qwen3-0.6B"
        model.aliases = ["qwen"]
        router.cost.decode_step_ms = 7.0

        [[pools]]
        model.served_name = "llama"
        model.lora_adapters = ["sql"]
        router.policy = "kv_aware"
    "#;

    #[test]
    fn pools_inherit_the_top_level_router_key_by_key() {
        let c = GatewayConfig::from_toml_with_overrides(TWO, &[]).unwrap();
        let pools = c.pools();
        assert_eq!(pools.len(), 2);
        let (q, l) = (&pools[0], &pools[1]);
        assert_eq!((q.display_name(), l.display_name()), ("qwen", "llama"));
        assert_eq!(q.router.policy.name(), "least_load");
        assert_eq!((q.router.cost.work_weight, q.router.cost.decode_step_ms), (2.0, 7.0));
        assert_eq!(l.router.policy.name(), "kv_aware");
        assert_eq!(l.router.cost.work_weight, 2.0, "inherited inside a nested table");
        assert_eq!(l.router.cost.decode_step_ms, 10.0, "the default where nobody sets it");
        assert_eq!(q.model_names().collect::<Vec<_>>(), ["Qwen/Qwen3-0.6B", "qwen"]);
        c.validate().unwrap();
    }

    #[test]
    fn no_pools_is_one_default_pool() {
        let c = GatewayConfig::default();
        let pools = c.pools();
        assert_eq!(pools.len(), 1);
        assert_eq!(pools[0].display_name(), DEFAULT_POOL);
        assert_eq!(pools[0].model, c.model);
        assert_eq!(pools[0].router, c.router);
    }

    #[test]
    fn pool_mistakes_are_named() {
        let err = |text: &str| {
            let c = GatewayConfig::from_toml_with_overrides(text, &[]);
            c.and_then(|c| c.validate()).unwrap_err().to_string()
        };
        let twice = "[[pools]]\nmodel.served_name = \"a\"\n[[pools]]\nmodel.served_name = \"b\"\n\
                     model.aliases = [\"a\"]";
        assert!(err(twice).contains("\"a\" is used twice"), "{}", err(twice));
        let same = "[[pools]]\nname = \"x\"\nmodel.served_name = \"a\"\n[[pools]]\nname = \"x\"\n\
                    model.served_name = \"b\"";
        assert!(err(same).contains("used twice"));
        let mixed = "replicas = [{ url = \"http://e:1\" }]\n[[pools]]\nmodel.served_name = \"a\"";
        assert!(err(mixed).contains("inside each pool"), "{}", err(mixed));
        let unknown = "[[pools]]\nmodel.served_name = \"a\"\nweight = 3";
        assert!(err(unknown).contains("weight"));
    }
}
