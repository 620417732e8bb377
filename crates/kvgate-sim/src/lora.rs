//! GPU LoRA adapter slots: which adapters are resident, in LRU order, and
//! what making one resident costs. Sans-IO, like the engine that owns it.
//!
//! vLLM's worker keeps `max_loras` adapters active on the GPU
//! (`vllm/lora/model_manager.py`, `LRUCacheLoRAModelManager.activate_adapter`,
//! driven by `vllm/lora/worker_manager.py`, `LRUCacheWorkerLoRAManager`):
//! every step it activates the adapters of the batch; an adapter already in a
//! slot is only touched (moved to most recently used), one that is not takes
//! a free slot or the least recently used one, and must first be read from
//! disk and copied in. `add_lora` (static `--lora-modules` at startup and
//! `/v1/load_lora_adapter`) activates the adapter the same way.
//!
//! What is left out: vLLM's second, CPU-side LRU of registered adapters
//! (`--max-cpu-loras`, default `max_loras`), so a re-activation always pays
//! the full load; and the order in which vLLM activates a batch's adapters
//! (it iterates a dict, so it can evict an adapter the same batch needs and
//! load it back): here the batch's resident adapters are touched first, so
//! a slot is never taken from an adapter of the batch while another is free.

/// The resident adapters and the load and eviction counts.
#[derive(Clone, Debug)]
pub(crate) struct LoraSlots {
    max_loras: usize,
    /// Resident adapters, least recently used first. `max_loras` is small
    /// (vLLM's default is 1), so a list beats a map here.
    resident: Vec<String>,
    loads: u64,
    evictions: u64,
}

impl LoraSlots {
    pub(crate) fn new(max_loras: u32) -> LoraSlots {
        LoraSlots {
            max_loras: (max_loras as usize).max(1),
            resident: Vec::new(),
            loads: 0,
            evictions: 0,
        }
    }

    /// Makes every adapter of a batch resident and most recently used;
    /// returns how many were loaded (not resident before). A batch with more
    /// adapters than slots cannot come from the scheduler; should one arrive,
    /// the extra adapters still load, each evicting the oldest (thrashing,
    /// counted) rather than failing.
    pub(crate) fn activate(&mut self, batch: &[&str]) -> u32 {
        for name in batch {
            self.touch(name);
        }
        let mut loaded = 0;
        for &name in batch {
            if !self.is_resident(name) {
                self.insert(name, |n| n != name);
                loaded += 1;
            }
        }
        loaded
    }

    /// Makes `name` resident outside a step (vLLM's `add_lora`): true when it
    /// was loaded, false when it was resident already (then only touched).
    pub(crate) fn load(&mut self, name: &str) -> bool {
        if self.touch(name) {
            return false;
        }
        self.insert(name, |_| true);
        true
    }

    /// Frees `name`'s slot (vLLM's `remove_lora`); not an eviction. False
    /// when it held none.
    pub(crate) fn unload(&mut self, name: &str) -> bool {
        let before = self.resident.len();
        self.resident.retain(|n| n != name);
        self.resident.len() != before
    }

    pub(crate) fn is_resident(&self, name: &str) -> bool {
        self.resident.iter().any(|n| n == name)
    }

    /// Resident adapters, least recently used first.
    pub(crate) fn resident(&self) -> &[String] {
        &self.resident
    }

    pub(crate) fn loads(&self) -> u64 {
        self.loads
    }

    pub(crate) fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Moves a resident adapter to most recently used; false if absent.
    fn touch(&mut self, name: &str) -> bool {
        match self.resident.iter().position(|n| n == name) {
            Some(i) => {
                let n = self.resident.remove(i);
                self.resident.push(n);
                true
            }
            None => false,
        }
    }

    /// Loads `name` into a free slot, else evicts the least recently used
    /// adapter that `evictable` allows (else the least recently used one).
    fn insert(&mut self, name: &str, evictable: impl Fn(&str) -> bool) {
        if self.resident.len() >= self.max_loras {
            let victim = self.resident.iter().position(|n| evictable(n)).unwrap_or(0);
            if victim < self.resident.len() {
                self.resident.remove(victim);
                self.evictions += 1;
            }
        }
        self.resident.push(name.to_owned());
        self.loads += 1;
    }
}

/// `loads` adapter loads at `load_ms` each, as step time (loads in one step
/// run one after another, as vLLM's worker activates adapters in a loop).
pub(crate) fn load_time_ms(loads: u32, load_ms: f64) -> f64 {
    f64::from(loads) * load_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_eviction_and_counts() {
        let mut s = LoraSlots::new(2);
        assert_eq!(s.activate(&["a"]), 1);
        assert_eq!(s.activate(&["b"]), 1);
        assert_eq!(s.resident(), ["a", "b"]);
        // Touching a makes b the least recently used.
        assert_eq!(s.activate(&["a"]), 0);
        assert_eq!(s.activate(&["c"]), 1);
        assert_eq!(s.resident(), ["a", "c"]);
        assert_eq!((s.loads(), s.evictions()), (3, 1));
    }

    #[test]
    fn a_batch_never_evicts_its_own_adapters() {
        let mut s = LoraSlots::new(2);
        s.activate(&["a"]);
        s.activate(&["b"]);
        // a is the oldest, but the batch needs it: b goes.
        assert_eq!(s.activate(&["c", "a"]), 1);
        assert!(s.is_resident("a") && s.is_resident("c") && !s.is_resident("b"));
    }

    #[test]
    fn load_and_unload_outside_a_step() {
        let mut s = LoraSlots::new(1);
        assert!(s.load("a"));
        assert!(!s.load("a"));
        assert!(s.load("b"));
        assert_eq!(s.resident(), ["b"]);
        assert_eq!((s.loads(), s.evictions()), (2, 1));
        assert!(s.unload("b"));
        assert!(!s.unload("b"));
        assert_eq!(s.evictions(), 1, "an unload is not an eviction");
        assert_eq!(load_time_ms(3, 50.0), 150.0);
    }
}
