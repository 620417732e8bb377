//! Turning scores into one choice without herding: ties and near-ties
//! rotate (or are drawn at random), so a burst of identical requests spreads
//! over equally good replicas instead of piling onto the first.

use std::cmp::Ordering;

use rand::rngs::SmallRng;
use rand::Rng;

use crate::config::Selection;
use crate::explain::Reason;

/// Picks among `costs` (index, cost), lowest is best. `None` when empty.
/// `order(index)` orders near-ties for `Selection::Rotate` and
/// `Selection::Balance`, smallest first: (recent work, last chosen);
/// `Rotate` ignores the work unless the request is fresh (below).
/// `cached(index)` is the prefix a candidate already
/// holds: near-ties are only those that hold the most of it among the
/// near band, so a replica that would recompute a prefix another one holds
/// is chosen only when it is clearly cheaper, never by rotation. With no
/// reuse every candidate holds the same (nothing), and near-ties rotate
/// over all of them.
///
/// A *fresh* request is one no candidate holds any of. It has nothing to
/// stick to, so what its placement decides is where the session it may
/// start will grow: its near-ties are those within `band.fresh` of the best
/// (not `band.epsilon`), ordered by recent work for both `Rotate` and
/// `Balance`, so new sessions spread by the work routed to each replica,
/// not by the instantaneous queue alone.
pub(crate) fn pick_cost(
    costs: &[(usize, f64)],
    selection: Selection,
    band: Band,
    temperature: f64,
    rng: &mut SmallRng,
    order: impl Fn(usize) -> (f64, u64),
    cached: impl Fn(usize) -> u32,
) -> Option<(usize, Reason)> {
    let best = costs.iter().map(|c| c.1).fold(f64::INFINITY, f64::min);
    if !best.is_finite() {
        return None;
    }
    if costs.len() == 1 {
        return Some((costs[0].0, Reason::Only));
    }
    match selection {
        Selection::Epsilon | Selection::Rotate | Selection::Balance => {
            let fresh_band = band.fresh.filter(|_| {
                selection != Selection::Epsilon && costs.iter().all(|c| cached(c.0) == 0)
            });
            let by_work = fresh_band.is_some() || selection == Selection::Balance;
            let epsilon = fresh_band.unwrap_or(band.epsilon);
            // A tiny absolute slack keeps exact ties (zero costs) a tie.
            let band = best + best.abs() * epsilon + 1e-12;
            let most = costs.iter().filter(|c| c.1 <= band).map(|c| cached(c.0)).max()?;
            let mut near = costs.iter().filter(|c| c.1 <= band && cached(c.0) == most);
            let n = near.clone().count();
            let chosen = if selection == Selection::Epsilon {
                near.nth(rng.random_range(0..n.max(1)))
            } else {
                near.min_by(|a, b| {
                    let (a, b) = (order(a.0), order(b.0));
                    let work = if by_work { a.0.total_cmp(&b.0) } else { Ordering::Equal };
                    work.then(a.1.cmp(&b.1))
                })
            }?
            .0;
            let reason =
                if n == 1 { Reason::LowestCost } else { Reason::NearTie { among: n as u32 } };
            Some((chosen, reason))
        }
        Selection::Softmax => {
            let scale = (temperature * best.abs()).max(1e-9);
            let weight = |c: f64| (-(c - best) / scale).exp();
            let total: f64 = costs.iter().map(|c| weight(c.1)).sum();
            let mut x = rng.random::<f64>() * total;
            for c in costs {
                x -= weight(c.1);
                if x <= 0.0 {
                    return Some((c.0, Reason::Softmax));
                }
            }
            costs.last().map(|c| (c.0, Reason::Softmax))
        }
    }
}

/// The relative cost bands treated as a tie: `epsilon` for requests some
/// candidate holds part of, `fresh` for those none does (`None`: this
/// request is never treated as fresh).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Band {
    pub(crate) epsilon: f64,
    pub(crate) fresh: Option<f64>,
}

impl Band {
    /// One band for both kinds of request.
    #[cfg(test)]
    pub(crate) fn same(epsilon: f64) -> Band {
        Band { epsilon, fresh: Some(epsilon) }
    }
}

/// The minimum of integer scores, ties broken uniformly.
pub(crate) fn pick_min<T: Ord + Copy>(items: &[(usize, T)], rng: &mut SmallRng) -> Option<usize> {
    let best = items.iter().map(|c| c.1).min()?;
    let n = items.iter().filter(|c| c.1 == best).count();
    let k = rng.random_range(0..n);
    items.iter().filter(|c| c.1 == best).nth(k).map(|c| c.0)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    /// `Selection::Rotate` with recency `last` and holdings `cached`
    /// (none: nothing held anywhere).
    fn rotate(costs: &[(usize, f64)], eps: f64, last: &[u64], cached: &[u32]) -> (usize, Reason) {
        let mut rng = SmallRng::seed_from_u64(1);
        let held = |i: usize| cached.get(i).copied().unwrap_or(0);
        pick_cost(
            costs,
            Selection::Rotate,
            Band::same(eps),
            0.1,
            &mut rng,
            |i| (0.0, last[i]),
            held,
        )
        .unwrap()
    }

    /// `selection` within one band `eps`, near-ties unordered and nothing held.
    fn plain(
        costs: &[(usize, f64)],
        sel: Selection,
        eps: f64,
        rng: &mut SmallRng,
    ) -> Option<(usize, Reason)> {
        pick_cost(costs, sel, Band::same(eps), 0.1, rng, |_| (0.0, 0), |_| 0)
    }

    #[test]
    fn epsilon_band_spreads_near_ties_and_keeps_clear_winners() {
        let mut rng = SmallRng::seed_from_u64(1);
        let costs = [(0, 1.0), (1, 1.01), (2, 2.0)];
        let mut seen = [0; 3];
        for _ in 0..1000 {
            let (i, _) = plain(&costs, Selection::Epsilon, 0.05, &mut rng).unwrap();
            seen[i] += 1;
        }
        assert_eq!(seen[2], 0);
        assert!(seen[0] > 400 && seen[1] > 400, "{seen:?}");
        let (i, r) = plain(&costs, Selection::Epsilon, 0.0, &mut rng).unwrap();
        assert_eq!((i, r), (0, Reason::LowestCost));
    }

    #[test]
    fn softmax_prefers_cheaper_but_not_always() {
        let mut rng = SmallRng::seed_from_u64(2);
        let costs = [(0, 1.0), (1, 1.1)];
        let mut seen = [0; 2];
        for _ in 0..2000 {
            seen[plain(&costs, Selection::Softmax, 0.0, &mut rng).unwrap().0] += 1;
        }
        assert!(seen[0] > seen[1] && seen[1] > 200, "{seen:?}");
    }

    #[test]
    fn integer_ties_are_random() {
        let mut rng = SmallRng::seed_from_u64(3);
        let items = [(0, 5u64), (1, 3), (2, 3)];
        let mut seen = [0; 3];
        for _ in 0..400 {
            seen[pick_min(&items, &mut rng).unwrap()] += 1;
        }
        assert_eq!(seen[0], 0);
        assert!(seen[1] > 100 && seen[2] > 100);
        assert_eq!(plain(&[], Selection::Epsilon, 0.1, &mut rng), None);
    }

    #[test]
    fn rotate_takes_the_near_tie_chosen_longest_ago() {
        let costs = [(0, 1.0), (1, 1.01), (2, 2.0), (3, 1.02)];
        let mut last = [0u64; 4];
        let mut seen = Vec::new();
        for n in 1..=6 {
            let (i, _) = rotate(&costs, 0.05, &last, &[]);
            last[i] = n;
            seen.push(i);
        }
        // Never the clear loser; the three near-ties in turn.
        assert_eq!(seen, [0, 1, 3, 0, 1, 3]);
        let (i, r) = rotate(&costs, 0.0, &last, &[]);
        assert_eq!((i, r), (0, Reason::LowestCost));
    }

    /// The case of the live bench's `prefix_repetition` at 20 req/s: the
    /// replica holding a prefix (still prefilling the request that brought
    /// it) and an idle one cost within the band; rotation took the idle one
    /// and the prefix was computed twice. Near-ties are only those holding
    /// the most of the prefix; a clearly cheaper cold replica still wins.
    #[test]
    fn near_ties_do_not_rotate_to_a_replica_that_would_recompute() {
        let cached = [192u32, 0, 0, 0];
        let costs = [(0, 0.245), (1, 0.2285), (2, 1.0), (3, 1.0)];
        let last = [4u64, 0, 1, 2];
        let (i, r) = rotate(&costs, 0.1, &last, &cached);
        assert_eq!((i, r), (0, Reason::LowestCost));
        // Outside the band the cold replica is cheaper by more than 10 %: it wins.
        let costs = [(0, 0.30), (1, 0.2285), (2, 1.0), (3, 1.0)];
        let (i, _) = rotate(&costs, 0.1, &last, &cached);
        assert_eq!(i, 1);
        // Equal holdings (no reuse): near-ties rotate as before.
        let costs = [(0, 1.0), (1, 1.01), (2, 1.02), (3, 2.0)];
        let (i, _) = rotate(&costs, 0.1, &last, &[]);
        assert_eq!(i, 1);
    }

    /// The choice of `selection` within `band` among `costs`, near-ties
    /// ordered by (`work`, `last`), `held` the prefix each candidate holds.
    fn pick_with(
        sel: Selection,
        band: Band,
        costs: &[(usize, f64)],
        work: &[f64],
        last: &[u64],
        held: &[u32],
    ) -> usize {
        let mut rng = SmallRng::seed_from_u64(1);
        pick_cost(costs, sel, band, 0.1, &mut rng, |i| (work[i], last[i]), |i| held[i]).unwrap().0
    }

    /// `balance` orders near-ties by recent work first: on requests of
    /// unequal size a count rotation hands the replica that just took a
    /// long prompt its next turn anyway; by work it waits until the others
    /// caught up. Exact work ties fall back to the rotation.
    #[test]
    fn balance_takes_the_near_tie_given_the_least_work() {
        let costs = [(0, 1.0), (1, 1.01), (2, 1.02), (3, 2.0)];
        let last = [1u64, 2, 3, 0];
        let work = [9000.0, 1000.0, 1000.0, 0.0];
        // Every candidate holds a little of the prompt: not fresh.
        let held = [1u32; 4];
        let pick = |sel| pick_with(sel, Band::same(0.1), &costs, &work, &last, &held);
        assert_eq!(pick(Selection::Balance), 1, "least work, then longest ago");
        assert_eq!(pick(Selection::Rotate), 0, "rotate ignores work");
        // The clear loser stays out, however little work it was given.
        assert_ne!(pick(Selection::Balance), 3);
    }

    /// A fresh request (no candidate holds any of it) under `rotate` takes
    /// the near-tie within the fresh band given the least recent work; one
    /// that some candidate holds part of is still chosen by recency within
    /// `epsilon`, work ignored.
    #[test]
    fn fresh_requests_take_the_near_tie_given_the_least_work() {
        let costs = [(0, 1.0), (1, 1.05), (2, 1.25), (3, 2.0)];
        let last = [1u64, 2, 3, 0];
        let work = [9000.0, 5000.0, 1000.0, 0.0];
        let band = Band { epsilon: 0.1, fresh: Some(0.3) };
        let pick =
            |band, held: &[u32]| pick_with(Selection::Rotate, band, &costs, &work, &last, held);
        // Fresh: replica 2 is within 30 % and was given the least work;
        // replica 3, twice the cost, stays out.
        assert_eq!(pick(band, &[0; 4]), 2);
        // Candidate 3 holds a little of the prompt: no longer fresh, and
        // among 0 and 1 (within 10 %, equal holdings) recency decides.
        assert_eq!(pick(band, &[0, 0, 0, 1]), 0);
        // With one band for both, the fresh request's near-ties are 0 and
        // 1, and of those 1 was given less work.
        assert_eq!(pick(Band::same(0.1), &[0; 4]), 1);
        // No fresh band (an adapter some replica holds): recency within 10 %.
        assert_eq!(pick(Band { epsilon: 0.1, fresh: None }, &[0; 4]), 0);
    }
}
