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
        // Walk down to the last demand j (in level order) that is fully satisfied at its own
        // level, i.e. Σ_{i≤j} wants_i + level_j · Σ_{i>j} subclients_i ≤ capacity. That
        // quantity only grows along the order, so the walk is a binary search.
        let mut below = Sums::default();
        let mut at = self.root;
        while at != NIL {
            let node = &self.nodes[at as usize];
            let through = below.plus(self.sums_of(node.left)).plus(Sums::of(&node.demand));
            let filled = through.wants + node.demand.level() * (total.subclients - through.subclients);
            if filled <= capacity {
                below = through;
                at = node.right;
            } else {
                at = node.left;
            }
        }
        let rest = total.subclients - below.subclients;
        // Rounding can make every demand look satisfied; then they all are, to within ulps.
        (rest > 0.0).then(|| (capacity - below.wants) / rest)
    }

    /// Sums over the demands whose level is at most `level`.
    pub fn sums_up_to(&self, level: f64) -> Sums {
        let mut below = Sums::default();
        let mut at = self.root;
        while at != NIL {
            let node = &self.nodes[at as usize];
            if node.demand.level() <= level {
                below = below.plus(self.sums_of(node.left)).plus(Sums::of(&node.demand));
                at = node.right;
            } else {
                at = node.left;
            }
        }
        below
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
