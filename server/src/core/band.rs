//! A band: the demands of the clients of one resource, kept in order of wants per subclient, with
//! the sums the algorithms need.
//!
//! The demands form a treap (a binary search tree balanced by pseudo-random priorities) whose
//! nodes carry the sums of their subtree. Every change recomputes the sums on its path from the
//! children (`pull`), never by adding a difference, so a sum is always the same function of the
//! current demands: it cannot drift however many updates it has seen. Insert, remove, update,
//! the water level of FAIR_SHARE and the prefix sums of PROPORTIONAL_SHARE are all O(log n).

/// Index of a demand in its band; stable while the demand is in the band.
pub type NodeId = u32;

const NIL: NodeId = NodeId::MAX;

/// What one client asks for and holds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Demand {
    pub wants: f64,
    /// The client's weight: 1 for an end client, the number of clients behind a server.
    pub subclients: f64,
    /// What the client was last granted.
    pub has: f64,
}

impl Demand {
    /// The key the band is ordered by: the water level at which this client is satisfied.
    pub fn level(&self) -> f64 {
        self.wants / self.subclients
    }
}

/// Sums over a set of demands.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sums {
    pub wants: f64,
    pub subclients: f64,
    pub has: f64,
}

impl Sums {
    fn of(d: &Demand) -> Sums {
        Sums { wants: d.wants, subclients: d.subclients, has: d.has }
    }

    pub fn plus(self, o: Sums) -> Sums {
        Sums { wants: self.wants + o.wants, subclients: self.subclients + o.subclients, has: self.has + o.has }
    }
}

#[derive(Clone, Debug)]
struct Node {
    demand: Demand,
    /// Sums over this node's subtree, this node included.
    sums: Sums,
    left: NodeId,
    /// For a free node, the next free node.
    right: NodeId,
}

#[derive(Clone, Debug)]
pub struct Band {
    /// Secret per band, mixed into the heap priorities: clients choose ids and wants, and with
    /// predictable priorities they could order their demands into a chain as deep as their
    /// number.
    seed: u64,
    nodes: Vec<Node>,
    root: NodeId,
    free: NodeId,
    len: usize,
}

impl Default for Band {
    fn default() -> Self {
        // Each RandomState has its own keys, so each band its own seed. The seed shapes the tree
        // only; allocations do not depend on it beyond the rounding of sums.
        Band::with_seed(std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), 0u64))
    }
}

/// A node's heap priority: its id mixed with the band's seed, so no priority needs storing.
fn mix(seed: u64, id: NodeId) -> u64 {
    // splitmix64's finaliser: consecutive ids get unrelated priorities.
    let mut z = (seed ^ u64::from(id)).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Band {
    /// A band whose tree shape is fixed by `seed`, for runs that must replay bit for bit (the
    /// simulator); servers use `default`, whose seed nobody can guess.
    pub fn with_seed(seed: u64) -> Band {
        Band { seed, nodes: Vec::new(), root: NIL, free: NIL, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sums over every demand in the band.
    pub fn sums(&self) -> Sums {
        self.sums_of(self.root)
    }

    pub fn demand(&self, id: NodeId) -> &Demand {
        &self.nodes[id as usize].demand
    }

    pub fn insert(&mut self, demand: Demand) -> NodeId {
        let node = Node { demand, sums: Sums::of(&demand), left: NIL, right: NIL };
        let id = if self.free == NIL {
            self.nodes.push(node);
            NodeId::try_from(self.nodes.len() - 1).expect("more than 2^32 demands in one band")
        } else {
            let id = self.free;
            self.free = self.nodes[id as usize].right;
            self.nodes[id as usize] = node;
            id
        };
        self.root = self.insert_into(self.root, id);
        self.len += 1;
        id
    }

    pub fn remove(&mut self, id: NodeId) -> Demand {
        self.root = self.remove_from(self.root, id);
        self.len -= 1;
        let node = &mut self.nodes[id as usize];
        node.left = NIL;
        node.right = self.free;
        self.free = id;
        node.demand
    }

    /// Replaces a demand; the id stays valid.
    pub fn update(&mut self, id: NodeId, demand: Demand) {
        let old = self.nodes[id as usize].demand;
        if old.level().to_bits() == demand.level().to_bits() {
            // Same place in the order: only the sums on the path change.
            self.nodes[id as usize].demand = demand;
            self.pull_path(self.root, id);
        } else {
            self.root = self.remove_from(self.root, id);
            let node = &mut self.nodes[id as usize];
            *node = Node { demand, sums: Sums::of(&demand), left: NIL, right: NIL };
            self.root = self.insert_into(self.root, id);
        }
    }

    /// The exact max-min water level λ for `capacity`: the one value with
    /// Σ min(wants_j, λ·subclients_j) = capacity. `None` when every demand fits (Σ wants ≤
    /// capacity), i.e. when there is no level to cut at.
    pub fn water_level(&self, capacity: f64) -> Option<f64> {
        let total = self.sums();
        if total.wants <= capacity {
            return None;
        }
        // The demands fully satisfied at their own level: those j with Σ_{i≤j} wants_i +
        // level_j · Σ_{i>j} subclients_i ≤ capacity, a quantity that only grows along the order.
        let below = self.prefix_while(|through, demand| {
            through.wants + demand.level() * (total.subclients - through.subclients) <= capacity
        });
        let rest = total.subclients - below.subclients;
        // Rounding can make every demand look satisfied; then they all are, to within ulps.
        (rest > 0.0).then(|| (capacity - below.wants) / rest)
    }

    /// Sums over the demands whose level is at most `level`.
    pub fn sums_up_to(&self, level: f64) -> Sums {
        self.prefix_while(|_, demand| demand.level() <= level)
    }

    /// The demands in level order as at most `max` groups (≥ 1), each group's sums: what a
    /// server passes up so that its parent can share by who wants what, not by the total alone
    /// (`PriorityBandAggregate.profile`). A band of at most `max` demands gives one group per
    /// level, exactly. A larger one is cut where the running share of the subclients plus that
    /// of the wants passes a multiple of 2 / `max`, so that neither many modest clients nor a
    /// few large ones are lumped together; O(`max` · log n) either way, never a walk over all.
    pub fn groups(&self, max: usize) -> Vec<Sums> {
        let max = max.max(1);
        let mut groups: Vec<Sums> = Vec::new();
        if self.len <= max {
            let mut last_level = f64::NAN;
            self.in_order(self.root, &mut |demand| {
                match groups.last_mut() {
                    Some(group) if demand.level() == last_level => *group = group.plus(Sums::of(demand)),
                    _ => groups.push(Sums::of(demand)),
                }
                last_level = demand.level();
            });
            return groups;
        }
        let total = self.sums();
        let share = |s: &Sums| {
            let of_wants = if total.wants > 0.0 { s.wants / total.wants } else { 0.0 };
            s.subclients / total.subclients + of_wants
        };
        let mut before = Sums::default();
        for k in 1..=max {
            let through = if k == max {
                total
            } else {
                let cut = 2.0 * k as f64 / max as f64;
                self.prefix_while(|through, _| share(through) <= cut)
            };
            // Subclients are whole numbers, so an empty stretch differs by exactly 0.
            if through.subclients > before.subclients {
                groups.push(Sums {
                    wants: (through.wants - before.wants).max(0.0),
                    subclients: through.subclients - before.subclients,
                    has: through.has - before.has,
                });
                before = through;
            }
        }
        groups
    }

    /// Sums over the longest prefix (in level order) of demands that `keep` accepts, given the
    /// sums through each demand and the demand; `keep` must hold for a prefix and fail after, so
    /// that one walk down finds where.
    fn prefix_while(&self, keep: impl Fn(&Sums, &Demand) -> bool) -> Sums {
        let mut below = Sums::default();
        let mut at = self.root;
        while at != NIL {
            let node = &self.nodes[at as usize];
            let through = below.plus(self.sums_of(node.left)).plus(Sums::of(&node.demand));
            if keep(&through, &node.demand) {
                below = through;
                at = node.right;
            } else {
                at = node.left;
            }
        }
        below
    }

    fn in_order(&self, at: NodeId, visit: &mut impl FnMut(&Demand)) {
        if at != NIL {
            let node = &self.nodes[at as usize];
            self.in_order(node.left, visit);
            visit(&node.demand);
            self.in_order(node.right, visit);
        }
    }

    /// The longest path from the root, for tests of the balance.
    #[cfg(test)]
    fn depth(&self) -> usize {
        fn walk(band: &Band, at: NodeId) -> usize {
            if at == NIL {
                return 0;
            }
            let node = &band.nodes[at as usize];
            1 + walk(band, node.left).max(walk(band, node.right))
        }
        walk(self, self.root)
    }

    fn priority(&self, id: NodeId) -> u64 {
        mix(self.seed, id)
    }

    fn sums_of(&self, id: NodeId) -> Sums {
        if id == NIL { Sums::default() } else { self.nodes[id as usize].sums }
    }

    /// Total order of the tree: by level, ties broken by id.
    fn before(&self, a: NodeId, b: NodeId) -> bool {
        let (da, db) = (&self.nodes[a as usize].demand, &self.nodes[b as usize].demand);
        da.level().total_cmp(&db.level()).then(a.cmp(&b)).is_lt()
    }

    /// Recomputes a node's sums from its children.
    fn pull(&mut self, id: NodeId) {
        let node = &self.nodes[id as usize];
        let sums = self.sums_of(node.left).plus(Sums::of(&node.demand)).plus(self.sums_of(node.right));
        self.nodes[id as usize].sums = sums;
    }

    fn pull_path(&mut self, at: NodeId, id: NodeId) {
        if at != id {
            let node = &self.nodes[at as usize];
            let next = if self.before(id, at) { node.left } else { node.right };
            self.pull_path(next, id);
        }
        self.pull(at);
    }

    fn insert_into(&mut self, at: NodeId, id: NodeId) -> NodeId {
        if at == NIL {
            return id;
        }
        if self.priority(id) > self.priority(at) {
            let (left, right) = self.split(at, id);
            let node = &mut self.nodes[id as usize];
            node.left = left;
            node.right = right;
            self.pull(id);
            return id;
        }
        if self.before(id, at) {
            let left = self.insert_into(self.nodes[at as usize].left, id);
            self.nodes[at as usize].left = left;
        } else {
            let right = self.insert_into(self.nodes[at as usize].right, id);
            self.nodes[at as usize].right = right;
        }
        self.pull(at);
        at
    }

    fn remove_from(&mut self, at: NodeId, id: NodeId) -> NodeId {
        assert_ne!(at, NIL, "demand {id} is not in the band");
        if at == id {
            let node = &self.nodes[id as usize];
            return self.merge(node.left, node.right);
        }
        if self.before(id, at) {
            let left = self.remove_from(self.nodes[at as usize].left, id);
            self.nodes[at as usize].left = left;
        } else {
            let right = self.remove_from(self.nodes[at as usize].right, id);
            self.nodes[at as usize].right = right;
        }
        self.pull(at);
        at
    }

    /// Splits the subtree at `at` into the nodes ordered before `id` and those after it.
    fn split(&mut self, at: NodeId, id: NodeId) -> (NodeId, NodeId) {
        if at == NIL {
            return (NIL, NIL);
        }
        if self.before(at, id) {
            let (left, right) = self.split(self.nodes[at as usize].right, id);
            self.nodes[at as usize].right = left;
            self.pull(at);
            (at, right)
        } else {
            let (left, right) = self.split(self.nodes[at as usize].left, id);
            self.nodes[at as usize].left = right;
            self.pull(at);
            (left, at)
        }
    }

    /// Joins two subtrees where every node of `a` is ordered before every node of `b`.
    fn merge(&mut self, a: NodeId, b: NodeId) -> NodeId {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.priority(a) > self.priority(b) {
            let right = self.merge(self.nodes[a as usize].right, b);
            self.nodes[a as usize].right = right;
            self.pull(a);
            a
        } else {
            let left = self.merge(a, self.nodes[b as usize].left);
            self.nodes[b as usize].left = left;
            self.pull(b);
            b
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand(wants: f64, subclients: f64) -> Demand {
        Demand { wants, subclients, has: 0.0 }
    }

    #[test]
    fn water_level_is_exact() {
        let mut band = Band::default();
        for w in [50.0, 1.0, 20.0, 25.0, 5.0, 20.0] {
            band.insert(demand(w, 1.0));
        }
        assert_eq!(band.water_level(100.0), Some(29.0));
        assert_eq!(band.water_level(101.0), Some(30.0));
        assert_eq!(band.water_level(121.0), None, "everyone fits");
    }

    #[test]
    fn a_small_band_is_profiled_exactly_one_group_per_level() {
        let mut band = Band::default();
        for (w, s) in [(20.0, 1.0), (5.0, 1.0), (10.0, 2.0), (20.0, 1.0), (50.0, 1.0)] {
            band.insert(demand(w, s));
        }
        let groups: Vec<(f64, f64)> = band.groups(8).iter().map(|g| (g.subclients, g.wants)).collect();
        // Levels 5, 5 (10 over 2), 20, 20, 50: equal levels share a group.
        assert_eq!(groups, [(3.0, 15.0), (2.0, 40.0), (1.0, 50.0)]);
        assert_eq!(band.groups(1).iter().map(|g| (g.subclients, g.wants)).collect::<Vec<_>>(), [(6.0, 105.0)]);
    }

    #[test]
    fn a_large_band_is_profiled_in_bounded_groups_that_keep_large_demands_apart() {
        let mut band = Band::default();
        // 10,000 clients wanting 1 to 10 each, and ten wanting 1,000 each.
        for i in 0..10_000 {
            band.insert(demand(1.0 + f64::from(i % 10), 1.0));
        }
        for _ in 0..10 {
            band.insert(demand(1_000.0, 1.0));
        }
        let groups = band.groups(32);
        assert!(groups.len() <= 32, "{} groups", groups.len());
        let sum = groups.iter().fold(Sums::default(), |a, g| a.plus(*g));
        assert_eq!(sum.subclients, 10_010.0);
        assert!((sum.wants - band.sums().wants).abs() < 1e-6);
        // Half the wants are the ten large clients': they get groups of their own rather than
        // being averaged into many modest ones.
        let large: Vec<&Sums> = groups.iter().filter(|g| g.wants / g.subclients > 100.0).collect();
        assert!(large.iter().map(|g| g.subclients).sum::<f64>() <= 10.0 + 1e-9, "{groups:?}");
        assert!(large.iter().all(|g| g.wants / g.subclients == 1_000.0), "{groups:?}");
    }

    #[test]
    fn removed_ids_are_reused_and_sums_follow() {
        let mut band = Band::default();
        let a = band.insert(demand(10.0, 1.0));
        let b = band.insert(demand(20.0, 2.0));
        assert_eq!(band.remove(a), demand(10.0, 1.0));
        let c = band.insert(demand(5.0, 1.0));
        assert_eq!(c, a);
        band.update(b, Demand { wants: 30.0, subclients: 2.0, has: 7.0 });
        assert_eq!(band.sums(), Sums { wants: 35.0, subclients: 3.0, has: 7.0 });
        assert_eq!(band.sums_up_to(5.0), Sums { wants: 5.0, subclients: 1.0, has: 0.0 });
    }

    #[test]
    fn overflowing_sums_heal_when_the_demand_goes() {
        let mut band = Band::default();
        let a = band.insert(demand(f64::MAX, 1.0));
        band.insert(demand(f64::MAX, 1.0));
        assert_eq!(band.sums().wants, f64::INFINITY);
        assert_eq!(band.water_level(100.0), Some(50.0));
        band.remove(a);
        assert_eq!(band.sums().wants, f64::MAX, "recomputed, not decremented");
    }

    #[test]
    fn an_adversary_cannot_order_demands_into_a_chain() {
        // Wants rising with the unseeded priority of each id: with priorities anyone can
        // compute, every insert would land at the bottom of one long path.
        let mut ids: Vec<NodeId> = (0..50_000).collect();
        ids.sort_by_key(|&id| mix(0, id));
        let mut wants = vec![0.0; ids.len()];
        for (rank, &id) in ids.iter().enumerate() {
            wants[id as usize] = rank as f64;
        }
        let mut band = Band::default();
        for w in wants {
            band.insert(demand(w, 1.0));
        }
        assert!(band.depth() < 80, "depth {}", band.depth());
    }

    #[test]
    fn stays_shallow_with_equal_keys() {
        // Equal demands are ordered by id alone, the worst case for a tree keyed by insertion.
        let mut band = Band::default();
        for _ in 0..100_000 {
            band.insert(demand(1.0, 1.0));
        }
        assert!(band.depth() < 60, "depth {}", band.depth());
    }
}
