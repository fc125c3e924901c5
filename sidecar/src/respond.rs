//! Every response the sidecar makes up itself, in one place: rejections by a limit, requests with
//! nowhere to go, and upstream failures. gRPC callers get a trailers-only response with the
//! matching status, everyone else a plain HTTP status with a one-line body.

use std::{fmt::Write, time::Duration};

use http::{HeaderMap, HeaderValue, Response, StatusCode, header};

use crate::{
    body::Body,
    core::{Cost, Kind},
};

/// gRPC status codes used here (grpc/doc/statuscodes.md).
mod code {
    pub const INVALID_ARGUMENT: u8 = 3;
    pub const DEADLINE_EXCEEDED: u8 = 4;
    pub const RESOURCE_EXHAUSTED: u8 = 8;
    pub const UNIMPLEMENTED: u8 = 12;
    pub const UNAVAILABLE: u8 = 14;
}

/// Whether a request is gRPC, so that it gets its errors as gRPC statuses.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The limit of `resource`, charged by `rule`, said no (SPEC §4.4): 429 with `Retry-After` and
/// the IETF RateLimit headers, or RESOURCE_EXHAUSTED with `grpc-retry-pushback-ms`.
pub fn limited(
    grpc: bool,
    resource: &str,
    rule: &str,
    kind: Kind,
    capacity: f64,
    retry_after: Duration,
) -> Response<Body> {
    let message = format!("rate limited by sluice: resource {resource:?} is over its capacity (rule {rule:?})");
    if grpc {
        let mut response = trailers_only(code::RESOURCE_EXHAUSTED, &message);
        let pushback = HeaderValue::from(u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX));
        response.headers_mut().insert("grpc-retry-pushback-ms", pushback);
        return response;
    }
    let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    let mut response = plain(StatusCode::TOO_MANY_REQUESTS, message);
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    let name = sf_string(resource);
    let quota = |window: f64| if capacity.is_finite() { (capacity * window).floor() as u64 } else { u64::MAX };
    let policy = match kind {
        // A rate below one a second is given over the window that holds one unit (0.1/s:
        // q=1;w=10), not as a quota of 0.
        Kind::Rate => {
            let window = if capacity > 0.0 && capacity < 1.0 { (1.0 / capacity).ceil() } else { 1.0 };
            // The window holds a unit by construction; a rounding error must not say 0.
            let q = if window > 1.0 { quota(window).max(1) } else { quota(window) };
            format!("{name};q={q};w={window}")
        }
        Kind::Concurrency => format!("{name};q={}", quota(1.0)),
    };
    if let Ok(v) = HeaderValue::try_from(policy) {
        headers.insert("ratelimit-policy", v);
    }
    if let Ok(v) = HeaderValue::try_from(format!("{name};r=0;t={seconds}")) {
        headers.insert("ratelimit", v);
    }
    response
}

/// A request that declared a cost above what its rule takes (`most`): a fault of the request,
/// which no retry mends, so 400 or INVALID_ARGUMENT rather than 429.
pub fn cost_too_large(grpc: bool, rule: &str, declared: f64, most: Cost) -> Response<Body> {
    // Shortest exact form: 3, 0.5, 1e300 (never a 300-digit number).
    let number = |n: f64| if n.abs() < 1e16 { format!("{n}") } else { format!("{n:e}") };
    let message = format!(
        "sluice: declared cost {} is above the {} that rule {rule:?} takes at once",
        number(declared),
        number(most.get())
    );
    if grpc { trailers_only(code::INVALID_ARGUMENT, &message) } else { plain(StatusCode::BAD_REQUEST, message) }
}

/// A request whose value for a keyed resource would make a key longer than its id leaves room
/// for (`bytes` encoded): a fault of the request, so 400 or INVALID_ARGUMENT.
pub fn key_too_long(grpc: bool, resource: &str, rule: &str, bytes: usize) -> Response<Body> {
    let message = format!(
        "sluice: the request's key for resource {resource:?} (rule {rule:?}) is {bytes} bytes encoded, too long for an id"
    );
    if grpc { trailers_only(code::INVALID_ARGUMENT, &message) } else { plain(StatusCode::BAD_REQUEST, message) }
}

/// A request for a host or listener with no configured upstream: never forwarded.
pub fn no_route(grpc: bool, host: &str) -> Response<Body> {
    let message = format!("sluice: no upstream is configured for host {host:?}");
    if grpc { trailers_only(code::UNIMPLEMENTED, &message) } else { plain(StatusCode::NOT_FOUND, message) }
}

/// The upstream could not be reached or failed mid-request.
pub fn bad_gateway(grpc: bool, upstream: &str, error: &str) -> Response<Body> {
    let message = format!("sluice: upstream {upstream:?} failed: {error}");
    if grpc { trailers_only(code::UNAVAILABLE, &message) } else { plain(StatusCode::BAD_GATEWAY, message) }
}

/// The upstream did not answer within its configured timeout.
pub fn gateway_timeout(grpc: bool, upstream: &str) -> Response<Body> {
    let message = format!("sluice: upstream {upstream:?} timed out");
    if grpc { trailers_only(code::DEADLINE_EXCEEDED, &message) } else { plain(StatusCode::GATEWAY_TIMEOUT, message) }
}

/// A request the codec could not read: malformed, or framed ambiguously.
pub fn malformed(why: &str) -> Response<Body> {
    plain(StatusCode::BAD_REQUEST, format!("sluice: malformed request: {why}"))
}

/// A request that needs what the sidecar does not do (`what`: a method, a transfer coding).
pub fn not_implemented(what: &str) -> Response<Body> {
    plain(StatusCode::NOT_IMPLEMENTED, format!("sluice: not implemented: {what}"))
}

/// A request head larger than the listener's `max_header_bytes`.
pub fn head_too_large() -> Response<Body> {
    plain(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "sluice: request head too large".to_owned())
}

/// A request head that did not arrive within the listener's `header_read_timeout`.
pub fn head_timeout() -> Response<Body> {
    plain(StatusCode::REQUEST_TIMEOUT, "sluice: request head not received in time".to_owned())
}

/// A request body that stopped arriving for the listener's `idle_timeout` while it was read.
pub fn body_timeout() -> Response<Body> {
    plain(StatusCode::REQUEST_TIMEOUT, "sluice: request body not received in time".to_owned())
}

/// A plain HTTP answer. Its `Date` is added as it is written (`h1::write_date`, and hyper's
/// HTTP/2 server).
fn plain(status: StatusCode, mut message: String) -> Response<Body> {
    message.push('\n');
    let mut response = Response::new(Body::synthetic(message));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

/// A gRPC response with no messages: HTTP 200 whose headers carry the status (gRPC's
/// "Trailers-Only" form).
fn trailers_only(status: u8, message: &str) -> Response<Body> {
    let mut response = Response::new(Body::empty());
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(u16::from(status)));
    if let Ok(v) = HeaderValue::try_from(percent_encode(message)) {
        headers.insert("grpc-message", v);
    }
    response
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
    use super::*;

    #[test]
    fn a_cost_too_large_is_the_requests_fault() {
        let http = cost_too_large(false, "writes", 1e300, Cost::ONE);
        assert_eq!(http.status(), StatusCode::BAD_REQUEST);
        let grpc = cost_too_large(true, "writes", 2.5, Cost::ONE);
        assert_eq!(grpc.headers()["grpc-status"], "3");
        assert_eq!(
            grpc.headers()["grpc-message"],
            "sluice: declared cost 2.5 is above the 1 that rule \"writes\" takes at once"
        );
    }

    #[test]
    fn the_ratelimit_policy_states_the_rate_over_a_window_that_holds_a_unit() {
        let policy = |kind, capacity| {
            let response = limited(false, "r", "rule", kind, capacity, Duration::from_secs(1));
            response.headers()["ratelimit-policy"].to_str().unwrap().to_owned()
        };
        assert_eq!(policy(Kind::Rate, 2.5), "\"r\";q=2;w=1");
        assert_eq!(policy(Kind::Rate, 0.1), "\"r\";q=1;w=10");
        assert_eq!(policy(Kind::Rate, 0.3), "\"r\";q=1;w=4");
        assert_eq!(policy(Kind::Rate, 0.0), "\"r\";q=0;w=1");
        assert_eq!(policy(Kind::Rate, 1.0 / 161.0), "\"r\";q=1;w=161");
        assert_eq!(policy(Kind::Concurrency, 3.0), "\"r\";q=3");
    }
}
