//! The one reading of each request attribute that rules match and keys are made of (SPEC §4.2):
//! a path, a path segment, a query parameter, a header, the host. Every spelling that an
//! upstream reads as the same value reads the same here, whichever protocol carried the request,
//! and values that an upstream reads differently stay different, so that a caller can neither
//! split one tenant's limit over many keys nor charge another tenant's. An attribute that has
//! no single reading (a header or query parameter given twice with different values, a stray
//! `%`) is [`Ambiguous`]: the request is refused rather than charged to a guess.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, Request, Version, header};

/// Whether a request is gRPC: what gRPC rules match, and the form of the sidecar's own answers.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// An attribute upstreams read in more than one way; the request is refused (400).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ambiguous(pub String);

/// Why `req` is malformed as the protocol that carried it defines it, if it is. HTTP/1.1's
/// parser already trims a field value's optional whitespace; HTTP/2 has none (RFC 9113
/// §8.2.1: a value with leading or trailing whitespace is malformed), and a Host header beside
/// `:authority` must name the same (§8.3.1). Upstreams trim such a value: kept, it would match
/// no rule and make a key of every padding.
pub fn malformed<B>(req: &Request<B>) -> Option<String> {
    let padded = |v: &[u8]| matches!(v.first(), Some(b' ' | b'\t')) || matches!(v.last(), Some(b' ' | b'\t'));
    if let Some((name, _)) = req.headers().iter().find(|(_, v)| padded(v.as_bytes())) {
        return Some(format!("the value of header {name} begins or ends with whitespace"));
    }
    if req.version() == Version::HTTP_2
        && let (Some(authority), Some(host)) = (req.uri().authority(), req.headers().get(header::HOST))
        && !authority.as_str().as_bytes().eq_ignore_ascii_case(host.as_bytes())
    {
        return Some("the Host header and :authority differ".to_owned());
    }
    None
}

/// The one value of header `name`, if the request has it: its field lines must agree (an
/// upstream may read the first, the last or all of them). Cookie crumbs, which HTTP/2 splits
/// one Cookie header into (RFC 9113 §8.2.3), are joined back as HTTP/1.1 carries them.
pub fn header<'r>(headers: &'r HeaderMap, name: &HeaderName) -> Result<Option<Cow<'r, [u8]>>, Ambiguous> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    let Some(second) = values.next() else {
        return Ok(Some(Cow::Borrowed(first.as_bytes())));
    };
    if name == header::COOKIE {
        let crumbs: Vec<&[u8]> = headers.get_all(name).iter().map(|v| v.as_bytes()).collect();
        return Ok(Some(Cow::Owned(crumbs.join(&b"; "[..]))));
    }
    if second == first && values.all(|v| v == first) {
        Ok(Some(Cow::Borrowed(first.as_bytes())))
    } else {
        Err(Ambiguous(format!("header {name} is given more than once, with different values")))
    }
}

/// The value of query parameter `name`, decoded as `application/x-www-form-urlencoded` (`+`
/// is a space, escapes of either hex case are their byte) into bytes, not text: values that
/// are not UTF-8 stay apart. Names are compared decoded, so `%74=x` is `t=x`. A parameter given
/// twice with different values, or a `%` that starts no escape, has no single reading.
pub fn query<'r>(query: Option<&'r str>, name: &str) -> Result<Option<Cow<'r, [u8]>>, Ambiguous> {
    let Some(query) = query else {
        return Ok(None);
    };
    if !escapes_valid(query) {
        return Err(Ambiguous("a stray % in the query".to_owned()));
    }
    let mut found: Option<Cow<'r, [u8]>> = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
        if form_decoded(n) != name.as_bytes() {
            continue;
        }
        let value = form_decoded(v);
        match &found {
            None => found = Some(value),
            Some(earlier) if *earlier == value => {}
            Some(_) => {
                return Err(Ambiguous(format!(
                    "query parameter {name:?} is given more than once, with different values"
                )));
            }
        }
    }
    Ok(found)
}

/// `text` with `+` read as a space and every escape decoded (`%2B` is a `+` that stays one).
fn form_decoded(text: &str) -> Cow<'_, [u8]> {
    match text.contains('+') {
        true => Cow::Owned(decode_with(text, true)),
        false => decoded(text),
    }
}

/// `text` with every `%XX` escape decoded into its byte; a `%` that starts no escape is kept.
/// Borrowed when there is nothing to decode.
pub fn decoded(text: &str) -> Cow<'_, [u8]> {
    if !text.contains('%') {
        return Cow::Borrowed(text.as_bytes());
    }
    Cow::Owned(decode_with(text, false))
}

fn decode_with(text: &str, plus_is_space: bool) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if let Some(b) = escape(bytes, i) => {
                out.push(b);
                i += 3;
                continue;
            }
            b'+' if plus_is_space => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// The byte of the escape `%XX` at `at`, if it is one.
fn escape(bytes: &[u8], at: usize) -> Option<u8> {
    let hex = bytes.get(at + 1..at + 3)?;
    let digit = |d: u8| char::from(d).to_digit(16);
    Some((digit(hex[0])? * 16 + digit(hex[1])?) as u8)
}

/// Whether every `%` in `text` starts a percent-encoded octet (RFC 3986 §2.1). A path with a
/// stray one is refused before it is matched: `/%2%65` decodes once to `/%2e`, and twice (as
/// some upstreams do) to `/.`, so no single reading of it is the upstream's.
pub fn escapes_valid(text: &str) -> bool {
    let bytes = text.as_bytes();
    (0..bytes.len()).filter(|&i| bytes[i] == b'%').all(|i| escape(bytes, i).is_some())
}

/// The path rules are matched against, each byte in one spelling: escaped (`%XX`, upper case)
/// unless it is unreserved, a sub-delimiter, `:` or `@` (RFC 3986 §3.3), which stand as
/// themselves however they came; a `/` as it came, since `%2F` is no separator. Then dot
/// segments are removed and repeated slashes merged (§6.2.2, Envoy's `normalize_path` and
/// `merge_slashes`). So `//api/./x`, `/y/../api/x`, `/%61pi/x` and `/api%2fx`'s
/// `/api%2Fx` are charged as their one spelling is, whatever the upstream makes of them, and
/// `/café` as `/caf%C3%A9`. The request itself goes upstream unchanged. Rules' exact and
/// prefix paths are read the same way when the configuration is read; globs match this form.
pub fn path(path: &str) -> Cow<'_, str> {
    let plain = path.bytes().all(|b| b == b'/' || stands_raw(b));
    if !path.starts_with('/') || plain && !(path.contains("//") || path.contains("/.")) {
        return Cow::Borrowed(path);
    }
    let spelled = respelled(path);
    let segments: Vec<&str> = spelled.split('/').skip(1).collect();
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *segment {
            "." | "" if !last => {}
            ".." => {
                out.pop();
                if last {
                    out.push("");
                }
            }
            "." => out.push(""),
            s => out.push(s),
        }
    }
    Cow::Owned(format!("/{}", out.join("/")))
}

/// Whether byte `b` of a path stands as itself in [`path`]'s spelling.
fn stands_raw(b: u8) -> bool {
    RAW[usize::from(b)]
}

/// [`stands_raw`] as a table: every path's bytes are looked up.
const RAW: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'@'
            );
        b += 1;
    }
    table
};

/// `path` with each byte in [`path`]'s spelling.
fn respelled(path: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let (b, width) = match (bytes[i] == b'%').then(|| escape(bytes, i)).flatten() {
            Some(b) => (b, 3),
            None => (bytes[i], 1),
        };
        if stands_raw(b) || b == b'/' && width == 1 {
            out.push(char::from(b));
        } else {
            out.extend(['%', char::from(HEX[usize::from(b >> 4)]), char::from(HEX[usize::from(b & 15)])]);
        }
        i += width;
    }
    out
}

/// Segment `n` (0: the first after the leading `/`) of a [`path`]-normalized path, with every
/// escape decoded: `%C3%A9`, `%c3%a9` and a raw `é` are the same two bytes, as every upstream
/// that decodes its path reads them; `%2F` is a `/` within the segment.
pub fn segment(normalized: &str, n: usize) -> Option<Cow<'_, [u8]>> {
    normalized.split('/').nth(n.checked_add(1)?).map(decoded)
}

/// The request's host: `:authority` for HTTP/2 and an absolute-form target, else the Host
/// header; without its port, in lower case, and without the trailing dot of a fully qualified
/// name (DNS names are case-insensitive, and `example.com.` is `example.com`).
pub fn host<B>(req: &Request<B>) -> Cow<'_, str> {
    let authority = req.uri().host().or_else(|| req.headers().get(header::HOST)?.to_str().ok());
    host_name(authority.unwrap_or_default())
}

/// [`host`]'s form of a host name, with or without a port (configured hosts are read so too).
pub fn host_name(authority: &str) -> Cow<'_, str> {
    // Strip a port, but not the colons of a bracketed IPv6 literal.
    let name = match authority.rsplit_once(':') {
        Some((h, port)) if !h.is_empty() && !port.contains(']') && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    };
    let name = name.strip_suffix('.').filter(|n| !n.is_empty()).unwrap_or(name);
    match name.bytes().any(|b| b.is_ascii_uppercase()) {
        true => Cow::Owned(name.to_ascii_lowercase()),
        false => Cow::Borrowed(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stray_percent_sign_is_no_escape() {
        for ok in ["/", "/a%2Fb", "/%61%7e", "/a%2e%2E/b", "/x%20y"] {
            assert!(escapes_valid(ok), "{ok}");
        }
        for bad in ["/%2%65", "/%", "/a%2", "/%zz", "/%+5", "/%-1/b"] {
            assert!(!escapes_valid(bad), "{bad}");
        }
    }

    #[test]
    fn paths_are_normalized() {
        for (raw, expected) in [
            ("/a/b", "/a/b"),
            ("/a/./b/../c", "/a/c"),
            ("//a///b", "/a/b"),
            ("/a/b/..", "/a/"),
            ("/a/.", "/a/"),
            ("/a/", "/a/"),
            ("/../../a", "/a"),
            ("/%61%2D%7e/%2e%2E/b", "/b"),
            ("/a%2fb/caf%c3%A9", "/a%2Fb/caf%C3%A9"),
            ("/café/%21%3a/%3F%20\"", "/caf%C3%A9/!:/%3F%20%22"),
            ("/%25/%", "/%25/%25"),
            ("/.well-known/x", "/.well-known/x"),
            ("*", "*"),
        ] {
            assert_eq!(path(raw), expected, "{raw}");
            assert_eq!(path(expected), expected, "idempotent: {raw}");
        }
    }

    #[test]
    fn segments_are_decoded_whole() {
        let spellings = ["/t/caf%C3%A9/x", "/t/caf%c3%a9/x", "/t/caf%C3%a9", "/t/café", "/t/%63af%c3%A9"];
        for spelling in spellings {
            assert_eq!(segment(&path(spelling), 1).as_deref(), Some("café".as_bytes()), "{spelling}");
        }
        assert_eq!(segment(&path("/t/a%2fb"), 1).as_deref(), Some(&b"a/b"[..]));
        assert_eq!(segment("/t", 1), None);
        assert_eq!(segment("/t", usize::MAX), None);
    }

    #[test]
    fn query_values_are_bytes_read_once() {
        let q = |text: &str, name: &str| query(Some(text), name).map(|v| v.map(Cow::into_owned));
        assert_eq!(q("a=1&t=a%20b+c", "t"), Ok(Some(b"a b c".to_vec())));
        assert_eq!(q("%74=x", "t"), Ok(Some(b"x".to_vec())));
        assert_eq!(q("t=%2B", "t"), Ok(Some(b"+".to_vec())));
        assert_eq!(q("t=%FF", "t"), Ok(Some(vec![0xFF])));
        assert_ne!(q("t=%FF", "t"), q("t=%FE", "t"), "not UTF-8, still apart");
        assert_eq!(q("t=x&t=x", "t"), Ok(Some(b"x".to_vec())));
        assert_eq!(q("t", "t"), Ok(Some(Vec::new())));
        assert_eq!(q("u=1", "t"), Ok(None));
        assert!(q("t=a&t=b", "t").is_err());
        assert!(q("t=%zz", "t").is_err());
        assert_eq!(query(None, "t"), Ok(None));
    }

    #[test]
    fn a_header_has_one_value_or_none() {
        let name = HeaderName::from_static("x-tenant");
        let mut headers = HeaderMap::new();
        assert_eq!(header(&headers, &name), Ok(None));
        headers.append(&name, "acme".parse().unwrap());
        assert_eq!(header(&headers, &name).unwrap().as_deref(), Some(&b"acme"[..]));
        headers.append(&name, "acme".parse().unwrap());
        assert_eq!(header(&headers, &name).unwrap().as_deref(), Some(&b"acme"[..]));
        headers.append(&name, "other".parse().unwrap());
        assert!(header(&headers, &name).is_err());
        headers.append(header::COOKIE, "a=1".parse().unwrap());
        headers.append(header::COOKIE, "b=2".parse().unwrap());
        assert_eq!(header(&headers, &header::COOKIE).unwrap().as_deref(), Some(&b"a=1; b=2"[..]));
    }

    #[test]
    fn hosts_are_read_alike() {
        for spelling in ["api.example", "API.Example", "api.example:8080", "api.example.", "Api.Example.:443"] {
            assert_eq!(host_name(spelling), "api.example", "{spelling}");
        }
        assert_eq!(host_name("[::1]:80"), "[::1]");
        assert_eq!(host_name("[::1]"), "[::1]");
        assert_eq!(host_name("."), ".");
    }

    #[test]
    fn padded_http2_fields_and_a_second_host_are_malformed() {
        let h2 = |f: fn(http::request::Builder) -> http::request::Builder| {
            malformed(&f(Request::get("http://a.example/").version(Version::HTTP_2)).body(()).unwrap())
        };
        assert_eq!(h2(|r| r.header("x-tenant", "acme")), None);
        assert!(h2(|r| r.header("x-tenant", " acme")).is_some());
        assert!(h2(|r| r.header("x-tenant", "acme\t")).is_some());
        assert_eq!(h2(|r| r.header("x-tenant", "a c")), None, "inner whitespace is the value's");
        assert_eq!(h2(|r| r.header("host", "A.example")), None);
        assert!(h2(|r| r.header("host", "b.example")).is_some());
    }
}
