//! Sluice's HTTP, below its policy: the own HTTP/1.1 codec, server and client ([`h1`]), HTTP/2
//! serving through hyper ([`h2`]), the accept loop that hands a listener's connections to one or
//! the other ([`serve`]), the upstream pools ([`pool`]) and the body wrappers ([`body`]). It is
//! generic over the service it serves and the bodies it carries, and knows no rules, resources
//! or configuration files: what it refuses itself is a [`Rejection`] for its user to render.
#![forbid(unsafe_code)]

pub mod body;
pub mod defaults;
pub mod h1;
pub mod h2;
pub mod pool;
mod reject;
pub mod serve;
pub mod sync;
pub mod time;

pub use reject::Rejection;
