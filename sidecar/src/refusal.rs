//! Every response the sidecar makes up itself, in one place. The data path's layers say why
//! they answer a request themselves with a [`Refusal`] (their error); the rescue layer at the top
//! of the stack renders it once, knowing whether the caller speaks gRPC: gRPC callers get a
//! trailers-only response with the matching status, everyone else a plain HTTP status with a
//! one-line body.

use std::{fmt, fmt::Write, sync::Arc};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{Either, Full};
use sluice_http::Rejection;

use crate::{
    body::Body,
    core::{Cost, Kind},
    enforce::Limited,
};

/// gRPC status codes used here (grpc/doc/statuscodes.md).
mod code {
    pub const INVALID_ARGUMENT: u8 = 3;
    pub const DEADLINE_EXCEEDED: u8 = 4;
    pub const RESOURCE_EXHAUSTED: u8 = 8;
    pub const UNIMPLEMENTED: u8 = 12;
    pub const UNAVAILABLE: u8 = 14;
}

/// Why the sidecar answers a request itself instead of the upstream.
#[derive(Clone, Debug)]
pub enum Refusal {
    /// A resource's limit said no (SPEC §4.4).
    Limited(Limited),
    /// The request declared a cost above what its rule takes at once (`most`).
    CostTooLarge { rule: String, declared: f64, most: Cost },
    /// The request's value for a keyed resource would make a key longer than an id has room
    /// for (`bytes` encoded).
    KeyTooLong { resource: Arc<str>, rule: String, bytes: usize },
    /// No upstream is configured for the request's host (`Host`/`:authority`).
    NoRoute { host: String },
    /// The request needs what the sidecar does not do: a method, a transfer coding.
    NotImplemented(&'static str),
    /// The request could not be read: malformed, framed ambiguously, or its body failed.
    Malformed(String),
    /// The request head was larger than the listener's `max_header_bytes`.
    HeadTooLarge,
    /// The request head did not arrive within the listener's `header_read_timeout`.
    HeadTimeout,
    /// The request body stopped arriving for the listener's `idle_timeout` while it was read.
    BodyTimeout,
    /// The upstream could not be reached or failed mid-request.
    BadGateway { upstream: String, error: String },
    /// The upstream did not answer within its configured timeout.
    GatewayTimeout { upstream: String },
    /// The listener has its `max_requests` in flight.
    Overloaded { most: usize },
}

impl From<Rejection> for Refusal {
    fn from(rejected: Rejection) -> Refusal {
        match rejected {
            Rejection::Malformed(why) => Refusal::Malformed(why),
            Rejection::NotImplemented(what) => Refusal::NotImplemented(what),
            Rejection::HeadTooLarge => Refusal::HeadTooLarge,
            Rejection::HeadTimeout => Refusal::HeadTimeout,
            Rejection::BodyTimeout => Refusal::BodyTimeout,
        }
    }
}

/// What the HTTP layer refuses, answered as the sidecar's own refusals are. The application
/// speaks HTTP/1.1 there, never gRPC (which needs HTTP/2).
pub fn reject(rejected: Rejection) -> Response<Body> {
    Refusal::from(rejected).render(false)
}

impl Refusal {
    /// The HTTP status it is answered with (a gRPC caller gets 200 and a gRPC status).
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Limited(_) => StatusCode::TOO_MANY_REQUESTS,
            Refusal::CostTooLarge { .. } | Refusal::KeyTooLong { .. } | Refusal::Malformed(_) => {
                StatusCode::BAD_REQUEST
            }
            Refusal::NoRoute { .. } => StatusCode::NOT_FOUND,
            Refusal::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            Refusal::HeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Refusal::HeadTimeout | Refusal::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Refusal::BadGateway { .. } => StatusCode::BAD_GATEWAY,
            Refusal::GatewayTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Refusal::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The gRPC status a gRPC caller gets instead: a fault of the request is one no retry
    /// mends (INVALID_ARGUMENT), unlike a limit's (RESOURCE_EXHAUSTED).
    fn grpc_code(&self) -> u8 {
        match self {
            Refusal::Limited(_) => code::RESOURCE_EXHAUSTED,
            Refusal::CostTooLarge { .. }
            | Refusal::KeyTooLong { .. }
            | Refusal::Malformed(_)
            | Refusal::HeadTooLarge => code::INVALID_ARGUMENT,
            Refusal::NoRoute { .. } | Refusal::NotImplemented(_) => code::UNIMPLEMENTED,
            Refusal::HeadTimeout | Refusal::BodyTimeout | Refusal::GatewayTimeout { .. } => code::DEADLINE_EXCEEDED,
            Refusal::BadGateway { .. } | Refusal::Overloaded { .. } => code::UNAVAILABLE,
        }
    }

    /// The synthetic response: for a gRPC caller (`grpc`), a trailers-only one.
    pub fn render(self, grpc: bool) -> Response<Body> {
        let message = self.to_string();
        if grpc {
            let mut response = trailers_only(self.grpc_code(), &message);
            if let Refusal::Limited(limited) = &self {
                let pushback = u64::try_from(limited.retry_after.as_millis()).unwrap_or(u64::MAX);
                response.headers_mut().insert("grpc-retry-pushback-ms", HeaderValue::from(pushback));
            }
            return response;
        }
        let mut response = plain(self.status(), message);
        if let Refusal::Limited(limited) = &self {
            limited.headers(response.headers_mut());
        }
        response
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Shortest exact form: 3, 0.5, 1e300 (never a 300-digit number).
        let number = |n: f64| if n.abs() < 1e16 { format!("{n}") } else { format!("{n:e}") };
        match self {
            Refusal::Limited(limited) => limited.fmt(f),
            Refusal::CostTooLarge { rule, declared, most } => write!(
                f,
                "sluice: declared cost {} is above the {} that rule {rule:?} takes at once",
                number(*declared),
                number(most.get())
            ),
            Refusal::KeyTooLong { resource, rule, bytes } => write!(
                f,
                "sluice: the request's key for resource {resource:?} (rule {rule:?}) is {bytes} bytes encoded, \
                 too long for an id"
            ),
            Refusal::NoRoute { host } => write!(f, "sluice: no upstream is configured for host {host:?}"),
            Refusal::NotImplemented(what) => write!(f, "sluice: not implemented: {what}"),
            Refusal::Malformed(why) => write!(f, "sluice: malformed request: {why}"),
            Refusal::HeadTooLarge => f.write_str("sluice: request head too large"),
            Refusal::HeadTimeout => f.write_str("sluice: request head not received in time"),
            Refusal::BodyTimeout => f.write_str("sluice: request body not received in time"),
            Refusal::BadGateway { upstream, error } => write!(f, "sluice: upstream {upstream:?} failed: {error}"),
            Refusal::GatewayTimeout { upstream } => write!(f, "sluice: upstream {upstream:?} timed out"),
            Refusal::Overloaded { most } => write!(f, "sluice: overloaded: {most} requests in flight on the listener"),
        }
    }
}

impl std::error::Error for Refusal {}

impl Limited {
    /// `Retry-After` and the IETF RateLimit headers.
    fn headers(&self, headers: &mut http::HeaderMap) {
        let Limited { resource, kind, capacity, retry_after, .. } = self;
        let capacity = *capacity;
        let seconds = sf_integer((retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0)) as f64);
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        let policy = match kind {
            // A rate below one a second is given over the window that holds one unit (0.1/s:
            // q=1;w=10), not as a quota of 0; a rate too small for any window a header can say
            // holds 0 in the longest.
            Kind::Rate => {
                let window = if capacity > 0.0 && capacity < 1.0 { sf_integer((1.0 / capacity).ceil()) } else { 1 };
                // The window holds a unit by construction; a rounding error must not say 0.
                let q = capacity * window as f64;
                let q = if window > 1 && window < SF_INTEGER_MAX { q.max(1.0) } else { q };
                let window = window as f64;
                rate_policy(resource, q, window)
            }
            Kind::Concurrency => format!("{};q={}", sf_string(resource), sf_integer(capacity)),
        };
        if let Ok(v) = HeaderValue::try_from(policy) {
            headers.insert("ratelimit-policy", v);
        }
        if let Ok(v) = HeaderValue::try_from(rate_state(resource, 0.0, seconds as f64)) {
            headers.insert("ratelimit", v);
        }
    }
}

/// The IETF `RateLimit-Policy` field of a rate: `quota` per `window` seconds.
pub fn rate_policy(name: &str, quota: f64, window: f64) -> String {
    format!("{};q={};w={}", sf_string(name), sf_integer(quota), sf_integer(window))
}

/// The IETF `RateLimit` field: `remaining` now, whole again in `reset` seconds (rounded up).
pub fn rate_state(name: &str, remaining: f64, reset: f64) -> String {
    format!("{};r={};t={}", sf_string(name), sf_integer(remaining), sf_integer(reset.ceil()))
}

/// A plain HTTP answer. Its `Date` is added as it is written (by the HTTP/1.1 codec, and by
/// hyper's HTTP/2 server).
fn plain(status: StatusCode, mut message: String) -> Response<Body> {
    message.push('\n');
    let mut response = Response::new(synthetic(message));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

/// A gRPC response with no messages: HTTP 200 whose headers carry the status (gRPC's
/// "Trailers-Only" form).
fn trailers_only(status: u8, message: &str) -> Response<Body> {
    let mut response = Response::new(synthetic(Bytes::new()));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(u16::from(status)));
    if let Ok(v) = HeaderValue::try_from(percent_encode(message)) {
        headers.insert("grpc-message", v);
    }
    response
}

fn synthetic(bytes: impl Into<Bytes>) -> Body {
    Either::Left(Full::new(bytes.into()))
}

/// gRPC's encoding of `grpc-message`: printable ASCII except `%` stays, the rest is %XX.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The largest structured-field integer (RFC 8941 §3.3.1: at most 15 digits); a parser drops
/// a header with a longer one.
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// `x` (≥ 0, or +∞) rounded down to a structured-field integer, at most [`SF_INTEGER_MAX`].
fn sf_integer(x: f64) -> u64 {
    if x >= SF_INTEGER_MAX as f64 { SF_INTEGER_MAX } else { x.max(0.0) as u64 }
}

/// A structured-field string (RFC 8941), as the RateLimit headers name their policy.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_cost_too_large_is_the_requests_fault() {
        let refusal = |declared| Refusal::CostTooLarge { rule: "writes".into(), declared, most: Cost::ONE };
        assert_eq!(refusal(1e300).render(false).status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            refusal(1e300).to_string(),
            "sluice: declared cost 1e300 is above the 1 that rule \"writes\" takes at once"
        );
        let grpc = refusal(2.5).render(true);
        assert_eq!(grpc.status(), StatusCode::OK);
        assert_eq!(grpc.headers()["grpc-status"], "3");
        assert_eq!(
            grpc.headers()["grpc-message"],
            "sluice: declared cost 2.5 is above the 1 that rule \"writes\" takes at once"
        );
    }

    #[test]
    fn each_refusal_has_its_http_status_and_grpc_code() {
        let limited = Limited {
            resource: "r".into(),
            rule: "rule".into(),
            kind: Kind::Rate,
            capacity: 1.0,
            retry_after: Duration::from_millis(1500),
        };
        let cases = [
            (Refusal::Limited(limited), 429, "8"),
            (Refusal::CostTooLarge { rule: "w".into(), declared: 2.0, most: Cost::ONE }, 400, "3"),
            (Refusal::KeyTooLong { resource: "r".into(), rule: "w".into(), bytes: 300 }, 400, "3"),
            (Refusal::NoRoute { host: "elsewhere".into() }, 404, "12"),
            (Refusal::NotImplemented("CONNECT"), 501, "12"),
            (Refusal::Malformed("bad chunk size".into()), 400, "3"),
            (Refusal::HeadTooLarge, 431, "3"),
            (Refusal::HeadTimeout, 408, "4"),
            (Refusal::BodyTimeout, 408, "4"),
            (Refusal::BadGateway { upstream: "u".into(), error: "refused".into() }, 502, "14"),
            (Refusal::GatewayTimeout { upstream: "u".into() }, 504, "4"),
            (Refusal::Overloaded { most: 1000 }, 503, "14"),
        ];
        for (refusal, status, code) in cases {
            let message = refusal.to_string();
            let limited = matches!(refusal, Refusal::Limited(_));
            let grpc = refusal.clone().render(true);
            assert_eq!(grpc.status(), StatusCode::OK, "{message}");
            assert_eq!(grpc.headers()["grpc-status"], code, "{message}");
            assert_eq!(grpc.headers().contains_key("grpc-retry-pushback-ms"), limited, "{message}");
            let plain = refusal.render(false);
            assert_eq!(plain.status().as_u16(), status, "{message}");
            assert_eq!(plain.headers().contains_key(header::RETRY_AFTER), limited, "{message}");
        }
    }

    #[test]
    fn the_ratelimit_policy_states_the_rate_over_a_window_that_holds_a_unit() {
        let policy = |kind, capacity| {
            let limited = Limited {
                resource: "r".into(),
                rule: "rule".into(),
                kind,
                capacity,
                retry_after: Duration::from_secs(1),
            };
            let response = Refusal::Limited(limited).render(false);
            response.headers()["ratelimit-policy"].to_str().unwrap().to_owned()
        };
        assert_eq!(policy(Kind::Rate, 2.5), "\"r\";q=2;w=1");
        assert_eq!(policy(Kind::Rate, 0.1), "\"r\";q=1;w=10");
        assert_eq!(policy(Kind::Rate, 0.3), "\"r\";q=1;w=4");
        assert_eq!(policy(Kind::Rate, 0.0), "\"r\";q=0;w=1");
        assert_eq!(policy(Kind::Rate, 1.0 / 161.0), "\"r\";q=1;w=161");
        assert_eq!(policy(Kind::Concurrency, 3.0), "\"r\";q=3");
        // Every integer within RFC 8941's 15 digits, however small or large the capacity.
        assert_eq!(policy(Kind::Rate, 1e-25), "\"r\";q=0;w=999999999999999");
        assert_eq!(policy(Kind::Rate, 1e-15), "\"r\";q=0;w=999999999999999");
        assert_eq!(policy(Kind::Rate, 2e-15), "\"r\";q=1;w=500000000000000");
        assert_eq!(policy(Kind::Rate, 1e15), "\"r\";q=999999999999999;w=1");
        assert_eq!(policy(Kind::Rate, f64::INFINITY), "\"r\";q=999999999999999;w=1");
        assert_eq!(policy(Kind::Concurrency, f64::INFINITY), "\"r\";q=999999999999999");
    }
}
