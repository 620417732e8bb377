//! The `approx_prefix` baseline's memory: which tenant (replica) was sent which prompt.
//!
//! SGLang's and vLLM-router's `cache_aware` policy and Ray's `PrefixCacheAffinityRouter` never
//! see KV events. They guess a replica's cache from their own routing history: every routed
//! prompt is remembered under the replica it went to, and a new prompt goes to the replica whose
//! remembered prompts share its longest prefix. This module is that memory, so that kvgate can
//! run the same policy as a baseline against its event-driven index.
//!
//! It is one radix tree over `u32` symbols (characters when the caller has text, token ids
//! otherwise) shared by all tenants. Edges are compressed and split on insert; nodes live in a
//! `Vec` arena with a free list. Each node lists the tenants holding it with the logical tick of
//! their last access. Per tenant the tree is prefix-closed (a tenant holding a node holds all
//! its ancestors), which lets [`ApproxTree::match_per_tenant`] answer every tenant in one walk
//! and lets eviction peel a tenant off from its leaves inwards.
//!
//! A replica's real cache is bounded, so the guess must be too: [`ApproxTree::evict`] trims each
//! tenant to a symbol budget, least recently accessed leaves first, as the engine's LRU would.
//!
//! Tenant ids at or above [`MAX_TENANTS`] are ignored everywhere (inserts are dropped, sizes
//! read zero): the match output is indexed by tenant id, and a stray huge id must not make it
//! allocate gigabytes.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

/// Tenant ids must be below this; larger ids are ignored (see the module docs).
pub(crate) const MAX_TENANTS: u32 = 1 << 16;

/// The root is always arena slot 0; it has an empty edge and no tenants.
const ROOT: usize = 0;

#[derive(Debug, Default)]
struct Node {
    /// Symbols on the edge from the parent; empty only for the root (and freed slots).
    edge: Vec<u32>,
    parent: usize,
    /// `(first symbol of the child's edge, child)`, sorted by symbol. A sorted Vec is smaller
    /// than a map for the usual handful of children and still O(log k) to search.
    children: Vec<(u32, usize)>,
    /// `(tenant, last-access tick)`, sorted by tenant. Empty only for the root and freed slots.
    tenants: Vec<(u32, u64)>,
}

impl Node {
    fn child(&self, first: u32) -> Option<usize> {
        let i = self.children.binary_search_by_key(&first, |&(s, _)| s).ok()?;
        self.children.get(i).map(|&(_, c)| c)
    }

    fn tenant_pos(&self, tenant: u32) -> Result<usize, usize> {
        self.tenants.binary_search_by_key(&tenant, |&(t, _)| t)
    }

    fn holds(&self, tenant: u32) -> bool {
        self.tenant_pos(tenant).is_ok()
    }

    fn tick(&self, tenant: u32) -> u64 {
        self.tenant_pos(tenant).ok().and_then(|i| self.tenants.get(i)).map_or(0, |&(_, k)| k)
    }
}

/// Multi-tenant radix tree of routed prompts; see the module docs.
#[derive(Debug)]
pub(crate) struct ApproxTree {
    nodes: Vec<Node>,
    /// Freed arena slots, reused before the arena grows.
    free: Vec<usize>,
    /// Symbols held per tenant (index = tenant id); its length is [`Self::tenant_bound`].
    sizes: Vec<usize>,
}

impl ApproxTree {
    pub(crate) fn new() -> ApproxTree {
        ApproxTree { nodes: vec![Node::default()], free: Vec::new(), sizes: Vec::new() }
    }

    /// Records that `tenant` was sent `symbols` at logical time `tick` (a monotone counter the
    /// caller supplies). Every node on the path gets `tenant`'s last access set to `tick`.
    /// O(len(symbols) + path nodes × log(tenants per node)).
    pub(crate) fn insert(&mut self, symbols: &[u32], tenant: u32, tick: u64) {
        if tenant >= MAX_TENANTS {
            return;
        }
        let t = tenant as usize;
        if self.sizes.len() <= t {
            self.sizes.resize(t + 1, 0);
        }
        let mut node = ROOT;
        let mut rest = symbols;
        while let Some(&first) = rest.first() {
            let Some(child) = self.nodes[node].child(first) else {
                let leaf = self.alloc(Node {
                    edge: rest.to_vec(),
                    parent: node,
                    children: Vec::new(),
                    tenants: vec![(tenant, tick)],
                });
                let kids = &mut self.nodes[node].children;
                if let Err(i) = kids.binary_search_by_key(&first, |&(s, _)| s) {
                    kids.insert(i, (first, leaf));
                }
                self.sizes[t] += rest.len();
                return;
            };
            let (common, edge_len) = {
                let edge = &self.nodes[child].edge;
                (common_prefix(edge, rest), edge.len())
            };
            let child = if common < edge_len { self.split(child, common) } else { child };
            self.touch(child, tenant, tick);
            rest = rest.get(common..).unwrap_or_default();
            node = child;
        }
    }

    /// For every tenant, the length of the longest prefix of `symbols` shared with that
    /// tenant's remembered prompts. `out` is cleared and resized to [`Self::tenant_bound`]
    /// (index = tenant id); tenants with nothing in common read zero.
    /// One walk down the tree: O(len(symbols) + tenant entries on the path) plus the resize.
    pub(crate) fn match_per_tenant(&self, symbols: &[u32], out: &mut Vec<u32>) {
        out.clear();
        out.resize(self.sizes.len(), 0);
        let mut node = ROOT;
        let mut depth = 0usize;
        while let Some(&first) = symbols.get(depth) {
            let Some(child) = self.nodes[node].child(first) else { break };
            let c = &self.nodes[child];
            let common = common_prefix(&c.edge, symbols.get(depth..).unwrap_or_default());
            depth += common;
            let len = u32::try_from(depth).unwrap_or(u32::MAX);
            // Prefix closure: every tenant here also held the parent, so deeper nodes simply
            // overwrite the shallower lengths.
            for &(t, _) in &c.tenants {
                if let Some(slot) = out.get_mut(t as usize) {
                    *slot = len;
                }
            }
            if common < c.edge.len() {
                break;
            }
            node = child;
        }
    }

    /// Number of symbols (edge lengths summed over the nodes it holds) attributed to `tenant`.
    pub(crate) fn tenant_size(&self, tenant: u32) -> usize {
        self.sizes.get(tenant as usize).copied().unwrap_or(0)
    }

    /// One more than the largest tenant id ever inserted (0 when none was); never shrinks.
    pub(crate) fn tenant_bound(&self) -> usize {
        self.sizes.len()
    }

    /// Forgets `tenant` everywhere (its replica was removed); nodes no tenant holds are freed.
    /// O(nodes the tenant holds, and their children).
    pub(crate) fn remove_tenant(&mut self, tenant: u32) {
        // Pre-order, so in reverse every node comes after its descendants: a node that empties
        // has already lost all its (then empty, freed) children.
        for n in self.tenant_nodes(tenant).into_iter().rev() {
            self.drop_tenant(n, tenant);
        }
    }

    /// LRU eviction. For each tenant `t` (in id order) and while `tenant_size(t)` exceeds
    /// `max_symbols_per_tenant`, removes `t` from its least recently accessed node among those
    /// with no child still held by `t` (so the tree stays prefix-closed); nodes no tenant holds
    /// are freed. Whole nodes go, so a tenant may end a partial edge below the budget.
    /// Returns the symbols evicted. O(n log n) in the nodes held by the over-budget tenants.
    pub(crate) fn evict(&mut self, max_symbols_per_tenant: usize) -> u64 {
        let mut evicted = 0u64;
        for t in 0..self.sizes.len() {
            if self.sizes[t] > max_symbols_per_tenant {
                evicted += self.evict_tenant(t as u32, max_symbols_per_tenant);
            }
        }
        evicted
    }

    /// Live nodes other than the root (0 for an empty tree).
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len() - 1 - self.free.len()
    }

    fn evict_tenant(&mut self, tenant: u32, max: usize) -> u64 {
        let t = tenant as usize;
        let held = self.tenant_nodes(tenant);
        // For each held node, how many of its children `tenant` still holds; a node becomes
        // evictable for `tenant` when that count reaches zero.
        let mut pending: FxHashMap<usize, u32> = FxHashMap::default();
        for &n in &held {
            let p = self.nodes[n].parent;
            if p != ROOT {
                *pending.entry(p).or_insert(0) += 1;
            }
        }
        // Ties in tick break by arena slot, which keeps eviction deterministic.
        let mut heap: BinaryHeap<Reverse<(u64, usize)>> = held
            .iter()
            .filter(|n| !pending.contains_key(n))
            .map(|&n| Reverse((self.nodes[n].tick(tenant), n)))
            .collect();
        let mut evicted = 0u64;
        while self.sizes.get(t).is_some_and(|&s| s > max) {
            let Some(Reverse((_, n))) = heap.pop() else { break };
            let parent = self.nodes[n].parent;
            evicted += self.drop_tenant(n, tenant) as u64;
            if let Some(count) = pending.get_mut(&parent) {
                *count -= 1;
                if *count == 0 {
                    heap.push(Reverse((self.nodes[parent].tick(tenant), parent)));
                }
            }
        }
        evicted
    }

    /// Nodes `tenant` holds, parents before children. Prefix closure lets the walk skip every
    /// subtree whose top `tenant` does not hold.
    fn tenant_nodes(&self, tenant: u32) -> Vec<usize> {
        let mut found = Vec::new();
        let mut stack = vec![ROOT];
        while let Some(n) = stack.pop() {
            for &(_, c) in &self.nodes[n].children {
                if self.nodes[c].holds(tenant) {
                    found.push(c);
                    stack.push(c);
                }
            }
        }
        found
    }

    /// Removes `tenant` from node `n`, freeing `n` if nobody holds it any more. Returns the
    /// symbols `tenant` lost.
    fn drop_tenant(&mut self, n: usize, tenant: u32) -> usize {
        let node = &mut self.nodes[n];
        let Ok(i) = node.tenant_pos(tenant) else { return 0 };
        node.tenants.remove(i);
        let len = node.edge.len();
        // By prefix closure an untenanted node has untenanted, hence already freed, children.
        let freed = node.tenants.is_empty() && node.children.is_empty();
        if let Some(size) = self.sizes.get_mut(tenant as usize) {
            *size = size.saturating_sub(len);
        }
        if freed {
            self.free_node(n);
        }
        len
    }

    /// Sets `tenant`'s last access on `n` to `tick`, adding `tenant` (and the edge to its size)
    /// if it did not hold `n` yet.
    fn touch(&mut self, n: usize, tenant: u32, tick: u64) {
        let node = &mut self.nodes[n];
        match node.tenant_pos(tenant) {
            Ok(i) => node.tenants[i].1 = tick,
            Err(i) => {
                node.tenants.insert(i, (tenant, tick));
                let len = node.edge.len();
                if let Some(size) = self.sizes.get_mut(tenant as usize) {
                    *size += len;
                }
            }
        }
    }

    /// Splits `child`'s edge after `at` symbols (0 < `at` < edge length): a new node takes the
    /// head and `child`'s tenants, and `child` keeps the tail under it. Sizes do not change.
    /// Returns the new node.
    fn split(&mut self, child: usize, at: usize) -> usize {
        let tail = self.nodes[child].edge.split_off(at);
        let Some(&tail_first) = tail.first() else {
            // `at` was not inside the edge: nothing to split (split_off left the edge as is).
            return child;
        };
        let head = std::mem::replace(&mut self.nodes[child].edge, tail);
        let Some(&head_first) = head.first() else {
            self.nodes[child].edge = head;
            return child;
        };
        let parent = self.nodes[child].parent;
        let tenants = self.nodes[child].tenants.clone();
        let mid =
            self.alloc(Node { edge: head, parent, children: vec![(tail_first, child)], tenants });
        self.nodes[child].parent = mid;
        let kids = &mut self.nodes[parent].children;
        if let Ok(i) = kids.binary_search_by_key(&head_first, |&(s, _)| s) {
            kids[i].1 = mid;
        }
        mid
    }

    fn alloc(&mut self, node: Node) -> usize {
        match self.free.pop() {
            Some(n) => {
                self.nodes[n] = node;
                n
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    /// Detaches `n` from its parent and returns its slot (and its buffers) to the free list.
    fn free_node(&mut self, n: usize) {
        if n == ROOT {
            return;
        }
        let node = std::mem::take(&mut self.nodes[n]);
        if let Some(&first) = node.edge.first() {
            let kids = &mut self.nodes[node.parent].children;
            if let Ok(i) = kids.binary_search_by_key(&first, |&(s, _)| s) {
                kids.remove(i);
            }
        }
        self.free.push(n);
    }

    /// Checks every structural invariant; for tests.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let root = &self.nodes[ROOT];
        if !root.edge.is_empty() || !root.tenants.is_empty() {
            return Err("root has an edge or tenants".into());
        }
        let mut sizes = vec![0usize; self.sizes.len()];
        let mut seen = vec![false; self.nodes.len()];
        seen[ROOT] = true;
        let mut reached = 0usize;
        let mut stack = vec![ROOT];
        while let Some(n) = stack.pop() {
            let node = &self.nodes[n];
            if !node.children.windows(2).all(|w| w[0].0 < w[1].0) {
                return Err(format!("node {n}: children not sorted/unique"));
            }
            for &(first, c) in &node.children {
                if c >= self.nodes.len() || seen[c] {
                    return Err(format!("node {n}: child {c} out of range or reached twice"));
                }
                seen[c] = true;
                reached += 1;
                let child = &self.nodes[c];
                if child.parent != n {
                    return Err(format!("node {c}: parent {} but listed under {n}", child.parent));
                }
                if child.edge.first() != Some(&first) {
                    return Err(format!("node {c}: keyed by {first} but edge {:?}", child.edge));
                }
                if child.tenants.is_empty() {
                    return Err(format!("node {c}: live but no tenant holds it"));
                }
                if !child.tenants.windows(2).all(|w| w[0].0 < w[1].0) {
                    return Err(format!("node {c}: tenants not sorted/unique"));
                }
                for &(t, _) in &child.tenants {
                    if n != ROOT && !node.holds(t) {
                        return Err(format!("node {c}: tenant {t} not on parent {n}"));
                    }
                    match sizes.get_mut(t as usize) {
                        Some(s) => *s += child.edge.len(),
                        None => return Err(format!("node {c}: tenant {t} beyond bound")),
                    }
                }
                stack.push(c);
            }
        }
        if reached != self.node_count() {
            return Err(format!("reached {reached} nodes, node_count {}", self.node_count()));
        }
        if self.free.iter().any(|&f| f == ROOT || seen.get(f).copied().unwrap_or(true)) {
            return Err("a free slot is live or out of range".into());
        }
        if sizes != self.sizes {
            return Err(format!("sizes {:?}, recorded {:?}", sizes, self.sizes));
        }
        Ok(())
    }
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;

    fn matches(tree: &ApproxTree, symbols: &[u32]) -> Vec<u32> {
        let mut out = vec![99; 7];
        tree.match_per_tenant(symbols, &mut out);
        out
    }

    fn chars(s: &str) -> Vec<u32> {
        s.chars().map(u32::from).collect()
    }

    #[test]
    fn empty_tree() {
        let mut tree = ApproxTree::new();
        assert_eq!(tree.node_count(), 0);
        assert_eq!(tree.tenant_bound(), 0);
        assert_eq!(matches(&tree, &[1, 2]), Vec::<u32>::new());
        assert_eq!(matches(&tree, &[]), Vec::<u32>::new());
        assert_eq!(tree.tenant_size(0), 0);
        assert_eq!(tree.evict(0), 0);
        tree.remove_tenant(3);
        tree.check_invariants().unwrap();
    }

    #[test]
    fn empty_insert_registers_tenant_only() {
        let mut tree = ApproxTree::new();
        tree.insert(&[], 2, 1);
        assert_eq!(tree.tenant_bound(), 3);
        assert_eq!(tree.node_count(), 0);
        assert_eq!(matches(&tree, &[1]), vec![0, 0, 0]);
        tree.check_invariants().unwrap();
    }

    #[test]
    fn split_on_divergence() {
        let mut tree = ApproxTree::new();
        tree.insert(&chars("hello world"), 0, 1);
        assert_eq!(tree.node_count(), 1);
        tree.insert(&chars("hello there"), 1, 2);
        // "hello " split off, two tails under it.
        assert_eq!(tree.node_count(), 3);
        assert_eq!(tree.tenant_size(0), 11);
        assert_eq!(tree.tenant_size(1), 11);
        assert_eq!(matches(&tree, &chars("hello wo")), vec![8, 6]);
        assert_eq!(matches(&tree, &chars("hello th!")), vec![6, 8]);
        assert_eq!(matches(&tree, &chars("help")), vec![3, 3]);
        assert_eq!(matches(&tree, &chars("x")), vec![0, 0]);
        tree.check_invariants().unwrap();
    }

    #[test]
    fn prefix_of_existing_edge_splits_without_new_leaf() {
        let mut tree = ApproxTree::new();
        tree.insert(&[1, 2, 3, 4], 0, 1);
        tree.insert(&[1, 2], 1, 2);
        assert_eq!(tree.node_count(), 2);
        assert_eq!(tree.tenant_size(0), 4);
        assert_eq!(tree.tenant_size(1), 2);
        assert_eq!(matches(&tree, &[1, 2, 3, 4, 5]), vec![4, 2]);
        // Extending an existing path adds only the new symbols.
        tree.insert(&[1, 2, 3, 4, 5, 6], 0, 3);
        assert_eq!(tree.tenant_size(0), 6);
        assert_eq!(tree.node_count(), 3);
        tree.check_invariants().unwrap();
    }

    #[test]
    fn repeated_insert_is_idempotent_in_size() {
        let mut tree = ApproxTree::new();
        for tick in 0..5 {
            tree.insert(&[7, 8, 9], 0, tick);
        }
        assert_eq!(tree.tenant_size(0), 3);
        assert_eq!(tree.node_count(), 1);
        tree.check_invariants().unwrap();
    }

    #[test]
    fn shared_prefixes_many_tenants() {
        let mut tree = ApproxTree::new();
        tree.insert(&chars("system: be nice. user: hi"), 0, 1);
        tree.insert(&chars("system: be nice. user: bye"), 1, 2);
        tree.insert(&chars("system: be brief."), 2, 3);
        tree.insert(&chars("other"), 5, 4);
        assert_eq!(tree.tenant_bound(), 6);
        assert_eq!(
            matches(&tree, &chars("system: be nice. user: hi there")),
            vec![25, 23, 11, 0, 0, 0]
        );
        assert_eq!(matches(&tree, &chars("oth")), vec![0, 0, 0, 0, 0, 3]);
        tree.check_invariants().unwrap();
    }

    #[test]
    fn remove_tenant_frees_only_its_own_nodes() {
        let mut tree = ApproxTree::new();
        tree.insert(&[1, 2, 3], 0, 1);
        tree.insert(&[1, 2, 4], 1, 2);
        tree.insert(&[9], 0, 3);
        assert_eq!(tree.node_count(), 4);
        tree.remove_tenant(0);
        assert_eq!(tree.tenant_size(0), 0);
        assert_eq!(tree.tenant_size(1), 3);
        // [3] and [9] are gone; [1, 2] and [4] remain for tenant 1.
        assert_eq!(tree.node_count(), 2);
        assert_eq!(matches(&tree, &[1, 2, 3]), vec![0, 2]);
        assert_eq!(matches(&tree, &[9]), vec![0, 0]);
        assert_eq!(tree.tenant_bound(), 2);
        tree.check_invariants().unwrap();
        // Freed slots are reused before the arena grows.
        let arena = tree.nodes.len();
        tree.insert(&[5], 0, 4);
        tree.insert(&[6], 0, 5);
        assert_eq!(tree.nodes.len(), arena);
        tree.remove_tenant(1);
        tree.remove_tenant(0);
        assert_eq!(tree.node_count(), 0);
        tree.check_invariants().unwrap();
    }

    #[test]
    fn eviction_is_lru() {
        let mut tree = ApproxTree::new();
        tree.insert(&[1, 1, 1], 0, 1);
        tree.insert(&[2, 2, 2], 0, 2);
        tree.insert(&[3, 3, 3], 0, 3);
        tree.insert(&[1, 1, 1], 1, 4);
        // Touching [2, 2, 2] again makes [1, 1, 1] and then [3, 3, 3] the oldest.
        tree.insert(&[2, 2], 0, 5);
        assert_eq!(tree.evict(6), 3);
        assert_eq!(tree.tenant_size(0), 6);
        assert_eq!(matches(&tree, &[1, 1, 1]), vec![0, 3]);
        assert_eq!(matches(&tree, &[2, 2, 2]), vec![3, 0]);
        assert_eq!(matches(&tree, &[3, 3, 3]), vec![3, 0]);
        tree.check_invariants().unwrap();
        // The touch split [2, 2, 2]; its tail [2] kept tick 2 and is now the oldest leaf, then
        // [3, 3, 3] goes, leaving the recently touched [2, 2].
        assert_eq!(tree.evict(3), 1 + 3);
        assert_eq!(matches(&tree, &[2, 2, 2]), vec![2, 0]);
        assert_eq!(matches(&tree, &[3, 3, 3]), vec![0, 0]);
        // Tenant 1 was within budget all along.
        assert_eq!(tree.tenant_size(1), 3);
        tree.check_invariants().unwrap();
    }

    #[test]
    fn eviction_peels_leaves_before_their_parents() {
        let mut tree = ApproxTree::new();
        tree.insert(&[1, 2, 3, 4], 0, 1);
        tree.insert(&[1, 2, 5, 6], 0, 2);
        tree.insert(&[1, 2, 7], 1, 3);
        // [1, 2] (tick 2 for tenant 0) has the children [3, 4] (tick 1) and [5, 6] (tick 2).
        assert_eq!(tree.node_count(), 4);
        assert_eq!(tree.evict(4), 2);
        assert_eq!(matches(&tree, &[1, 2, 3, 4]), vec![2, 2]);
        assert_eq!(matches(&tree, &[1, 2, 5, 6]), vec![4, 2]);
        // The shared [1, 2] loses tenant 0 but stays for tenant 1.
        assert_eq!(tree.evict(0), 4 + 3);
        assert_eq!(tree.tenant_size(0), 0);
        assert_eq!(tree.tenant_size(1), 0);
        assert_eq!(tree.node_count(), 0);
        tree.check_invariants().unwrap();
    }

    #[test]
    fn eviction_overshoots_by_at_most_whole_nodes() {
        let mut tree = ApproxTree::new();
        tree.insert(&[1; 10], 0, 1);
        assert_eq!(tree.evict(9), 10);
        assert_eq!(tree.tenant_size(0), 0);
        assert_eq!(tree.node_count(), 0);
        tree.check_invariants().unwrap();
    }

    #[test]
    fn out_of_range_tenants_are_ignored() {
        let mut tree = ApproxTree::new();
        for t in [MAX_TENANTS, 1 << 20, u32::MAX] {
            tree.insert(&[1, 2], t, 1);
            tree.remove_tenant(t);
            assert_eq!(tree.tenant_size(t), 0);
        }
        assert_eq!(tree.tenant_bound(), 0);
        assert_eq!(tree.node_count(), 0);
        tree.insert(&[1, 2], MAX_TENANTS - 1, 2);
        assert_eq!(tree.tenant_bound(), MAX_TENANTS as usize);
        let mut out = Vec::new();
        tree.match_per_tenant(&[1, 2, 3], &mut out);
        assert_eq!(out.len(), MAX_TENANTS as usize);
        assert_eq!(out[MAX_TENANTS as usize - 1], 2);
        tree.check_invariants().unwrap();
    }

    /// Operations for the model test; tenants come from a small range plus out-of-range ids.
    #[derive(Debug, Clone)]
    enum Op {
        Insert(u32, Vec<u32>),
        Remove(u32),
        Evict(usize),
    }

    fn tenant() -> impl Strategy<Value = u32> {
        prop_oneof![8 => 0u32..4, 1 => Just(MAX_TENANTS), 1 => Just(u32::MAX)]
    }

    fn symbols() -> impl Strategy<Value = Vec<u32>> {
        proptest::collection::vec(0u32..3, 0..10)
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            12 => (tenant(), symbols()).prop_map(|(t, s)| Op::Insert(t, s)),
            1 => tenant().prop_map(Op::Remove),
            2 => (0usize..16).prop_map(Op::Evict),
        ]
    }

    /// What the tree should remember. Entries inserted before the latest eviction may or may
    /// not survive it, so the model gives a lower bound (`sure`) and an upper bound (all).
    #[derive(Default)]
    struct Model {
        entries: Vec<(u32, Vec<u32>, bool)>,
        bound: usize,
    }

    impl Model {
        fn longest(&self, tenant: u32, probe: &[u32], only_sure: bool) -> u32 {
            self.entries
                .iter()
                .filter(|(t, _, sure)| *t == tenant && (*sure || !only_sure))
                .map(|(_, s, _)| common_prefix(s, probe) as u32)
                .max()
                .unwrap_or(0)
        }

        /// Distinct non-empty prefixes: each is one symbol on one edge of the tree.
        fn size(&self, tenant: u32, only_sure: bool) -> usize {
            let mut prefixes = HashSet::new();
            for (_, s, _) in
                self.entries.iter().filter(|(t, _, sure)| *t == tenant && (*sure || !only_sure))
            {
                for k in 1..=s.len() {
                    prefixes.insert(&s[..k]);
                }
            }
            prefixes.len()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn agrees_with_naive_model(
            ops in proptest::collection::vec(op(), 1..60),
            probes in proptest::collection::vec(symbols(), 1..6),
        ) {
            let mut tree = ApproxTree::new();
            let mut model = Model::default();
            let mut out = Vec::new();
            for (tick, op) in ops.iter().enumerate() {
                let mut evict_bound = None;
                match op {
                    Op::Insert(t, s) => {
                        tree.insert(s, *t, tick as u64);
                        if *t < MAX_TENANTS {
                            model.entries.push((*t, s.clone(), true));
                            model.bound = model.bound.max(*t as usize + 1);
                        }
                    }
                    Op::Remove(t) => {
                        tree.remove_tenant(*t);
                        model.entries.retain(|(u, _, _)| u != t);
                    }
                    Op::Evict(max) => {
                        let before: usize = (0..4).map(|t| tree.tenant_size(t)).sum();
                        let evicted = tree.evict(*max);
                        let after: usize = (0..4).map(|t| tree.tenant_size(t)).sum();
                        prop_assert_eq!(evicted, (before - after) as u64);
                        for e in &mut model.entries {
                            e.2 = false;
                        }
                        evict_bound = Some(*max);
                    }
                }
                tree.check_invariants().map_err(TestCaseError::fail)?;
                prop_assert_eq!(tree.tenant_bound(), model.bound);
                for t in 0..4u32 {
                    let size = tree.tenant_size(t);
                    prop_assert!(model.size(t, true) <= size && size <= model.size(t, false));
                    if let Some(max) = evict_bound {
                        prop_assert!(size <= max);
                    }
                }
                let last = match op { Op::Insert(_, s) => Some(s), _ => None };
                for probe in probes.iter().chain(last) {
                    tree.match_per_tenant(probe, &mut out);
                    prop_assert_eq!(out.len(), model.bound);
                    for (t, &got) in out.iter().enumerate() {
                        let t = t as u32;
                        let lo = model.longest(t, probe, true);
                        let hi = model.longest(t, probe, false);
                        prop_assert!(lo <= got && got <= hi, "tenant {} probe {:?}: {} not in {}..={}", t, probe, got, lo, hi);
                    }
                }
            }
        }
    }
}
