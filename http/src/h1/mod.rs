//! The own HTTP/1.1 (RFC 9112), kept rather than hyper's for its lower cost per request: `codec`
//! parses and writes heads and frames bodies; `server` serves the application's connections
//! ([`serve`], whose request bodies are [`Inbound`]); `client` speaks to upstreams over pooled
//! connections ([`Http1Pool`], whose response bodies are [`Http1Body`]). The fuzz targets and the
//! differential test read the codec through what is exported here.

mod client;
mod codec;
mod inbound;
mod outbound;
mod server;
mod spare;

pub use client::{Http1Body, Http1Pool};
pub use codec::{
    Chunk, Coding, Decoded, Framing, Malformed, RequestHead, ResponseHead, content_length, parse_request,
    parse_response, request_framing, response_framing, transfer_coding, write_framed_headers, write_number,
};
pub use inbound::Inbound;
pub use server::{Limits, serve};
