//! The four ways of dividing a resource's capacity (SPEC §3.3). Each computes a client's
//! *target* from the band of demands, the client's own new demand already in it; the resource
//! then caps the target by what is actually free.

use super::band::{Band, Demand};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Everyone gets what they ask for; capacity is ignored.
    NoAlgorithm,
    /// Capacity is a per-client ceiling, not a global cap.
    Static,
    /// Equal shares, and the capacity left by modest clients goes to the others in proportion
    /// to how far they are over their share.
    ProportionalShare,
    /// Weighted max-min fairness, computed exactly.
    FairShare,
}

impl Kind {
    /// The name Doorman's protocol and configuration use.
    pub fn name(self) -> &'static str {
        match self {
            Kind::NoAlgorithm => "NO_ALGORITHM",
            Kind::Static => "STATIC",
            Kind::ProportionalShare => "PROPORTIONAL_SHARE",
            Kind::FairShare => "FAIR_SHARE",
        }
    }

    /// The kind Doorman's name stands for.
    pub fn from_name(name: &str) -> Option<Kind> {
        [Kind::NoAlgorithm, Kind::Static, Kind::ProportionalShare, Kind::FairShare]
            .into_iter()
            .find(|k| k.name() == name)
    }

    /// Whether the algorithm divides one global capacity among the clients. Only those have
    /// outstanding leases to respect, and so a learning mode.
    pub fn shares_capacity(self) -> bool {
        matches!(self, Kind::ProportionalShare | Kind::FairShare)
    }
}

/// A named algorithm parameter, kept as written (Doorman's `NamedParameter`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parameter {
    pub name: String,
    pub value: Option<String>,
}

/// A template parameter that picks one of a few named behaviours; a repository only holds
/// valid values (`Repository::new` checks them with [`Choice::parse`]).
pub trait Choice: Copy + Default + PartialEq + 'static {
    /// The parameter's name.
    const NAME: &'static str;
    /// Each value as written, and what it stands for.
    const VALUES: &'static [(&'static str, Self)];

    fn parse(value: Option<&str>) -> Result<Self, String> {
        let expected = Self::VALUES.iter().map(|(name, _)| format!("{name:?}")).collect::<Vec<_>>().join(" or ");
        let found = Self::VALUES.iter().find(|(name, _)| Some(*name) == value).map(|&(_, choice)| choice);
        found.ok_or_else(|| match value {
            Some(other) => format!("must be {expected}, got {other:?}"),
            None => format!("must be {expected}, got no value"),
        })
    }

    /// The behaviour `algorithm` names, else the default.
    fn of(algorithm: &Algorithm) -> Self {
        algorithm
            .parameters
            .iter()
            .find(|p| p.name == Self::NAME)
            .and_then(|p| Self::parse(p.value.as_deref()).ok())
            .unwrap_or_default()
    }

    /// The value as written.
    fn name(self) -> &'static str {
        Self::VALUES.iter().find(|(_, choice)| *choice == self).map_or("", |(name, _)| name)
    }
}

/// How a template's resources are shared, and for how long a grant holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Algorithm {
    pub kind: Kind,
    /// Seconds a lease is valid.
    pub lease_length: i64,
    /// Seconds after which clients should ask again.
    pub refresh_interval: i64,
    pub parameters: Vec<Parameter>,
    /// Seconds of learning mode after the server starts serving; `None` means `lease_length`.
    pub learning_mode_duration: Option<i64>,
}

impl Algorithm {
    /// Seconds of learning mode, 0 when there is none.
    pub fn learning_seconds(&self) -> i64 {
        if self.kind.shares_capacity() { self.learning_mode_duration.unwrap_or(self.lease_length) } else { 0 }
    }
}

/// What one client's demands in `band` (`mine`, already in it: one, or the groups of a child
/// server's profile) should get together from `capacity`. The band's water level and sums are
/// taken once, however many groups.
pub fn target<'a>(kind: Kind, capacity: f64, band: &Band, mine: impl IntoIterator<Item = &'a Demand>) -> f64 {
    let mine = mine.into_iter();
    match kind {
        Kind::NoAlgorithm => mine.map(|d| d.wants).sum(),
        Kind::Static => mine.map(|d| d.wants).sum::<f64>().min(capacity),
        Kind::ProportionalShare => mine.map(proportional_share(capacity, band)).sum(),
        Kind::FairShare => {
            let level = band.water_level(capacity);
            mine.map(|d| level.map_or(d.wants, |level| d.wants.min(level * d.subclients))).sum()
        }
    }
}

/// PROPORTIONAL_SHARE's target for one demand in `band`, given `capacity`.
fn proportional_share(capacity: f64, band: &Band) -> impl Fn(&Demand) -> f64 {
    let total = band.sums();
    let equal = capacity / total.subclients;
    let (spare, excess) = if total.wants <= capacity {
        (0.0, 0.0)
    } else {
        let below = band.sums_up_to(equal);
        // What the clients under their equal share leave unused...
        let spare = (equal * below.subclients - below.wants).max(0.0);
        // ...goes to the clients over it, in proportion to their excess. The excess of all
        // clients over their shares is the spare plus the total overload, positive here.
        (spare, spare + (total.wants - capacity))
    };
    move |me: &Demand| {
        let entitled = equal * me.subclients;
        if excess == 0.0 || me.wants <= entitled {
            return me.wants;
        }
        // The ratio first: it is at most 1, so the product stays finite for any finite wants.
        entitled + (me.wants - entitled) * (spare / excess)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proportional_share_stays_exact_with_enormous_wants() {
        let mut band = Band::default();
        for wants in [10.0, 60.0, 50.0] {
            band.insert(Demand { wants, subclients: 1.0, has: 0.0 });
        }
        let huge = Demand { wants: 1e308, subclients: 1.0, has: 0.0 };
        band.insert(huge);
        // e = 25; the client wanting 10 leaves 15, shared by excess: nearly all to the huge one.
        let target = target(Kind::ProportionalShare, 100.0, &band, [&huge]);
        assert!((target - 40.0).abs() < 1e-9, "{target}");
        // Even when Σ wants overflows, the target stays finite and within the capacity.
        band.insert(huge);
        let target = super::target(Kind::ProportionalShare, 100.0, &band, [&huge]);
        assert!(target.is_finite() && target <= 100.0, "{target}");
    }
}
