//! The model pools at run time: per pool, its model settings, tokenizer
//! and admission queue (its router lives in the fleet core, `fleet.rs`);
//! and the table from a request's `model` to its pool. A pool waiting for
//! busy replicas holds up only its own arrivals: one queue per pool.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kvgate_openai::ErrorResponse;
use kvgate_tokenize::prefix_cache::PrefixCacheConfig;
use kvgate_tokenize::service::{Tokenize, TokenizeService};
use kvgate_tokenize::ChatTokenizer;

use crate::config::{ModelConfig, PoolConfig};
use crate::error::StartError;
use crate::replicas::fleet_handle::FleetHandle;
use crate::request::adapter_load::LoadCounts;
use crate::request::admission::Admission;
use kvgate_fleet::PoolId;

/// One pool's request-path side.
#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) id: PoolId,
    /// `pool` in metrics, admin and logs.
    pub(crate) name: String,
    pub(crate) model: ModelConfig,
    pub(crate) tokenizer: Arc<TokenizeService>,
    /// Its requests waiting for a replica, first come first served.
    pub(crate) admission: Arc<Admission>,
    /// `model.loadable_adapters`: name → path.
    pub(crate) loadable: HashMap<String, String>,
    /// Its runtime adapter loads.
    pub(crate) loads: LoadCounts,
    /// Its routed prompt tokens (`kvgate_pool_prompt_tokens_total`).
    pub(crate) traffic: PoolTraffic,
    /// Whether it splits requests between prefill and decode replicas (it
    /// has a prefill side, `[disagg]`): fixed at start-up, so the request
    /// path reads it here rather than under the fleet lock.
    pub(crate) disaggregated: bool,
}

impl Pool {
    /// A pool of `model` (validated: its loadable adapters parse).
    pub(crate) fn new(
        id: PoolId,
        name: String,
        model: ModelConfig,
        tokenizer: Arc<TokenizeService>,
        admission: Arc<Admission>,
        disaggregated: bool,
    ) -> Pool {
        let loadable = model
            .loadable()
            .unwrap_or_default()
            .into_iter()
            .map(|(n, p)| (n.to_owned(), p.to_owned()))
            .collect();
        Pool {
            id,
            name,
            model,
            tokenizer,
            admission,
            loadable,
            loads: LoadCounts::default(),
            traffic: PoolTraffic::default(),
            disaggregated,
        }
    }
}

/// A pool's routed prompt tokens and those predicted cached: the per-pool
/// predicted hit rate, set beside the engines' reported one.
#[derive(Debug, Default)]
pub(crate) struct PoolTraffic {
    prompt_tokens: AtomicU64,
    predicted_cached_tokens: AtomicU64,
}

impl PoolTraffic {
    pub(crate) fn add(&self, prompt_tokens: u64, predicted_cached: u64) {
        self.prompt_tokens.fetch_add(prompt_tokens, Ordering::Relaxed);
        self.predicted_cached_tokens.fetch_add(predicted_cached, Ordering::Relaxed);
    }

    /// Routed, predicted cached.
    pub(crate) fn totals(&self) -> [u64; 2] {
        [&self.prompt_tokens, &self.predicted_cached_tokens].map(|c| c.load(Ordering::Relaxed))
    }
}

/// What a configured model name stands for.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Named {
    /// The served name.
    Base,
    /// An alias: forwarded as the served name.
    Alias,
    /// A declared adapter (every replica of the pool serves it), or one
    /// kvgate may load.
    Adapter,
}

/// A request's model, resolved.
#[derive(Debug)]
pub(crate) struct Resolved<'a> {
    pub(crate) pool: &'a Pool,
    /// The adapter it names, if any.
    pub(crate) adapter: Option<String>,
    /// The served name to forward instead of an alias the client used.
    pub(crate) rewrite: Option<&'a str>,
}

/// Every pool, and the model names that reach each.
#[derive(Debug)]
pub(crate) struct Pools {
    pools: Vec<Arc<Pool>>,
    names: HashMap<String, (PoolId, Named)>,
}

impl Pools {
    /// `pools` in pool order (ids are their positions); names were checked
    /// unique by the config's validation.
    pub(crate) fn new(pools: Vec<Arc<Pool>>) -> Pools {
        let mut names = HashMap::new();
        for p in &pools {
            let m = &p.model;
            names.insert(m.served_name.clone(), (p.id, Named::Base));
            for a in &m.aliases {
                names.insert(a.clone(), (p.id, Named::Alias));
            }
            for a in m.lora_adapters.iter().chain(p.loadable.keys()) {
                names.insert(a.clone(), (p.id, Named::Adapter));
            }
        }
        Pools { pools, names }
    }

    pub(crate) fn all(&self) -> &[Arc<Pool>] {
        &self.pools
    }

    pub(crate) fn get(&self, id: PoolId) -> Option<&Arc<Pool>> {
        self.pools.get(id)
    }

    /// The pool named `name` (a replica's `pool` key); `None` is the first.
    pub(crate) fn by_name(&self, name: Option<&str>) -> Option<&Arc<Pool>> {
        match name {
            None => self.pools.first(),
            Some(n) => self.pools.iter().find(|p| p.name == n),
        }
    }

    /// The pool and adapter a request's `model` names: a served name, an
    /// alias, a declared adapter, or an adapter some engine lists (its
    /// replica's pool). No `model` is the first pool's base model, as vLLM
    /// serves a request without one. Anything else is vLLM's 404.
    pub(crate) fn resolve<'a>(
        &'a self,
        model: Option<&str>,
        fleet: &FleetHandle,
    ) -> Result<Resolved<'a>, Box<ErrorResponse>> {
        let (pool, named) = match model {
            None => (0, Named::Base),
            Some(m) => match self.names.get(m) {
                Some(&hit) => hit,
                None => match fleet.adapter_pool(m) {
                    Some(pool) => (pool, Named::Adapter),
                    None => return Err(not_found(m)),
                },
            },
        };
        let Some(pool) = self.pools.get(pool) else { return Err(not_found(model.unwrap_or(""))) };
        Ok(Resolved {
            pool,
            adapter: (named == Named::Adapter).then(|| model.unwrap_or_default().to_owned()),
            rewrite: (named == Named::Alias).then_some(pool.model.served_name.as_str()),
        })
    }
}

/// One tokenizer service per pool, in pool order, each loaded on a thread
/// that exits (so the load's temporaries leave with it). Pools with the same
/// tokenizer settings share one service (and its threads).
pub(crate) fn load_tokenizers(
    pools: &[PoolConfig],
) -> Result<Vec<Arc<TokenizeService>>, StartError> {
    let mut loaded: Vec<(&ModelConfig, Arc<TokenizeService>)> = Vec::new();
    let mut out = Vec::new();
    for p in pools {
        let m = &p.model;
        let same = |o: &ModelConfig| {
            (&o.dir, o.encoder, o.tokenizer_threads, o.prefix_cache_tokens)
                == (&m.dir, m.encoder, m.tokenizer_threads, m.prefix_cache_tokens)
        };
        if let Some((_, t)) = loaded.iter().find(|(o, _)| same(o)) {
            out.push(Arc::clone(t));
            continue;
        }
        let t = Arc::new(load_tokenizer(&p.name, m)?);
        loaded.push((m, Arc::clone(&t)));
        out.push(t);
    }
    Ok(out)
}

fn load_tokenizer(pool: &str, m: &ModelConfig) -> Result<TokenizeService, StartError> {
    let failed = |e: String| StartError::Tokenizer(format!("pool {pool}: {e}"));
    let encoder = m.encoder;
    let tokenizer = kvgate_alloc::on_exiting_thread("kvgate-load", || match &m.dir {
        Some(dir) => ChatTokenizer::from_dir_with(dir, encoder),
        None => ChatTokenizer::bundled_with(encoder),
    })
    .map_err(|e| failed(e.to_string()))?
    .map_err(|e| failed(e.to_string()))?;
    let path = tokenizer.encoder_path();
    match &path.reason {
        None => tracing::info!(pool, encoder = path.name, "tokenizer loaded"),
        Some(why) => tracing::info!(pool, encoder = path.name, reason = %why, "tokenizer loaded"),
    }
    let threads = match m.tokenizer_threads {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n,
    };
    let cache = (m.prefix_cache_tokens > 0).then(|| PrefixCacheConfig {
        max_tokens: m.prefix_cache_tokens,
        ..PrefixCacheConfig::default()
    });
    TokenizeService::new(Tokenize::new(tokenizer, cache), threads)
        .map_err(|e| failed(e.to_string()))
}

/// vLLM's answer to a model it does not serve.
pub(crate) fn not_found(model: &str) -> Box<ErrorResponse> {
    let e = ErrorResponse::not_found(format!("The model `{model}` does not exist."));
    Box::new(e.with_param("model"))
}
