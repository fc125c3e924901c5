//! The lease store of one resource: which client holds a lease, its demands (kept in the
//! resource's priority bands) and when the lease expires.
//!
//! Leases live in a slab indexed by a hash table on the client id. Expiry times are whole seconds,
//! so leases are kept in one intrusive list per expiry second, the seconds in a `BTreeMap`:
//! refreshing a lease moves it between lists in O(1) + O(log seconds), and expiring takes the
//! oldest lists without looking at any lease that is still valid.

use std::{collections::BTreeMap, hash::BuildHasher};

use hashbrown::{DefaultHashBuilder, HashTable};
use smallvec::SmallVec;

use super::{
    band::{Demand, NodeId},
    priority::{Bands, Wants},
};

/// Unix time in whole seconds, the protocol's unit.
pub type UnixSeconds = i64;

type Slot = u32;
const NONE: Slot = Slot::MAX;

/// Where one of a lease's demands sits: its priority band and its node there. An end client has
/// one; a lower-level server one per priority among its clients.
type Place = (i64, NodeId);

#[derive(Debug)]
struct Entry {
    /// Empty for a free slot.
    client: Box<str>,
    /// Most important first.
    places: SmallVec<[Place; 1]>,
    expiry: UnixSeconds,
    /// Neighbours in the list of leases expiring in the same second; for a free slot, `next`
    /// chains the free list.
    prev: Slot,
    next: Slot,
}

/// A lease as stored, for reading.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeaseView<'a> {
    pub client: &'a str,
    /// The sums over its bands.
    pub demand: Demand,
    /// Its most important band.
    pub priority: i64,
    pub expiry: UnixSeconds,
}

#[derive(Debug, Default)]
pub struct LeaseStore {
    entries: Vec<Entry>,
    free: Option<Slot>,
    index: HashTable<Slot>,
    hasher: DefaultHashBuilder,
    /// Expiry second → first lease of its list.
    expiries: BTreeMap<UnixSeconds, Slot>,
    bands: Bands,
    len: usize,
}

impl LeaseStore {
    /// A store whose bands' trees are shaped by `seed` (see [`Bands::seeded`]).
    pub fn seeded(seed: Option<u64>) -> LeaseStore {
        LeaseStore { bands: Bands::seeded(seed), ..LeaseStore::default() }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The demands of every lease holder, by priority.
    pub fn bands(&self) -> &Bands {
        &self.bands
    }

    pub fn get(&self, client: &str) -> Option<LeaseView<'_>> {
        self.find(client).map(|slot| self.view(slot))
    }

    /// Records a client's new demands (`wants`: one per priority, most important first, at
    /// least one), asks `decide` for its grant — given the bands with the new demands in them,
    /// the client's demands by band, and what the other leases hold — and stores the lease
    /// until `expiry`.
    ///
    /// The lease holds the grant, or more while the client's own clients still hold more
    /// (`holds`, reported by a lower-level server): capacity taken back from a server is only
    /// free once its clients have refreshed onto their smaller shares. It never holds more than
    /// before.
    pub fn claim(
        &mut self,
        client: &str,
        wants: &[Wants],
        holds: f64,
        expiry: UnixSeconds,
        decide: impl FnOnce(&Bands, &[(i64, Demand)], f64) -> f64,
    ) -> f64 {
        debug_assert!(!wants.is_empty(), "a claim has at least one band");
        let (slot, held) = match self.find(client) {
            Some(slot) => {
                self.unlink(slot);
                (slot, self.forget_places(slot))
            }
            None => {
                self.len += 1;
                (self.allocate(client), 0.0)
            }
        };
        let mine: SmallVec<[(i64, Demand); 1]> =
            wants.iter().map(|w| (w.priority, Demand { wants: w.wants, subclients: w.subclients, has: 0.0 })).collect();
        // With the previous demands out, what the bands hold is what the others hold.
        let others = self.bands.sums().has;
        let grant = decide(self.insert(slot, &mine), &mine, others);
        self.distribute(slot, grant.max(holds.min(held)));
        self.link(slot, expiry);
        grant
    }

    /// Takes a lease's demands out of their bands; returns what it held.
    fn forget_places(&mut self, slot: Slot) -> f64 {
        let places = std::mem::take(&mut self.entries[slot as usize].places);
        places.into_iter().map(|(priority, node)| self.bands.remove(priority, node).has).sum()
    }

    /// Files a lease's demands in their bands.
    fn insert(&mut self, slot: Slot, mine: &[(i64, Demand)]) -> &Bands {
        let places = mine.iter().map(|&(p, demand)| (p, self.bands.band_mut(p).insert(demand))).collect();
        self.entries[slot as usize].places = places;
        &self.bands
    }

    /// Spreads a grant over a lease's bands, the most important first, each up to its wants.
    fn distribute(&mut self, slot: Slot, grant: f64) {
        let mut left = grant;
        let places = self.entries[slot as usize].places.clone();
        let last = places.len() - 1;
        for (i, (priority, node)) in places.into_iter().enumerate() {
            let band = self.bands.band_mut(priority);
            let demand = *band.demand(node);
            // The last band takes any rounding left over, so the bands add up to the grant.
            let has = if i == last { left } else { left.min(demand.wants) };
            band.update(node, Demand { has, ..demand });
            left -= has;
        }
    }

    /// Forgets a client's lease; false if it held none.
    pub fn remove(&mut self, client: &str) -> bool {
        let Some(slot) = self.find(client) else { return false };
        self.unlink(slot);
        self.release(slot);
        true
    }

    /// Forgets up to `budget` leases that expired at or before `now`; returns how many.
    pub fn expire(&mut self, now: UnixSeconds, budget: usize) -> usize {
        let mut done = 0;
        while done < budget {
            let Some((&second, &slot)) = self.expiries.first_key_value() else { break };
            if second > now {
                break;
            }
            self.unlink(slot);
            self.release(slot);
            done += 1;
        }
        done
    }

    pub fn iter(&self) -> impl Iterator<Item = LeaseView<'_>> {
        (0..self.entries.len() as Slot)
            .filter(|&slot| !self.entries[slot as usize].client.is_empty())
            .map(|slot| self.view(slot))
    }

    fn view(&self, slot: Slot) -> LeaseView<'_> {
        let e = &self.entries[slot as usize];
        let demand = e.places.iter().fold(Demand::default(), |sum, &(priority, node)| {
            let d = self.bands.get(priority).expect("a lease's band exists").demand(node);
            Demand { wants: sum.wants + d.wants, subclients: sum.subclients + d.subclients, has: sum.has + d.has }
        });
        LeaseView { client: &e.client, demand, priority: e.places.first().map_or(0, |p| p.0), expiry: e.expiry }
    }

    fn find(&self, client: &str) -> Option<Slot> {
        let hash = self.hasher.hash_one(client);
        self.index.find(hash, |&slot| &*self.entries[slot as usize].client == client).copied()
    }

    fn allocate(&mut self, client: &str) -> Slot {
        let entry = Entry { client: client.into(), places: SmallVec::new(), expiry: 0, prev: NONE, next: NONE };
        let slot = match self.free {
            Some(slot) => {
                let next = self.entries[slot as usize].next;
                self.free = (next != NONE).then_some(next);
                self.entries[slot as usize] = entry;
                slot
            }
            None => {
                self.entries.push(entry);
                Slot::try_from(self.entries.len() - 1).expect("more than 2^32 leases on one resource")
            }
        };
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.index.insert_unique(hasher.hash_one(client), slot, |&s| hasher.hash_one(&*entries[s as usize].client));
        slot
    }

    /// Frees an unlinked slot: out of the index, the bands and the slab.
    fn release(&mut self, slot: Slot) {
        let hash = self.hasher.hash_one(&*self.entries[slot as usize].client);
        if let Ok(found) = self.index.find_entry(hash, |&s| s == slot) {
            found.remove();
        }
        self.forget_places(slot);
        self.len -= 1;
        let e = &mut self.entries[slot as usize];
        e.client = Box::default();
        e.next = self.free.unwrap_or(NONE);
        self.free = Some(slot);
    }

    fn link(&mut self, slot: Slot, expiry: UnixSeconds) {
        let next = self.expiries.insert(expiry, slot).unwrap_or(NONE);
        if next != NONE {
            self.entries[next as usize].prev = slot;
        }
        let e = &mut self.entries[slot as usize];
        e.expiry = expiry;
        e.prev = NONE;
        e.next = next;
    }

    fn unlink(&mut self, slot: Slot) {
        let Entry { prev, next, expiry, .. } = self.entries[slot as usize];
        if prev == NONE {
            if next == NONE {
                self.expiries.remove(&expiry);
            } else {
                self.expiries.insert(expiry, next);
            }
        } else {
            self.entries[prev as usize].next = next;
        }
        if next != NONE {
            self.entries[next as usize].prev = prev;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(store: &mut LeaseStore, client: &str, wants: f64, expiry: UnixSeconds) -> f64 {
        store.claim(client, &[Wants { priority: 0, wants, subclients: 1.0 }], 0.0, expiry, |_, _, _| wants)
    }

    #[test]
    fn expiry_takes_only_due_leases_and_follows_refreshes() {
        let mut store = LeaseStore::default();
        claim(&mut store, "a", 1.0, 10);
        claim(&mut store, "b", 2.0, 10);
        claim(&mut store, "c", 3.0, 12);
        claim(&mut store, "a", 4.0, 13); // refreshed: leaves second 10
        assert_eq!(store.expire(9, usize::MAX), 0);
        assert_eq!(store.expire(10, usize::MAX), 1);
        assert!(store.get("b").is_none());
        assert_eq!(store.expiries.keys().collect::<Vec<_>>(), [&12, &13]);
        assert_eq!(store.expire(20, 1), 1, "the budget bounds the work");
        assert_eq!(store.len(), 1);
        assert_eq!(store.get("a").unwrap().demand, Demand { wants: 4.0, subclients: 1.0, has: 4.0 });
    }

    #[test]
    fn grants_fill_bands_from_the_top_and_a_server_keeps_what_its_clients_hold() {
        let mut store = LeaseStore::default();
        let wants =
            [Wants { priority: 2, wants: 10.0, subclients: 2.0 }, Wants { priority: 0, wants: 30.0, subclients: 3.0 }];
        assert_eq!(store.claim("leaf", &wants, 0.0, 10, |_, _, _| 25.0), 25.0);
        let band = |p| store.bands().get(p).unwrap().sums();
        assert_eq!((band(2).has, band(0).has), (10.0, 15.0));
        // Cut to 5 while its clients still hold 20: the lease keeps 20 until they refresh...
        assert_eq!(store.claim("leaf", &wants, 20.0, 10, |_, _, others| 5.0 + others), 5.0);
        assert_eq!(store.get("leaf").unwrap().demand.has, 20.0);
        // ...never more than it held before, and the grant when that is larger.
        assert_eq!(store.claim("leaf", &wants, 99.0, 10, |_, _, _| 5.0), 5.0);
        assert_eq!(store.get("leaf").unwrap().demand.has, 20.0);
        store.claim("leaf", &wants, 0.0, 10, |_, _, _| 5.0);
        assert_eq!(store.get("leaf").unwrap().demand.has, 5.0);
        assert_eq!(store.get("leaf").unwrap().priority, 2);
    }

    #[test]
    fn slots_are_reused_and_index_stays_consistent() {
        let mut store = LeaseStore::default();
        for round in 0..3 {
            for i in 0..100 {
                claim(&mut store, &format!("c{i}"), f64::from(i), 5 + round);
            }
            for i in (0..100).step_by(2) {
                assert!(store.remove(&format!("c{i}")));
            }
            assert!(!store.remove("c0"));
            assert_eq!(store.len(), 50);
            assert_eq!(store.iter().count(), 50);
            for i in (1..100).step_by(2) {
                assert_eq!(store.get(&format!("c{i}")).unwrap().demand.wants, f64::from(i));
            }
        }
        assert_eq!(store.entries.len(), 100, "freed slots are reused");
        assert_eq!(store.expire(100, usize::MAX), 50);
        assert!(store.is_empty());
    }
}
