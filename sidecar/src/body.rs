//! The bodies of the data path, each wrapper one concern: a request body metered when its rule
//! charges its bytes ([`RequestBody`]); an upstream's body streamed through and cut off when the
//! upstream sends nothing for its `body_idle_timeout` ([`UpstreamBody`]); held with the request's
//! place in flight and concurrency permits until it ends, and metered when its rule charges
//! response bytes ([`Admitted`]); or a small synthetic one ([`Body`]).

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use sluice_http::{
    body::{Downstream, Guarded, IdleTimeout},
    h1::Http1Body,
    sync::Open,
};

use crate::enforce::{Metered, Permits};

/// A request body on its way upstream, as the application's connection delivers it; metered
/// when its rule charges its bytes.
pub type RequestBody = Metered<Downstream>;

/// An upstream's response body: read off its HTTP/1.1 connection, or off its HTTP/2 stream,
/// which stays open on the upstream's connection until the body is dropped.
pub type UpstreamBody = IdleTimeout<Either<Http1Body, Guarded<Incoming, Open>>>;

/// A response body as admission hands it back: holding the request's place in flight and its
/// concurrency permits until it is dropped — for a stream, the request is in flight until its
/// last frame — and metered when its rule charges response bytes.
pub type Admitted<B> = Metered<Guarded<B, Permits>>;

/// The body of the stack's answers: made up by the sidecar, or the upstream's.
pub type Body = Either<Full<Bytes>, Admitted<UpstreamBody>>;
