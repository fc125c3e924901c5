//! Bounded amounts. What a request costs and what a resource allows come from peers and
//! operators (a request header, a capacity server's answer, the configuration); each is parsed
//! once, where it comes in, into a type that holds only what a limiter and a clock can work
//! with: finite, not negative, and at most the protocol's [`MAX_AMOUNT`], so that no sum or
//! debt of them can overflow.

pub use sluice_client::defaults::MAX_AMOUNT;

/// Cost units: 0 ..= [`MAX_AMOUNT`]. Also what a bucket holds at most (a burst).
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct Cost(f64);

impl Cost {
    pub const ONE: Cost = Cost(1.0);
    pub const MAX: Cost = Cost(MAX_AMOUNT);

    /// `value` if it is a cost: a number from 0 to [`MAX_AMOUNT`].
    pub fn new(value: f64) -> Option<Cost> {
        (0.0..=MAX_AMOUNT).contains(&value).then_some(Cost(value))
    }

    /// The cost nearest `value`: NaN and negatives are 0, anything above [`MAX_AMOUNT`] is that.
    pub fn saturating(value: f64) -> Cost {
        Cost(if value >= 0.0 { value.min(MAX_AMOUNT) } else { 0.0 })
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

/// Cost units a second (a rate) or in flight (concurrency): 0 ..= [`MAX_AMOUNT`], or no limit.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct Capacity(f64);

impl Capacity {
    pub const ZERO: Capacity = Capacity(0.0);
    pub const UNLIMITED: Capacity = Capacity(f64::INFINITY);

    /// `value` if it is a capacity: a number from 0 to [`MAX_AMOUNT`], or ∞ for no limit.
    pub fn new(value: f64) -> Option<Capacity> {
        (value == f64::INFINITY || (0.0..=MAX_AMOUNT).contains(&value)).then_some(Capacity(value))
    }

    /// The capacity nearest `value`: NaN and negatives are 0, ∞ is no limit, and finite amounts
    /// above [`MAX_AMOUNT`] are that.
    pub fn saturating(value: f64) -> Capacity {
        match value {
            f64::INFINITY => Capacity::UNLIMITED,
            v if v >= 0.0 => Capacity(v.min(MAX_AMOUNT)),
            _ => Capacity::ZERO,
        }
    }

    /// INFINITY when there is no limit.
    pub fn get(self) -> f64 {
        self.0
    }

    pub fn is_limited(self) -> bool {
        self.0.is_finite()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_are_finite_and_bounded() {
        assert_eq!(Cost::new(2.5).map(Cost::get), Some(2.5));
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e300, MAX_AMOUNT * 2.0] {
            assert_eq!(Cost::new(bad), None, "{bad}");
        }
        assert_eq!(Cost::saturating(f64::NAN), Cost::default());
        assert_eq!(Cost::saturating(1e300), Cost::MAX);
        assert_eq!(Capacity::new(f64::INFINITY), Some(Capacity::UNLIMITED));
        assert_eq!(Capacity::new(1e-25).map(Capacity::get), Some(1e-25));
        assert_eq!(Capacity::new(1e300), None);
        assert_eq!(Capacity::saturating(1e300).get(), MAX_AMOUNT);
        assert_eq!(Capacity::saturating(-3.0), Capacity::ZERO);
        assert!(!Capacity::UNLIMITED.is_limited() && Capacity::ZERO.is_limited());
    }
}
