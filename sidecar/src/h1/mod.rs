//! The sidecar's own HTTP/1.1 (RFC 9112), kept rather than hyper's for its lower cost per
//! request: `codec` parses and writes heads and frames bodies; `server` serves the application's
//! connections (`serve`, whose request bodies are [`Inbound`]); `client` speaks to upstreams
//! over pooled connections (`Http1Pool`, whose response bodies are [`Http1Body`]). The rest of the crate, the tests and the fuzz targets use only what is
//! exported here.

mod client;
mod codec;
mod server;

pub use client::Http1Body;
pub(crate) use client::Http1Pool;
pub use codec::{
    Chunk, Coding, Decoded, Framing, Malformed, Refused, RequestHead, ResponseHead, content_length, parse_request,
    parse_response, request_framing, response_framing, transfer_coding, write_framed_headers, write_number,
};
pub use server::Inbound;
pub(crate) use server::{Limits, serve};
