//! Priority bands (SPEC §3.7): a resource's demands grouped by priority, and capacity shared
//! band by band from the most important down.
//!
//! Sharing is always strict over the bands present; `priority_mode: ignore` (Doorman's
//! behaviour) simply files every demand in one band, so one code path serves both modes. A
//! child server's claim may span several bands, one per priority of its clients, and, under
//! `subtree_wants: profile`, hold several demands in one band: groups of its clients that want
//! about as much each, so that the water level cuts each group where it would cut its clients.

use std::{collections::BTreeMap, ops::Bound};

use super::{
    algorithm::{self, Choice, Kind},
    band::{Band, Demand, Sums},
};

/// How a resource treats its clients' priorities (the template parameter `priority_mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PriorityMode {
    /// Higher priorities are served in full before lower ones get anything. The default: a
    /// client that sends a priority means it, and when every client sends the same one this is
    /// exactly Doorman's behaviour.
    #[default]
    Strict,
    /// Every client in one band, whatever its priority (Doorman's behaviour).
    Ignore,
}

impl Choice for PriorityMode {
    const NAME: &'static str = "priority_mode";
    const VALUES: &'static [(&'static str, Self)] = &[("strict", Self::Strict), ("ignore", Self::Ignore)];
}

/// What a client, or one group of a child server's clients, wants in one priority band.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Wants {
    /// Higher is more important.
    pub priority: i64,
    /// Finite and ≥ 0.
    pub wants: f64,
    /// The weight: 1 for an end client, the number of clients in a server's group; > 0.
    pub subclients: f64,
}

/// How a parent counts a child server's demand in a band (the template parameter
/// `subtree_wants`; the parent's algorithm, and so the setting, holds for the whole tree).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SubtreeWants {
    /// Doorman's: as its number of clients wanting its band's total. A child's clients then
    /// share a level of their own: where some want little, the others get more than the level
    /// elsewhere in the tree. Each child's share moves only when its total does, so capacity
    /// rarely has to cross the tree.
    #[default]
    Sum,
    /// By its profile (`PriorityBandAggregate.profile`, which children then send): max-min
    /// fairness over every end client of the tree, to within the profile's groups. Every change
    /// of a modest client's wants then moves capacity between subtrees, and a pull protocol
    /// leaves capacity in transit meanwhile: `docs/simulation.md` measures the cost.
    Profile,
}

impl Choice for SubtreeWants {
    const NAME: &'static str = "subtree_wants";
    const VALUES: &'static [(&'static str, Self)] = &[("sum", Self::Sum), ("profile", Self::Profile)];
}

/// Files a claim's wants: one demand per entry, most important first. Under `priority_mode:
/// ignore` every entry goes to band 0. Entries that land in one band are summed into one
/// demand, as Doorman counts them — except a child's groups under `subtree_wants: profile`,
/// each cut at the water level on its own.
pub fn file(mode: PriorityMode, subtree: SubtreeWants, wants: &[Wants]) -> smallvec::SmallVec<[Wants; 1]> {
    let mut filed = smallvec::SmallVec::<[Wants; 1]>::new();
    for w in wants {
        let priority = if mode == PriorityMode::Ignore { 0 } else { w.priority };
        match filed.iter_mut().find(|f| f.priority == priority).filter(|_| subtree == SubtreeWants::Sum) {
            Some(f) => {
                f.wants += w.wants;
                f.subclients += w.subclients;
            }
            None => filed.push(Wants { priority, ..*w }),
        }
    }
    filed.sort_by_key(|w| std::cmp::Reverse(w.priority));
    filed
}

/// A resource's bands, by priority.
#[derive(Clone, Debug, Default)]
pub struct Bands {
    bands: BTreeMap<i64, Band>,
    /// Seeds new bands' trees when set, so that a simulation replays exactly.
    seed: Option<u64>,
}

impl Bands {
    pub fn seeded(seed: Option<u64>) -> Bands {
        Bands { bands: BTreeMap::new(), seed }
    }

    /// Sums over every band.
    pub fn sums(&self) -> Sums {
        self.bands.values().map(Band::sums).fold(Sums::default(), Sums::plus)
    }

    /// The bands, most important first.
    pub fn iter(&self) -> impl Iterator<Item = (i64, &Band)> {
        self.bands.iter().rev().map(|(&p, b)| (p, b))
    }

    pub fn get(&self, priority: i64) -> Option<&Band> {
        self.bands.get(&priority)
    }

    pub(crate) fn band_mut(&mut self, priority: i64) -> &mut Band {
        let seed = self.seed;
        self.bands.entry(priority).or_insert_with(|| match seed {
            Some(seed) => Band::with_seed(seed ^ priority as u64),
            None => Band::default(),
        })
    }

    /// Takes a demand out of its band, dropping the band once empty (so that walks over the
    /// bands stay as short as the priorities in use).
    pub(crate) fn remove(&mut self, priority: i64, node: super::band::NodeId) -> Demand {
        let band = self.bands.get_mut(&priority).expect("a lease's band exists");
        let demand = band.remove(node);
        if band.is_empty() {
            self.bands.remove(&priority);
        }
        demand
    }

    /// What the bands more important than `priority` leave of `capacity`.
    fn capacity_below(&self, priority: i64, capacity: f64) -> f64 {
        let above: f64 =
            self.bands.range((Bound::Excluded(priority), Bound::Unbounded)).map(|(_, b)| b.sums().wants).sum();
        (capacity - above).max(0.0)
    }

    /// The algorithm's target for a client whose demands (`mine`, already in the bands) may
    /// span several bands and groups: for each, its share of what the bands above leave.
    pub fn target(&self, kind: Kind, capacity: f64, mine: &[(i64, Demand)]) -> f64 {
        let wants: f64 = mine.iter().map(|(_, d)| d.wants).sum();
        match kind {
            // Neither divides one capacity, so there is nothing for priorities to order.
            Kind::NoAlgorithm => wants,
            Kind::Static => wants.min(capacity),
            // Filed most important first, so each band's demands (a profile's groups) are
            // together: one share of what the bands above leave per band.
            Kind::ProportionalShare | Kind::FairShare => mine
                .chunk_by(|a, b| a.0 == b.0)
                .map(|run| {
                    let priority = run[0].0;
                    let band = self.get(priority).expect("a claim's demands are in their bands");
                    algorithm::target(kind, self.capacity_below(priority, capacity), band, run.iter().map(|(_, d)| d))
                })
                .sum(),
        }
    }
}
