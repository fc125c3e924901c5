//! The lease store of one resource: which client holds a lease, its demand (kept in the band) and
//! when the lease expires.
//!
//! Leases live in a slab indexed by a hash table on the client id. Expiry times are whole seconds,
//! so leases are kept in one intrusive list per expiry second, the seconds in a `BTreeMap`:
//! refreshing a lease moves it between lists in O(1) + O(log seconds), and expiring takes the
//! oldest lists without looking at any lease that is still valid.

use std::{collections::BTreeMap, hash::BuildHasher};

use hashbrown::{DefaultHashBuilder, HashTable};

use super::band::{Band, Demand, NodeId};

/// Unix time in whole seconds, the protocol's unit.
pub type UnixSeconds = i64;

type Slot = u32;
const NONE: Slot = Slot::MAX;

#[derive(Debug)]
struct Entry {
    /// Empty for a free slot.
    client: Box<str>,
    node: NodeId,
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
    pub demand: Demand,
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
    band: Band,
}

impl LeaseStore {
    pub fn len(&self) -> usize {
        self.band.len()
    }

    pub fn is_empty(&self) -> bool {
        self.band.is_empty()
    }

    /// The demands of every lease holder.
    pub fn band(&self) -> &Band {
        &self.band
    }

    pub fn get(&self, client: &str) -> Option<LeaseView<'_>> {
        self.find(client).map(|slot| self.view(slot))
    }

    /// Records a client's new demand, asks `decide` for its grant (with the demand already in
    /// the band, still holding its previous grant) and stores the grant until `expiry`.
    pub fn claim(
        &mut self,
        client: &str,
        wants: f64,
        subclients: f64,
        expiry: UnixSeconds,
        decide: impl FnOnce(&Band, &Demand) -> f64,
    ) -> f64 {
        let slot = match self.find(client) {
            Some(slot) => {
                let node = self.entries[slot as usize].node;
                let has = self.band.demand(node).has;
                self.band.update(node, Demand { wants, subclients, has });
                self.unlink(slot);
                slot
            }
            None => {
                let node = self.band.insert(Demand { wants, subclients, has: 0.0 });
                self.allocate(client, node)
            }
        };
        let node = self.entries[slot as usize].node;
        let demand = *self.band.demand(node);
        let has = decide(&self.band, &demand);
        self.band.update(node, Demand { has, ..demand });
        self.link(slot, expiry);
        has
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
        LeaseView { client: &e.client, demand: *self.band.demand(e.node), expiry: e.expiry }
    }

    fn find(&self, client: &str) -> Option<Slot> {
        let hash = self.hasher.hash_one(client);
        self.index.find(hash, |&slot| &*self.entries[slot as usize].client == client).copied()
    }

    fn allocate(&mut self, client: &str, node: NodeId) -> Slot {
        let entry = Entry { client: client.into(), node, expiry: 0, prev: NONE, next: NONE };
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

    /// Frees an unlinked slot: out of the index, the band and the slab.
    fn release(&mut self, slot: Slot) {
        let hash = self.hasher.hash_one(&*self.entries[slot as usize].client);
        if let Ok(found) = self.index.find_entry(hash, |&s| s == slot) {
            found.remove();
        }
        let e = &mut self.entries[slot as usize];
        self.band.remove(e.node);
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
        store.claim(client, wants, 1.0, expiry, |_, me| me.wants)
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
