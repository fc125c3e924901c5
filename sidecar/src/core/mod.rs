//! The sans-I/O core of the sidecar: admission and leases as plain state machines driven by the
//! caller's clock (every method that needs the time takes `now`), so the proxy, the tests and a
//! simulator all run the same code.
//!
//! - [`Cost`] and [`Capacity`]: bounded amounts, what requests are charged and resources allow;
//! - [`Limiter`]: admission for one resource, a token bucket or a semaphore with a FIFO queue,
//!   and the demand it has seen;
//! - [`KeyTable`]: the live keys of a keyed resource, and [`SafeKey`], a value made safe as an id;
//! - [`LeaseClient`]: the Doorman client half, what to ask the capacity servers for and when,
//!   and what to enforce without a lease.

mod amount;
mod demand;
mod keys;
mod lease;
mod limiter;

pub use amount::{Capacity, Cost, MAX_AMOUNT};
pub use demand::HEADROOM;
pub use keys::{Key, KeyTable, MISSING, OVERFLOW, Placed, SafeKey, TooLong, could_be_key};
pub use lease::{Answer, Applied, Effective, Fallback, LeaseClient, Mode, ResourceSpec};
pub use limiter::{Kind, Limiter, MAX_QUEUED, Offer, Ticket};

/// A monotonic time in seconds, from an origin the caller chooses.
pub type Seconds = f64;
