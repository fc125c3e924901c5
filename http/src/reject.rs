//! What the HTTP layer refuses on its own, before a request reaches the service it serves.

use std::fmt;

use crate::h1::Malformed;

/// Why a request was answered by the HTTP layer itself; its user renders the answer (an HTTP
/// status, or a gRPC status for a gRPC caller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The request breaks the protocol's rules, or is framed ambiguously.
    Malformed(String),
    /// The request needs what is not done here: a method, a transfer coding.
    NotImplemented(&'static str),
    /// The request head was larger than the connection's `max_header_bytes`.
    HeadTooLarge,
    /// The request head did not arrive within the connection's `header_read_timeout`.
    HeadTimeout,
    /// The request body stopped arriving for the connection's `idle_timeout` while it was read.
    BodyTimeout,
}

impl From<Malformed> for Rejection {
    fn from(why: Malformed) -> Rejection {
        Rejection::Malformed(why.to_string())
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Malformed(why) => write!(f, "malformed: {why}"),
            Rejection::NotImplemented(what) => write!(f, "not implemented: {what}"),
            Rejection::HeadTooLarge => f.write_str("request head too large"),
            Rejection::HeadTimeout => f.write_str("request head not received in time"),
            Rejection::BodyTimeout => f.write_str("request body not received in time"),
        }
    }
}
