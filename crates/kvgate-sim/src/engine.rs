//! The engine: vLLM v1's scheduler loop over the block pool, in virtual time.
//!
//! One [`Engine::step`] is one engine iteration (`vllm/v1/core/sched/scheduler.py`,
//! `Scheduler.schedule` then `update_from_output`):
//!
//! 1. **Running first.** Each running request, oldest first, gets its
//!    remaining tokens (a prefill chunk, or one decode token) capped by the
//!    step's token budget. If its blocks cannot be allocated, the *newest*
//!    running request is preempted (recompute: blocks freed, progress reset,
//!    pushed to the front of the waiting queue) until it fits; if it is itself
//!    the newest, it is preempted and the running pass ends.
//! 2. **Then waiting, FCFS**, only if nothing was preempted this step, while
//!    `max_num_seqs` and the budget allow. A request whose LoRA adapter would
//!    make the batch's distinct adapters exceed `max_loras` is skipped this
//!    step (others behind it may still go) and keeps its place in the queue. Each admitted request first takes
//!    its prefix hit: the longest run of cached GPU blocks from the start, then
//!    CPU-tier blocks continuing it, capped at `num_tokens - 1` tokens
//!    (`kv_cache_manager.get_computed_blocks`: the last token is always
//!    recomputed). Cached tokens cost no budget. If allocation fails, admission
//!    stops for this step.
//! 3. **Allocation** (`allocate_slots`) touches hit blocks, takes new ones from
//!    the free queue (evicting cached ones → `BlockRemoved`, and offloading
//!    them to the CPU tier → CPU `BlockStored`), then registers every block that
//!    the scheduled tokens fill (`cache_full_blocks` → `BlockStored`, chained).
//! 4. **Execution.** A request whose known tokens are all computed samples one
//!    output token: deterministic filler, EOS by a deterministic draw past
//!    `min_tokens` unless `ignore_eos`, `Length` at `max_tokens`. Finished
//!    requests free their blocks tail first (so the tail is evicted first).
//!
//! The step's duration comes from [`crate::TimingModel`], plus `lora_load_ms`
//! for each adapter the batch needs that holds no GPU slot (`lora.rs`); the
//! driver advances its own clock by it. Tokens of a step are produced at `now + duration`.

use std::collections::VecDeque;
use std::time::Duration;

use kvgate_events::{BlockHash, BlockRemoved, BlockStored, Event, Medium};
use rustc_hash::FxHashMap;

use crate::chunks::{Chunk, CpuChunks};
use crate::config::EngineConfig;
use crate::error::SimError;
use crate::hash::{BlockHasher, CacheIdentity, Hash32};
use crate::lora::{load_time_ms, LoraSlots};
use crate::pool::{BlockMeta, CpuTier, GpuPool};
use crate::timing::StepWork;

/// Caller-chosen request identity (the HTTP shell maps its string ids).
pub type RequestId = u64;

/// Output filler tokens cycle through `FILLER_BASE..FILLER_BASE + FILLER_CYCLE`.
pub const FILLER_BASE: u32 = 1000;
/// Length of the filler cycle.
pub const FILLER_CYCLE: u32 = 1000;

/// Why a request stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// Reached `max_tokens`.
    Length,
    /// Emitted EOS.
    Stop,
}

/// One sampled output token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenOutput {
    /// The request.
    pub request_id: RequestId,
    /// The token id.
    pub token: u32,
    /// The request's first output token (its TTFT ends here).
    pub is_first: bool,
    /// Set on the request's last token.
    pub finished: Option<FinishReason>,
    /// Prompt tokens served from cache at first admission (GPU + CPU), as
    /// vLLM reports in `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: u32,
    /// The CPU-tier part of `cached_tokens` (vLLM counts it as an external
    /// KV transfer, the rest as local cache hits).
    pub external_cached_tokens: u32,
}

/// What one step did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepOutput {
    /// How long the step takes; the driver advances its clock by this.
    pub duration: Duration,
    /// Tokens sampled in this step, produced at `now + duration`.
    pub tokens: Vec<TokenOutput>,
    /// KV events caused by this step (and by a preceding prefix-cache reset),
    /// in order: one vLLM event batch.
    pub events: Vec<Event>,
    /// Requests scheduled in this step.
    pub num_scheduled: usize,
    /// Prefill tokens computed in this step.
    pub prefill_tokens: u64,
    /// Sequences that decoded one token in this step.
    pub decode_seqs: usize,
    /// Requests preempted in this step.
    pub preempted: Vec<RequestId>,
    /// Requests moved from waiting to running in this step (first
    /// admissions and re-admissions after preemption), in order: vLLM's
    /// `SCHEDULED` events, timestamped at the step's start.
    pub admitted: Vec<RequestId>,
    /// LoRA adapters this step made resident in a GPU slot (each charged
    /// `lora_load_ms` in `duration`).
    pub lora_loads: u32,
}

/// Counters and gauges, named after vLLM's metrics where one exists.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    /// `vllm:num_requests_running`.
    pub running: usize,
    /// `vllm:num_requests_waiting`.
    pub waiting: usize,
    /// `vllm:kv_cache_usage_perc` (0–1): referenced GPU blocks / all.
    pub kv_usage: f64,
    /// `vllm:prefix_cache_queries_total` (tokens), counted per admission.
    pub prefix_cache_queries: u64,
    /// `vllm:prefix_cache_hits_total` (tokens, GPU hits).
    pub prefix_cache_hits: u64,
    /// `vllm:num_preemptions_total`.
    pub preemptions: u64,
    /// Tokens loaded from the CPU tier (external hits).
    pub external_hit_tokens: u64,
    /// Tokens looked up in the CPU tier (vLLM's connector queries: the
    /// whole prompt of every scheduled request), when there is one.
    pub external_queries: u64,
    /// Blocks loaded from the CPU tier.
    pub external_hit_blocks: u64,
    /// Hashes cached on the GPU.
    pub gpu_cached_blocks: usize,
    /// Hashes held by the CPU tier.
    pub cpu_cached_blocks: usize,
    /// Steps run.
    pub steps: u64,
    /// Requests finished (not aborted).
    pub finished: u64,
    /// Requests aborted.
    pub aborted: u64,
    /// Output tokens produced.
    pub generated_tokens: u64,
    /// Sum of time-to-first-token over first tokens, seconds.
    pub ttft_sum_s: f64,
    /// Number of first tokens.
    pub ttft_count: u64,
    /// LoRA adapters made resident in a GPU slot (by a step, or by
    /// [`Engine::load_lora`]). vLLM exports no such counter.
    pub lora_loads: u64,
    /// Resident adapters pushed out of their slot by another's load.
    pub lora_evictions: u64,
}

#[derive(Clone, Debug)]
struct Request {
    tokens: Vec<u32>,
    /// LoRA adapter and cache salt: part of every block hash and event.
    identity: CacheIdentity,
    hashes: Vec<Hash32>,
    blocks: Vec<u32>,
    num_computed: usize,
    num_cached_blocks: usize,
    /// Chunks of it stored on the chunked CPU tier, from the start.
    offloaded_chunks: usize,
    num_output: u32,
    max_tokens: u32,
    min_tokens: u32,
    ignore_eos: bool,
    arrival: Duration,
    cached_tokens: Option<u32>,
    /// The CPU-tier part of `cached_tokens`.
    external_cached_tokens: u32,
    /// The decode hop of a disaggregated request: its prompt's KV arrives
    /// from a prefill replica, so its first admission computes only the
    /// last token (`set_remote_kv`).
    remote_kv: bool,
    /// The prefill hop of a disaggregated request: its blocks stay
    /// referenced after it finishes, until the decode side has fetched them
    /// (`set_hold_blocks`, `release_held`).
    hold_blocks: bool,
}

/// A simulated vLLM engine. Sans-IO: no clocks, no sockets, no threads.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    block_size: usize,
    hasher: BlockHasher,
    gpu: GpuPool,
    cpu: Option<CpuTier>,
    /// The CPU tier in chunks (`cpu_chunk_blocks`), instead of `cpu`.
    chunks: Option<CpuChunks>,
    requests: FxHashMap<RequestId, Request>,
    running: Vec<RequestId>,
    waiting: VecDeque<RequestId>,
    pending_events: Vec<Event>,
    stats: EngineStats,
    /// GPU LoRA slots (`max_loras`), LRU.
    loras: LoraSlots,
    /// Blocks of finished prefill hops not fetched yet, by request.
    held: FxHashMap<RequestId, Vec<u32>>,
}

/// Where a scheduled request stands in this step.
struct Scheduled {
    id: RequestId,
    num_new: usize,
}

impl Engine {
    /// An engine with empty caches. Fails on an invalid config.
    pub fn new(config: EngineConfig) -> Result<Engine, SimError> {
        config.validate()?;
        let block_size = config.block_size as usize;
        let chunked = config.num_cpu_blocks > 0 && config.cpu_chunk_blocks > 0;
        let cpu = (config.num_cpu_blocks > 0 && !chunked)
            .then(|| CpuTier::new(config.num_cpu_blocks as usize));
        let chunks = chunked.then(|| {
            CpuChunks::new(config.num_cpu_blocks as usize, config.cpu_chunk_blocks as usize)
        });
        Ok(Engine {
            block_size,
            hasher: BlockHasher::new(config.hash_seed, config.hash_bytes),
            // vLLM counts its null block (block 0, never allocated) in
            // `num_gpu_blocks`: one block fewer holds KV.
            gpu: GpuPool::new(
                config.usable_gpu_blocks() as usize,
                block_size,
                config.self_describing_cpu_events && cpu.is_some(),
            ),
            cpu,
            chunks,
            requests: FxHashMap::default(),
            running: Vec::new(),
            waiting: VecDeque::new(),
            pending_events: Vec::new(),
            stats: EngineStats::default(),
            loras: LoraSlots::new(config.max_loras),
            held: FxHashMap::default(),
            config,
        })
    }

    /// The validated config.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues a request at the back of the waiting queue. `now` is its
    /// arrival time (for TTFT stats). `min_tokens` is clamped to `max_tokens`.
    pub fn add_request(
        &mut self,
        id: RequestId,
        prompt_tokens: Vec<u32>,
        max_tokens: u32,
        min_tokens: u32,
        ignore_eos: bool,
        now: Duration,
    ) -> Result<(), SimError> {
        if self.requests.contains_key(&id) {
            return Err(SimError::DuplicateRequest(id));
        }
        if prompt_tokens.is_empty() {
            return Err(SimError::EmptyPrompt(id));
        }
        if max_tokens == 0 {
            return Err(SimError::ZeroMaxTokens(id));
        }
        let tokens = prompt_tokens.len() as u64 + u64::from(max_tokens);
        if tokens > self.config.max_model_len() {
            return Err(SimError::TooLong {
                id,
                tokens,
                max_model_len: self.config.max_model_len(),
            });
        }
        let mut hashes = Vec::with_capacity(prompt_tokens.len() / self.block_size + 1);
        self.hasher.extend_full_blocks(&mut hashes, &prompt_tokens, self.block_size);
        self.requests.insert(
            id,
            Request {
                tokens: prompt_tokens,
                identity: CacheIdentity::default(),
                hashes,
                blocks: Vec::new(),
                num_computed: 0,
                num_cached_blocks: 0,
                offloaded_chunks: 0,
                num_output: 0,
                max_tokens,
                min_tokens: min_tokens.min(max_tokens),
                ignore_eos,
                arrival: now,
                cached_tokens: None,
                external_cached_tokens: 0,
                remote_kv: false,
                hold_blocks: false,
            },
        );
        self.waiting.push_back(id);
        Ok(())
    }

    /// Gives a request just added its LoRA adapter and cache salt, which
    /// vLLM folds into its block hashes: it then shares cached blocks only
    /// with requests of the same identity. Only before its first step.
    pub fn set_identity(&mut self, id: RequestId, identity: CacheIdentity) -> Result<(), SimError> {
        let r = match self.requests.get_mut(&id) {
            Some(r) if r.num_computed == 0 && r.blocks.is_empty() => r,
            _ => return Err(SimError::IdentityFixed(id)),
        };
        r.hashes.clear();
        self.hasher.extend_keyed_blocks(&mut r.hashes, &r.tokens, self.block_size, &identity);
        r.identity = identity;
        Ok(())
    }

    /// Marks a request just added as the decode hop of a disaggregated
    /// request (vLLM's `do_remote_prefill`): at its first admission the
    /// prompt tokens beyond the local prefix hit are loaded from the
    /// prefill replica instead of computed, and only the last prompt token
    /// is recomputed, as vLLM's NIXL connector does. The transfer's time is
    /// the caller's to wait before adding the request. Only before its
    /// first step; a preempted request recomputes everything, as in vLLM.
    pub fn set_remote_kv(&mut self, id: RequestId) -> Result<(), SimError> {
        match self.requests.get_mut(&id) {
            Some(r) if r.num_computed == 0 && r.blocks.is_empty() => {
                r.remote_kv = true;
                Ok(())
            }
            _ => Err(SimError::RoleFixed(id)),
        }
    }

    /// Marks a request just added as the prefill hop of a disaggregated
    /// request (vLLM's `do_remote_decode`): when it finishes, its blocks
    /// stay referenced (vLLM's `delay_free_blocks`) until
    /// [`Engine::release_held`] says the decode side fetched them.
    pub fn set_hold_blocks(&mut self, id: RequestId) -> Result<(), SimError> {
        match self.requests.get_mut(&id) {
            Some(r) => {
                r.hold_blocks = true;
                Ok(())
            }
            None => Err(SimError::RoleFixed(id)),
        }
    }

    /// Prompt tokens of `tokens` (under `identity`) this engine would find
    /// cached at admission now: GPU blocks from the start, then CPU-tier
    /// blocks continuing them, capped so one token is computed. A
    /// disaggregation driver sizes a decode hop's transfer by it (vLLM's
    /// connector pulls only what the decode side lacks).
    pub fn prefix_hit_tokens(&self, tokens: &[u32], identity: &CacheIdentity) -> usize {
        let mut hashes = Vec::with_capacity(tokens.len() / self.block_size + 1);
        self.hasher.extend_keyed_blocks(&mut hashes, tokens, self.block_size, identity);
        let (gpu, cpu) = self.find_prefix_hit(tokens.len(), &hashes);
        (gpu.len() + cpu) * self.block_size
    }

    /// Frees the held blocks of a finished prefill hop (they stay cached);
    /// false if it holds none.
    pub fn release_held(&mut self, id: RequestId) -> bool {
        let Some(blocks) = self.held.remove(&id) else { return false };
        self.gpu.free_blocks(blocks.iter().rev().copied());
        true
    }

    /// Finished prefill hops whose blocks are still held.
    pub fn held_requests(&self) -> usize {
        self.held.len()
    }

    /// Drops a request wherever it is; its blocks are freed (and stay cached).
    /// Returns whether it existed.
    pub fn abort(&mut self, id: RequestId) -> bool {
        self.release_held(id);
        let Some(r) = self.requests.remove(&id) else { return false };
        self.gpu.free_blocks(r.blocks.iter().rev().copied());
        self.running.retain(|&x| x != id);
        self.waiting.retain(|&x| x != id);
        self.stats.aborted += 1;
        true
    }

    /// Whether a step would do anything.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// Prefix hit of a request at its first admission (GPU + CPU tokens), or
    /// `None` if unknown or not admitted yet.
    pub fn request_cached_tokens(&self, id: RequestId) -> Option<u32> {
        self.requests.get(&id).and_then(|r| r.cached_tokens)
    }

    /// Clears the prefix cache (GPU and CPU tiers) and queues `AllCleared` for
    /// the next step's events. Refused (false) while any request is running,
    /// as vLLM refuses while blocks are in use.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if !self.running.is_empty() || !self.gpu.reset() {
            return false;
        }
        if let Some(cpu) = &mut self.cpu {
            cpu.clear();
        }
        if let Some(chunks) = &mut self.chunks {
            chunks.clear();
        }
        for r in self.requests.values_mut() {
            r.num_cached_blocks = 0;
            r.offloaded_chunks = 0;
        }
        self.pending_events.push(Event::AllCleared);
        true
    }

    /// Counters and gauges now.
    pub fn stats(&self) -> EngineStats {
        let mut s = self.stats.clone();
        s.running = self.running.len();
        s.waiting = self.waiting.len();
        s.kv_usage = self.gpu.num_used() as f64 / self.gpu.num_blocks() as f64;
        s.gpu_cached_blocks = self.gpu.num_cached();
        s.cpu_cached_blocks = self.cpu.as_ref().map_or(0, CpuTier::len)
            + self.chunks.as_ref().map_or(0, CpuChunks::len);
        s.lora_loads = self.loras.loads();
        s.lora_evictions = self.loras.evictions();
        s
    }

    /// Makes adapter `name` resident in a GPU slot now, evicting the least
    /// recently used one if the slots are full, as vLLM's `add_lora` does
    /// (static adapters at startup, `/v1/load_lora_adapter`). Counted as a
    /// load unless it was resident already (false). Costs no step time: the
    /// caller waits `lora_load_ms` itself.
    pub fn load_lora(&mut self, name: &str) -> bool {
        self.loras.load(name)
    }

    /// Frees adapter `name`'s GPU slot (vLLM's `remove_lora`); false if it
    /// held none. Requests already queued with it load it again when scheduled.
    pub fn unload_lora(&mut self, name: &str) -> bool {
        self.loras.unload(name)
    }

    /// Adapters resident in GPU slots, least recently used first.
    pub fn resident_loras(&self) -> Vec<String> {
        self.loras.resident().to_vec()
    }

    /// Distinct adapters of the running requests, in running order.
    pub fn running_loras(&self) -> Vec<String> {
        self.distinct_loras(self.running.iter())
    }

    /// Distinct adapters of the waiting requests, in queue order.
    pub fn waiting_loras(&self) -> Vec<String> {
        self.distinct_loras(self.waiting.iter())
    }

    fn distinct_loras<'a>(&self, ids: impl Iterator<Item = &'a RequestId>) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for id in ids {
            let name = self.requests.get(id).and_then(|r| r.identity.lora_name.as_deref());
            if let Some(name) = name {
                if !out.iter().any(|n| n == name) {
                    out.push(name.to_owned());
                }
            }
        }
        out
    }

    /// The GPU-cached block hashes, in published form (for contract tests).
    pub fn gpu_cached_hashes(&self) -> Vec<BlockHash> {
        self.gpu.cached_hashes().map(|h| self.hasher.publish(h)).collect()
    }

    /// The CPU-tier block hashes, in published form.
    pub fn cpu_cached_hashes(&self) -> Vec<BlockHash> {
        let blocks = self.cpu.iter().flat_map(|c| c.keys());
        let chunked = self.chunks.iter().flat_map(|c| c.hashes());
        blocks.chain(chunked).map(|h| self.hasher.publish(h)).collect()
    }

    /// Checks block accounting: reference counts equal the request tables,
    /// free + used = total, the cached map matches the blocks, the CPU tier is
    /// consistent, and waiting requests hold no blocks.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut refs = vec![0u32; self.gpu.num_blocks()];
        for (id, r) in &self.requests {
            let running = self.running.contains(id);
            if !running && !r.blocks.is_empty() {
                return Err(format!("waiting request {id} holds blocks"));
            }
            if r.blocks.len() * self.block_size < r.num_computed {
                return Err(format!("request {id} computed more tokens than its blocks hold"));
            }
            for &b in &r.blocks {
                match refs.get_mut(b as usize) {
                    Some(c) => *c += 1,
                    None => return Err(format!("request {id} holds unknown block {b}")),
                }
            }
        }
        for blocks in self.held.values() {
            for &b in blocks {
                match refs.get_mut(b as usize) {
                    Some(c) => *c += 1,
                    None => return Err(format!("held block {b} unknown")),
                }
            }
        }
        if self.running.len() + self.waiting.len() != self.requests.len() {
            return Err("running + waiting != requests".into());
        }
        if self.running.len() > self.config.max_num_seqs as usize {
            return Err("more running than max_num_seqs".into());
        }
        let max_loras = self.config.max_loras as usize;
        if self.loras.resident().len() > max_loras {
            return Err("more resident adapters than max_loras".into());
        }
        if self.running_loras().len() > max_loras {
            return Err("more distinct adapters running than max_loras".into());
        }
        self.gpu.check(&refs)?;
        if let Some(cpu) = &self.cpu {
            cpu.check()?;
        }
        if let Some(chunks) = &self.chunks {
            chunks.check()?;
        }
        Ok(())
    }

    /// Runs one engine iteration at virtual time `now`.
    pub fn step(&mut self, now: Duration) -> StepOutput {
        let mut out = StepOutput {
            events: std::mem::take(&mut self.pending_events),
            ..StepOutput::default()
        };
        if !self.has_work() {
            return out;
        }
        self.stats.steps += 1;
        let mut budget = self.config.max_num_batched_tokens as usize;
        let mut scheduled: Vec<Scheduled> = Vec::new();
        let mut load_blocks = 0usize;

        // 1. Running requests, oldest first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let Some(r) = self.requests.get(&id) else {
                self.running.remove(i);
                continue;
            };
            let num_new = r.tokens.len().saturating_sub(r.num_computed).min(budget);
            if num_new == 0 {
                i += 1;
                continue;
            }
            let mut fits = true;
            while !self.allocate(id, num_new, &[], 0, 0, &mut out.events) {
                let Some(victim) = self.running.pop() else {
                    fits = false;
                    break;
                };
                self.preempt(victim);
                out.preempted.push(victim);
                if victim == id {
                    fits = false;
                    break;
                }
            }
            if !fits {
                break;
            }
            scheduled.push(Scheduled { id, num_new });
            budget -= num_new;
            i += 1;
        }

        // The adapters of the running requests scheduled so far: vLLM v1
        // collects them after the running pass and admits a waiting request
        // only if its adapter is among them or there is room for one more
        // (`vllm/v1/core/sched/scheduler.py`, `Scheduler.schedule`: a request
        // over the limit is moved aside for this step, not a stop, and the
        // set-aside ones go back to the head of the queue in their order).
        let mut scheduled_loras: Vec<String> = Vec::new();
        for s in &scheduled {
            let name = self.requests.get(&s.id).and_then(|r| r.identity.lora_name.as_ref());
            if let Some(name) = name {
                if !scheduled_loras.contains(name) {
                    scheduled_loras.push(name.clone());
                }
            }
        }
        let max_loras = self.config.max_loras as usize;
        let mut skipped: Vec<RequestId> = Vec::new();

        // 2. Waiting requests, FCFS, unless this step preempted.
        if out.preempted.is_empty() {
            while budget > 0 && self.running.len() < self.config.max_num_seqs as usize {
                let Some(&id) = self.waiting.front() else { break };
                let Some(r) = self.requests.get(&id) else {
                    self.waiting.pop_front();
                    continue;
                };
                if let Some(name) = &r.identity.lora_name {
                    if scheduled_loras.len() >= max_loras && !scheduled_loras.contains(name) {
                        self.waiting.pop_front();
                        skipped.push(id);
                        continue;
                    }
                }
                let (gpu_hits, n_cpu) = self.find_prefix_hit(r.tokens.len(), &r.hashes);
                let hit_tokens = (gpu_hits.len() + n_cpu) * self.block_size;
                // A decode hop loads the rest of its prompt from the
                // prefill replica and computes only its last token.
                let is_remote = r.remote_kv;
                let remote = if is_remote {
                    r.tokens.len().saturating_sub(1).saturating_sub(hit_tokens)
                } else {
                    0
                };
                let num_new = r.tokens.len().saturating_sub(hit_tokens + remote).min(budget);
                let num_tokens = r.tokens.len() as u64;
                // Blocked on memory: stop before loading anything, as vLLM
                // loads a connector's blocks only after `allocate_slots`
                // succeeds. (Touching them first on every blocked step cost
                // O(prompt blocks) per step: a fast-mode replay with a long
                // queue on a full replica spent 98 % of its time there.)
                if !self.fits(id, num_new, &gpu_hits, n_cpu, remote) {
                    break;
                }
                let loaded = r.hashes.get(gpu_hits.len()..gpu_hits.len() + n_cpu);
                for h in loaded.unwrap_or_default() {
                    if let Some(cpu) = &mut self.cpu {
                        cpu.touch(h);
                    }
                    if let Some(chunks) = &mut self.chunks {
                        chunks.touch(h);
                    }
                }
                if !self.allocate(id, num_new, &gpu_hits, n_cpu, remote, &mut out.events) {
                    break;
                }
                // A decode hop's prompt was computed (and counted) on its
                // prefill replica: counting it again here would count
                // every split prompt twice in the fleet's hit rate.
                let counted = if is_remote { 0 } else { 1 };
                self.stats.prefix_cache_queries += num_tokens * counted;
                self.stats.prefix_cache_hits += (gpu_hits.len() * self.block_size) as u64 * counted;
                self.stats.external_hit_blocks += n_cpu as u64;
                self.stats.external_hit_tokens += (n_cpu * self.block_size) as u64;
                if self.cpu.is_some() || self.chunks.is_some() {
                    self.stats.external_queries += num_tokens;
                }
                if let Some(r) = self.requests.get_mut(&id) {
                    // First admission only: vLLM keeps the first scheduling's
                    // hit (`num_cached_tokens`, `prefill_stats`).
                    if r.cached_tokens.is_none() {
                        // Tokens received from a prefill replica count as
                        // external hits, as vLLM counts its connector's loads.
                        r.cached_tokens = Some((hit_tokens + remote) as u32);
                        r.external_cached_tokens = (n_cpu * self.block_size + remote) as u32;
                    }
                    r.remote_kv = false;
                }
                load_blocks += n_cpu;
                self.waiting.pop_front();
                if let Some(name) =
                    self.requests.get(&id).and_then(|r| r.identity.lora_name.as_ref())
                {
                    if !scheduled_loras.contains(name) {
                        scheduled_loras.push(name.clone());
                    }
                }
                self.running.push(id);
                out.admitted.push(id);
                scheduled.push(Scheduled { id, num_new });
                budget -= num_new;
            }
        }
        for id in skipped.into_iter().rev() {
            self.waiting.push_front(id);
        }

        // The batch's adapters take GPU slots; the ones not resident load.
        if !scheduled_loras.is_empty() {
            let batch: Vec<&str> = scheduled_loras.iter().map(String::as_str).collect();
            out.lora_loads = self.loras.activate(&batch);
        }

        // Timing: prefill tokens vs decoding sequences in this batch, and
        // the context each one attends over (`num_computed` is still the
        // count before this step: cached prefix, earlier chunks, outputs).
        let mut work = StepWork::default();
        for s in &scheduled {
            let Some(r) = self.requests.get(&s.id) else { continue };
            let context = r.num_computed as u64;
            let decoding =
                s.num_new == 1 && r.num_output > 0 && r.num_computed + 1 == r.tokens.len();
            if decoding {
                work.decode_seqs += 1;
                work.decode_context_tokens += context;
            } else {
                work.prefill_tokens += s.num_new as u64;
                work.prefill_context_pairs += s.num_new as u64 * context;
            }
        }
        out.prefill_tokens = work.prefill_tokens;
        out.decode_seqs = work.decode_seqs;
        out.num_scheduled = scheduled.len();
        work.kv_fraction = self.gpu.num_used() as f64 / self.gpu.num_blocks() as f64;
        work.extra_ms = load_blocks as f64 * self.config.cpu_load_ms_per_block;
        if out.lora_loads > 0 {
            work.extra_ms += load_time_ms(out.lora_loads, self.config.lora_load_ms);
        }
        out.duration = self.config.timing.step_duration(&work);

        // 3. Execute: advance progress, sample tokens, finish requests.
        let done_at = now.saturating_add(out.duration);
        let mut any_finished = false;
        for s in &scheduled {
            let Some(r) = self.requests.get_mut(&s.id) else { continue };
            r.num_computed += s.num_new;
            if r.num_computed < r.tokens.len() {
                continue;
            }
            let is_first = r.num_output == 0;
            r.num_output += 1;
            let k = r.num_output;
            let eos =
                !r.ignore_eos && k > r.min_tokens && eos_draw(s.id, k, self.config.eos_probability);
            let finished = if eos {
                Some(FinishReason::Stop)
            } else if k >= r.max_tokens {
                Some(FinishReason::Length)
            } else {
                None
            };
            let token =
                if eos { self.config.eos_token_id } else { FILLER_BASE + (k - 1) % FILLER_CYCLE };
            if is_first {
                self.stats.ttft_sum_s += done_at.saturating_sub(r.arrival).as_secs_f64();
                self.stats.ttft_count += 1;
            }
            self.stats.generated_tokens += 1;
            out.tokens.push(TokenOutput {
                request_id: s.id,
                token,
                is_first,
                finished,
                cached_tokens: r.cached_tokens.unwrap_or(0),
                external_cached_tokens: r.external_cached_tokens,
            });
            if finished.is_some() {
                if let Some(r) = self.requests.remove(&s.id) {
                    if r.hold_blocks {
                        self.held.insert(s.id, r.blocks);
                    } else {
                        self.gpu.free_blocks(r.blocks.iter().rev().copied());
                    }
                }
                self.stats.finished += 1;
                any_finished = true;
            } else {
                r.tokens.push(token);
                self.hasher.extend_keyed_blocks(
                    &mut r.hashes,
                    &r.tokens,
                    self.block_size,
                    &r.identity,
                );
            }
        }
        if any_finished {
            let requests = &self.requests;
            self.running.retain(|id| requests.contains_key(id));
        }
        out
    }

    /// Longest cached prefix: GPU blocks from the start, then CPU-tier blocks
    /// continuing it, capped so at least one token is computed.
    fn find_prefix_hit(&self, num_tokens: usize, hashes: &[Hash32]) -> (Vec<u32>, usize) {
        let max_blocks = (num_tokens.saturating_sub(1) / self.block_size).min(hashes.len());
        let mut gpu_hits = Vec::new();
        for h in &hashes[..max_blocks] {
            match self.gpu.lookup(h) {
                Some(b) => gpu_hits.push(b),
                None => break,
            }
        }
        let on_cpu = |h: &Hash32| {
            self.cpu.as_ref().is_some_and(|c| c.contains(h))
                || self.chunks.as_ref().is_some_and(|c| c.contains(h))
        };
        let n_cpu = hashes[gpu_hits.len()..max_blocks].iter().take_while(|h| on_cpu(h)).count();
        (gpu_hits, n_cpu)
    }

    /// Whether [`Engine::allocate`] would find room: the new blocks plus the
    /// hit blocks it takes off the free queue (those no one else holds).
    fn fits(
        &self,
        id: RequestId,
        num_new: usize,
        gpu_hits: &[u32],
        n_cpu: usize,
        remote: usize,
    ) -> bool {
        let Some(r) = self.requests.get(&id) else { return false };
        let (_, _, new_blocks) = slots(self.block_size, r, num_new, gpu_hits.len(), n_cpu, remote);
        let evictable_hits = gpu_hits.iter().filter(|&&b| self.gpu.ref_cnt(b) == 0).count();
        new_blocks + evictable_hits <= self.gpu.num_free()
    }

    /// vLLM's `allocate_slots`: room for `num_new` more tokens after the hits
    /// (GPU hit blocks, `n_cpu` blocks loaded from the CPU tier and `remote`
    /// tokens received from a prefill replica), then registration of every
    /// block the step fills. False, with nothing changed, when the free
    /// queue is too short.
    fn allocate(
        &mut self,
        id: RequestId,
        num_new: usize,
        gpu_hits: &[u32],
        n_cpu: usize,
        remote: usize,
        events: &mut Vec<Event>,
    ) -> bool {
        if !self.fits(id, num_new, gpu_hits, n_cpu, remote) {
            return false;
        }
        let bs = self.block_size;
        let Some(r) = self.requests.get_mut(&id) else { return false };
        let (computed, total, new_blocks) = slots(bs, r, num_new, gpu_hits.len(), n_cpu, remote);
        for &b in gpu_hits {
            self.gpu.touch(b);
            r.blocks.push(b);
        }
        let mut evicted = Vec::new();
        for _ in 0..new_blocks {
            match self.gpu.get_new_block(&mut evicted) {
                Some(b) => r.blocks.push(b),
                None => break,
            }
        }
        r.num_computed = computed;
        emit_evictions(&self.hasher, self.cpu.as_mut(), &self.config, evicted, events);

        // cache_full_blocks: every block the scheduled tokens fill.
        let n_full = total.min(r.tokens.len()) / bs;
        let mut run_start: Option<usize> = None;
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for i in r.num_cached_blocks..n_full.min(r.blocks.len()).min(r.hashes.len()) {
            let b = r.blocks[i];
            let newly = !self.gpu.is_filled(b)
                && self.gpu.register(
                    b,
                    r.hashes[i],
                    i.checked_sub(1).map(|p| r.hashes[p]),
                    &r.tokens[i * bs..(i + 1) * bs],
                );
            match (newly, run_start) {
                (true, None) => run_start = Some(i),
                (false, Some(s)) => {
                    runs.push((s, i));
                    run_start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = run_start {
            runs.push((s, n_full.min(r.blocks.len()).min(r.hashes.len())));
        }
        r.num_cached_blocks = r.num_cached_blocks.max(n_full);
        for (s, e) in runs {
            let mut ev = BlockStored::new(
                r.hashes[s..e].iter().map(|h| self.hasher.publish(h)).collect(),
                s.checked_sub(1).map(|p| self.hasher.publish(&r.hashes[p])),
                r.tokens[s * bs..e * bs].to_vec(),
                self.config.block_size,
            );
            ev.medium = Some(Medium::Gpu);
            if !r.identity.is_plain() {
                // As vLLM 0.33's block pool: the adapter in `lora_name`, and
                // per block what its hash folded in (`to_event_extra_keys`).
                ev.lora_name = r.identity.lora_name.clone();
                ev.extra_keys = Some((s..e).map(|i| r.identity.event_extra_key(i)).collect());
            }
            events.push(Event::Stored(ev));
        }
        if let Some(chunks) = &mut self.chunks {
            // The connector's events follow the KV-cache manager's.
            offload_chunks(
                &self.hasher,
                chunks,
                self.config.self_describing_cpu_events,
                r,
                bs,
                events,
            );
        }
        true
    }

    /// Recompute preemption: free the blocks (tail first), reset progress,
    /// back to the front of the waiting queue.
    fn preempt(&mut self, id: RequestId) {
        if let Some(r) = self.requests.get_mut(&id) {
            self.gpu.free_blocks(r.blocks.iter().rev().copied());
            r.blocks.clear();
            r.num_computed = 0;
            r.num_cached_blocks = 0;
            self.waiting.push_front(id);
            self.stats.preemptions += 1;
        }
    }
}

/// Stores every chunk of `r` computed since the last call on the chunked CPU
/// tier, as vLLM's offloading connector does, with its events: the evicted
/// chunk's removal (all its hashes, or its key in placeholder mode), then
/// the store (all the chunk's hashes with tokens and parent, or the key
/// alone). Chunk stores carry `lora_name` but no extra keys, as vLLM's do.
fn offload_chunks(
    hasher: &BlockHasher,
    chunks: &mut CpuChunks,
    self_describing: bool,
    r: &mut Request,
    bs: usize,
    events: &mut Vec<Event>,
) {
    let n = chunks.blocks_per_chunk();
    while (r.offloaded_chunks + 1) * n <= r.num_cached_blocks.min(r.hashes.len()) {
        let (first, end) = (r.offloaded_chunks * n, (r.offloaded_chunks + 1) * n);
        r.offloaded_chunks += 1;
        let chunk = Chunk {
            hashes: r.hashes[first..end].to_vec(),
            parent: first.checked_sub(1).map(|p| r.hashes[p]),
            tokens: r.tokens[first * bs..end * bs].to_vec(),
        };
        let announced = |c: &Chunk| -> Vec<BlockHash> {
            let hashes =
                if self_describing { &c.hashes[..] } else { &c.hashes[c.hashes.len() - 1..] };
            hashes.iter().map(|h| hasher.publish(h)).collect()
        };
        // The store's event is built first: the tier takes the chunk.
        let mut ev = if self_describing {
            BlockStored::new(
                announced(&chunk),
                chunk.parent.as_ref().map(|p| hasher.publish(p)),
                chunk.tokens.clone(),
                bs as u32,
            )
        } else {
            BlockStored::new(announced(&chunk), None, Vec::new(), 0)
        };
        ev.medium = Some(Medium::Cpu);
        if self_describing {
            ev.lora_name = r.identity.lora_name.clone();
        }
        let (stored, evicted) = chunks.store(chunk);
        if let Some(old) = evicted {
            events.push(Event::Removed(BlockRemoved {
                block_hashes: announced(&old),
                medium: Some(Medium::Cpu),
                group_idx: None,
            }));
        }
        if stored {
            events.push(Event::Stored(ev));
        }
    }
}

/// What `allocate_slots` needs for `num_new` more tokens of `r` after
/// `hits` GPU hit blocks, `n_cpu` CPU-tier blocks and `remote` received
/// tokens: (tokens computed before the step, tokens after it, blocks to
/// take off the free queue). One place for [`Engine::fits`] and
/// [`Engine::allocate`], which must agree.
fn slots(
    bs: usize,
    r: &Request,
    num_new: usize,
    hits: usize,
    n_cpu: usize,
    remote: usize,
) -> (usize, usize, usize) {
    let computed = r.num_computed + (hits + n_cpu) * bs + remote;
    let total = computed + num_new;
    let new_blocks = total.div_ceil(bs).saturating_sub(r.blocks.len() + hits);
    (computed, total, new_blocks)
}

/// `BlockRemoved` (GPU) for evicted cached blocks, then their offload to the
/// CPU tier: CPU `BlockRemoved` for what the tier evicts, CPU `BlockStored`
/// (placeholder or self-describing) for what it gains.
fn emit_evictions(
    hasher: &BlockHasher,
    cpu: Option<&mut CpuTier>,
    config: &EngineConfig,
    evicted: Vec<(BlockMeta, Vec<u32>)>,
    events: &mut Vec<Event>,
) {
    if evicted.is_empty() {
        return;
    }
    let gpu_removed = Event::Removed(BlockRemoved {
        block_hashes: evicted.iter().map(|(m, _)| hasher.publish(&m.hash)).collect(),
        medium: Some(Medium::Gpu),
        group_idx: None,
    });
    let Some(cpu) = cpu else {
        events.push(gpu_removed);
        return;
    };
    // The CPU copy is announced before the GPU block goes, as in vLLM, whose
    // offloading connector has stored a block to CPU by the time the GPU
    // frees it: a subscriber that saw the removal first would have forgotten
    // the hash, and the hash-only CPU placeholder would name nothing.
    for (meta, tokens) in evicted {
        let (new, dropped) = cpu.insert(meta.hash, ());
        let dropped = dropped.map(|(old, ())| old);
        if let Some(old) = dropped {
            events.push(Event::Removed(BlockRemoved {
                block_hashes: vec![hasher.publish(&old)],
                medium: Some(Medium::Cpu),
                group_idx: None,
            }));
        }
        if new {
            let mut ev = if config.self_describing_cpu_events {
                BlockStored::new(
                    vec![hasher.publish(&meta.hash)],
                    meta.parent.as_ref().map(|p| hasher.publish(p)),
                    tokens,
                    config.block_size,
                )
            } else {
                BlockStored::new(vec![hasher.publish(&meta.hash)], None, Vec::new(), 0)
            };
            ev.medium = Some(Medium::Cpu);
            events.push(Event::Stored(ev));
        }
    }
    events.push(gpu_removed);
}

/// Deterministic EOS draw for output token `k` of request `id`: splitmix64
/// of (id, k) mapped to [0, 1) compared with `p`.
fn eos_draw(id: RequestId, k: u32, p: f64) -> bool {
    if p <= 0.0 {
        return false;
    }
    let mut z = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(k);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z >> 11) as f64 / (1u64 << 53) as f64) < p
}

#[cfg(test)]
mod disagg_tests;
#[cfg(test)]
mod lora_tests;
#[cfg(test)]
mod tests;
