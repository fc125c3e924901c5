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

use crate::defaults::RETURN_GRACE;

use super::{
    band::{Demand, NodeId},
    priority::{Bands, Wants},
};

/// Unix time in whole seconds, the protocol's unit.
pub type UnixSeconds = i64;

type Slot = u32;
const NONE: Slot = Slot::MAX;

/// Where one of a lease's demands sits: its priority band and its node there. An end client has
/// one; a child server one per priority among its clients.
type Place = (i64, NodeId);

/// What a claimant says its own clients hold: how long a smaller grant takes to be obeyed, and
/// what is presumed once its lease runs out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Holds {
    /// An end client: it obeys a smaller grant at once, and once its lease is gone the lease is
    /// forgotten (SPEC §3.2).
    Own,
    /// A child server whose clients still hold this much from earlier grants (its
    /// reported `has`): that stays reserved until they have refreshed onto smaller shares.
    Reported(f64),
    /// A child server that does not say: a new master still learning what its clients
    /// hold keeps at least the lease its id last held while it did say, until that lease's
    /// expiry, and is granted that much. (Doorman's servers never say; they are granted what
    /// the algorithm decides, as by Doorman.)
    Unknown,
}

impl Holds {
    fn of_server(self) -> bool {
        self != Holds::Own
    }
}

#[derive(Debug)]
struct Entry {
    /// Empty for a free slot.
    client: Box<str>,
    /// Most important first.
    places: SmallVec<[Place; 1]>,
    expiry: UnixSeconds,
    /// A child server's lease (see [`Holds`]).
    server: bool,
    /// The expiry of the last lease granted while the server reported what its clients hold,
    /// or since then while it has not said again: until then they may hold up to that lease.
    reported_until: UnixSeconds,
    /// A server's lease that ran out without a release: what it holds is what its subtree
    /// presumably hands out as safe capacity meanwhile (see [`LeaseStore::expire`]).
    lapsed: bool,
    /// Until then, a server back from a lapse keeps at least what it held (see
    /// [`RETURN_GRACE`]).
    returning_until: UnixSeconds,
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
    /// Ran out without a release; kept as the safe capacity its subtree falls back on.
    pub lapsed: bool,
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
    /// Demands filed in the bands over all leases: what the ledger's lease bound counts.
    demands: usize,
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

    /// How many demands the leases file in all: one per end client, one per band or profile
    /// group per child server.
    pub fn demands(&self) -> usize {
        self.demands
    }

    /// How many demands `client`'s lease files; `None` without a lease.
    pub fn demands_of(&self, client: &str) -> Option<usize> {
        self.find(client).map(|slot| self.entries[slot as usize].places.len())
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
    /// the client's demands by band, what the other leases hold, and what this one held before
    /// (0 for a new lease) — and stores the lease until `expiry`. Returns the grant.
    ///
    /// A child server's lease holds more than the grant while its own clients still hold
    /// more (`holds`): capacity taken back from a server is only free once its clients have
    /// refreshed onto their smaller shares — for [`RETURN_GRACE`] after it comes back from a
    /// lapse, whatever it says. It never holds more than before, except that a server which
    /// does not say what its clients hold keeps its lease, and is granted it: once, if its
    /// lease had lapsed (a Doorman server, which never says); until it says again, if it said
    /// before (a new master while it learns, which re-grants its clients what they hold).
    #[allow(clippy::too_many_arguments)]
    pub fn claim(
        &mut self,
        client: &str,
        wants: &[Wants],
        holds: Holds,
        now: UnixSeconds,
        expiry: UnixSeconds,
        decide: impl FnOnce(&Bands, &[(i64, Demand)], f64, f64) -> f64,
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
        let grant = decide(self.insert(slot, &mine), &mine, others, held);
        let e = &mut self.entries[slot as usize];
        let kept = match holds {
            Holds::Own => grant,
            Holds::Reported(holds) => {
                if e.lapsed {
                    e.returning_until = now.saturating_add(RETURN_GRACE);
                }
                e.reported_until = expiry;
                // Back from a lapse, it has not heard from all its clients yet.
                if now < e.returning_until { grant.max(held) } else { grant.max(holds.min(held)) }
            }
            // It does not say what its clients hold: they may still hold what it held then, or
            // live on the safe capacity its lapsed lease keeps reserved. A server that said
            // before (a new master, learning) re-grants them what they hold under this lease,
            // so the reservation lasts until it says again.
            Holds::Unknown if now < e.reported_until || e.lapsed => {
                if e.reported_until > UnixSeconds::MIN {
                    e.reported_until = expiry;
                }
                grant.max(held)
            }
            Holds::Unknown => grant,
        };
        (e.server, e.lapsed) = (holds.of_server(), false);
        self.distribute(slot, kept);
        self.link(slot, expiry);
        if holds == Holds::Unknown { kept } else { grant }
    }

    /// Takes a lease's demands out of their bands; returns what it held.
    fn forget_places(&mut self, slot: Slot) -> f64 {
        let places = std::mem::take(&mut self.entries[slot as usize].places);
        self.demands -= places.len();
        places.into_iter().map(|(priority, node)| self.bands.remove(priority, node).has).sum()
    }

    /// Files a lease's demands in their bands.
    fn insert(&mut self, slot: Slot, mine: &[(i64, Demand)]) -> &Bands {
        let places: SmallVec<_> = mine.iter().map(|&(p, demand)| (p, self.bands.band_mut(p).insert(demand))).collect();
        self.demands += places.len();
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

    /// Takes up to `budget` leases that expired at or before `now`; returns how many. An end
    /// client's lease is forgotten. A child server's lease that ran out without a release
    /// lapses instead: its subtree is presumably cut off and handing out safe capacity, so the
    /// store keeps `fallback(demand)` reserved for it for `grace` more seconds, after which it
    /// is forgotten too. `gone` hears of each client forgotten.
    pub fn expire(
        &mut self,
        now: UnixSeconds,
        budget: usize,
        grace: UnixSeconds,
        fallback: impl Fn(&Demand) -> f64,
        gone: &mut dyn FnMut(&str),
    ) -> usize {
        let mut done = 0;
        while done < budget {
            let Some((&second, &slot)) = self.expiries.first_key_value() else { break };
            if second > now {
                break;
            }
            self.unlink(slot);
            done += 1;
            let e = &self.entries[slot as usize];
            if e.server && !e.lapsed {
                let (priority, demand) = (e.places.first().map_or(0, |p| p.0), self.view(slot).demand);
                let kept = fallback(&demand).max(0.0);
                if kept > 0.0 {
                    self.forget_places(slot);
                    // What it keeps may be more than it held: a cut-off subtree falls back on
                    // its safe capacity whatever its lease was, and the others give the
                    // difference back as they refresh. Wanting what it keeps, it is counted at
                    // that in everyone's share.
                    self.insert(slot, &[(priority, Demand { wants: kept, has: kept, ..demand })]);
                    self.entries[slot as usize].lapsed = true;
                    self.link(slot, second.saturating_add(grace));
                    continue;
                }
            }
            gone(&self.entries[slot as usize].client);
            self.release(slot);
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
        let priority = e.places.first().map_or(0, |p| p.0);
        LeaseView { client: &e.client, demand, priority, expiry: e.expiry, lapsed: e.lapsed }
    }

    fn find(&self, client: &str) -> Option<Slot> {
        let hash = self.hasher.hash_one(client);
        self.index.find(hash, |&slot| &*self.entries[slot as usize].client == client).copied()
    }

    fn allocate(&mut self, client: &str) -> Slot {
        let entry = Entry {
            client: client.into(),
            places: SmallVec::new(),
            expiry: 0,
            server: false,
            reported_until: UnixSeconds::MIN,
            lapsed: false,
            returning_until: UnixSeconds::MIN,
            prev: NONE,
            next: NONE,
        };
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
        store.claim(client, &[Wants { priority: 0, wants, subclients: 1.0 }], Holds::Own, 0, expiry, |_, _, _, _| wants)
    }

    /// Expires without lapsing anything.
    fn expire(store: &mut LeaseStore, now: UnixSeconds, budget: usize) -> usize {
        store.expire(now, budget, 0, |_| 0.0, &mut |_| {})
    }

    #[test]
    fn expiry_takes_only_due_leases_and_follows_refreshes() {
        let mut store = LeaseStore::default();
        claim(&mut store, "a", 1.0, 10);
        claim(&mut store, "b", 2.0, 10);
        claim(&mut store, "c", 3.0, 12);
        claim(&mut store, "a", 4.0, 13); // refreshed: leaves second 10
        assert_eq!(expire(&mut store, 9, usize::MAX), 0);
        assert_eq!(expire(&mut store, 10, usize::MAX), 1);
        assert!(store.get("b").is_none());
        assert_eq!(store.expiries.keys().collect::<Vec<_>>(), [&12, &13]);
        assert_eq!(expire(&mut store, 20, 1), 1, "the budget bounds the work");
        assert_eq!(store.len(), 1);
        assert_eq!(store.get("a").unwrap().demand, Demand { wants: 4.0, subclients: 1.0, has: 4.0 });
    }

    #[test]
    fn grants_fill_bands_from_the_top_and_a_server_keeps_what_its_clients_hold() {
        let mut store = LeaseStore::default();
        let wants =
            [Wants { priority: 2, wants: 10.0, subclients: 2.0 }, Wants { priority: 0, wants: 30.0, subclients: 3.0 }];
        assert_eq!(store.claim("leaf", &wants, Holds::Reported(0.0), 0, 10, |_, _, _, _| 25.0), 25.0);
        let band = |p| store.bands().get(p).unwrap().sums();
        assert_eq!((band(2).has, band(0).has), (10.0, 15.0));
        // Cut to 5 while its clients still hold 20: the lease keeps 20 until they refresh...
        assert_eq!(store.claim("leaf", &wants, Holds::Reported(20.0), 0, 10, |_, _, others, _| 5.0 + others), 5.0);
        assert_eq!(store.get("leaf").unwrap().demand.has, 20.0);
        // ...never more than it held before, and the grant when that is larger.
        assert_eq!(store.claim("leaf", &wants, Holds::Reported(99.0), 0, 10, |_, _, _, _| 5.0), 5.0);
        assert_eq!(store.get("leaf").unwrap().demand.has, 20.0);
        store.claim("leaf", &wants, Holds::Reported(0.0), 0, 10, |_, _, _, _| 5.0);
        assert_eq!(store.get("leaf").unwrap().demand.has, 5.0);
        assert_eq!(store.get("leaf").unwrap().priority, 2);
    }

    #[test]
    fn a_server_that_cannot_say_what_it_holds_keeps_its_lease() {
        let mut store = LeaseStore::default();
        let wants = [Wants { priority: 0, wants: 40.0, subclients: 4.0 }];
        store.claim("region", &wants, Holds::Reported(0.0), 0, 10, |_, _, _, _| 40.0);
        // A new master that has heard from one client of four: granted at least the old lease.
        let few = [Wants { priority: 0, wants: 10.0, subclients: 1.0 }];
        assert_eq!(store.claim("region", &few, Holds::Unknown, 0, 12, |_, _, _, _| 10.0), 40.0);
        assert_eq!(store.get("region").unwrap().demand.has, 40.0);
        // Still not saying, past the expiry of the last lease it held while it said: it may
        // have re-granted its clients what they held under the lease it got since.
        assert_eq!(store.claim("region", &few, Holds::Unknown, 10, 20, |_, _, _, _| 10.0), 40.0);
        store.claim("region", &wants, Holds::Reported(0.0), 20, 30, |_, _, _, _| 40.0);
        // Once it knows, its lease follows its grant again.
        assert_eq!(store.claim("region", &few, Holds::Reported(10.0), 21, 31, |_, _, _, _| 10.0), 10.0);
        assert_eq!(store.get("region").unwrap().demand.has, 10.0);
        // A Doorman server never says what it holds: it gets what the algorithm decides...
        store.claim("doorman", &wants, Holds::Unknown, 0, 10, |_, _, _, _| 40.0);
        assert_eq!(store.claim("doorman", &few, Holds::Unknown, 1, 11, |_, _, _, _| 10.0), 10.0);
        // ...except once after its lease lapsed: its subtree may live on the safe capacity
        // reserved meanwhile (here 2 per subclient).
        assert_eq!(store.expire(11, usize::MAX, 30, |d| 2.0 * d.subclients, &mut |_| {}), 1);
        assert_eq!(store.claim("doorman", &few, Holds::Unknown, 12, 22, |_, _, _, _| 1.0), 2.0);
        assert_eq!(store.claim("doorman", &few, Holds::Unknown, 13, 23, |_, _, _, _| 1.0), 1.0);
    }

    #[test]
    fn a_server_lease_lapses_into_its_safe_capacity_and_a_client_lease_is_forgotten() {
        let mut store = LeaseStore::default();
        let wants = [Wants { priority: 1, wants: 60.0, subclients: 3.0 }];
        store.claim("leaf", &wants, Holds::Reported(0.0), 0, 10, |_, _, _, _| 50.0);
        claim(&mut store, "client", 5.0, 10);
        let safe_per_subclient = 4.0;
        let fallback = |d: &Demand| safe_per_subclient * d.subclients;
        assert_eq!(store.expire(10, usize::MAX, 30, fallback, &mut |_| {}), 2);
        assert!(store.get("client").is_none());
        let leaf = store.get("leaf").unwrap();
        assert!(leaf.lapsed);
        assert_eq!((leaf.demand.has, leaf.demand.wants, leaf.expiry, leaf.priority), (12.0, 12.0, 40, 1));
        assert_eq!(store.bands().sums().has, 12.0);
        // Back before the grace ends: a lease again, and what it kept counts as held.
        store.claim("leaf", &wants, Holds::Reported(12.0), 0, 50, |_, _, _, _| 3.0);
        assert!(!store.get("leaf").unwrap().lapsed);
        assert_eq!(store.get("leaf").unwrap().demand.has, 12.0);
        // Lapsed again, then gone after the grace.
        assert_eq!(store.expire(50, usize::MAX, 30, fallback, &mut |_| {}), 1);
        assert_eq!(store.expire(79, usize::MAX, 30, fallback, &mut |_| {}), 0);
        assert_eq!(store.expire(80, usize::MAX, 30, fallback, &mut |_| {}), 1);
        assert!(store.is_empty());
        // A subtree that held less than its safe capacity falls back on all of it when cut off.
        store.claim("small", &wants, Holds::Reported(0.0), 80, 90, |_, _, _, _| 5.0);
        assert_eq!(store.expire(90, usize::MAX, 30, fallback, &mut |_| {}), 1);
        assert_eq!(store.get("small").unwrap().demand.has, 12.0);
        // Back, it first knows only the clients that asked it again: the reservation stays for
        // a while whatever it says, then follows what it holds.
        store.claim("small", &wants, Holds::Reported(2.0), 100, 160, |_, _, _, _| 1.0);
        store.claim("small", &wants, Holds::Reported(2.0), 100 + RETURN_GRACE - 1, 160, |_, _, _, _| 1.0);
        assert_eq!(store.get("small").unwrap().demand.has, 12.0);
        store.claim("small", &wants, Holds::Reported(2.0), 100 + RETURN_GRACE, 160, |_, _, _, _| 1.0);
        assert_eq!(store.get("small").unwrap().demand.has, 2.0);
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
        assert_eq!(expire(&mut store, 100, usize::MAX), 50);
        assert!(store.is_empty());
    }
}
