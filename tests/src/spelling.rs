//! Spellings of one value, for the property tests that check that a key cannot be dodged by
//! spelling (`key_spellings`: the sidecar's classifier; `sidecar_canonical`: the sidecar itself
//! over HTTP/1.1 and HTTP/2): values as their pieces, the ways a request may write them that an
//! upstream reads alike (escapes of either hex case or none, `+` or `%20` in a query, dot
//! segments and repeated slashes, a host's case, port and trailing dot, escaped gRPC names), and
//! the key each must land on. A spelling is steered by a stream of `choices`; where they run out,
//! the plainest spelling is taken.

use proptest::prelude::*;

/// A piece of a value: a character (which a spelling may write raw, as UTF-8) or a byte that
/// is not UTF-8 on its own (always escaped).
#[derive(Clone, Debug)]
pub enum Piece {
    Char(char),
    Byte(u8),
}

/// Values of 1 to 9 pieces: unreserved and reserved characters, characters a path or query
/// cannot hold raw, multi-byte ones, and bytes that are not UTF-8.
pub fn pieces() -> impl Strategy<Value = Vec<Piece>> {
    let chars = prop_oneof![
        prop::char::range('a', 'z'),
        prop::char::range('A', 'Z'),
        prop::char::range('0', '9'),
        prop::sample::select(vec!['-', '.', '_', '~', '!', '$', '\'', '(', ')', '*', ',', ';', ':', '@', '+', '=']),
        prop::sample::select(vec![' ', '/', '?', '#', '%', '&', '"', '<', 'é', 'ß', '中', '😀']),
    ];
    let piece = prop_oneof![4 => chars.prop_map(Piece::Char), 1 => (0x80u8..=0xFF).prop_map(Piece::Byte)];
    prop::collection::vec(piece, 1..10)
}

/// Values an upstream reads as a path segment of its own: not a dot segment.
pub fn segment_value() -> impl Strategy<Value = Vec<Piece>> {
    pieces().prop_filter("not a dot segment", |p| !matches!(bytes(p).as_slice(), b"." | b".."))
}

/// The choices a spelling is made of.
pub fn choices() -> impl Strategy<Value = Vec<bool>> {
    prop::collection::vec(any::<bool>(), 1..40)
}

/// The value's bytes.
pub fn bytes(pieces: &[Piece]) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Char(c) => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            Piece::Byte(b) => out.push(*b),
        }
    }
    out
}

/// How a key names a value: unreserved bytes as they are, the rest `%XX` in upper case.
pub fn key_of(value: &[u8]) -> String {
    value
        .iter()
        .map(|&b| match b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            true => char::from(b).to_string(),
            false => format!("%{b:02X}"),
        })
        .collect()
}

/// `b` as `%XX`, each hex digit's case from `case`.
pub fn escape(b: u8, case: &mut impl Iterator<Item = bool>) -> String {
    format!("%{b:02X}").chars().map(|c| if case.next().unwrap_or(false) { c.to_ascii_lowercase() } else { c }).collect()
}

/// `pieces` in a path segment or a query value (`query`): a character that may be written raw
/// is, or is escaped, as `choices` says; escapes' hex digits in the case it says.
pub fn value(pieces: &[Piece], query: bool, choices: &mut impl Iterator<Item = bool>) -> String {
    let mut out = String::new();
    for piece in pieces {
        match *piece {
            Piece::Char(' ') if query && choices.next().unwrap_or(false) => out.push('+'),
            Piece::Char(c) if raw(c, query) && choices.next().unwrap_or(false) => out.push(c),
            Piece::Char(c) => c.encode_utf8(&mut [0; 4]).bytes().for_each(|b| out.push_str(&escape(b, choices))),
            Piece::Byte(b) => out.push_str(&escape(b, choices)),
        }
    }
    out
}

/// Whether `c` may stand unescaped in a path segment (or a query value).
fn raw(c: char, query: bool) -> bool {
    match c {
        '/' | '?' | '#' | '%' | ' ' | '"' | '<' => false,
        '&' | '=' | '+' => !query,
        _ => true,
    }
}

/// `/s/<segment>/end`, led there with the dot segments and repeated slashes `noise` picks:
/// `segment` is segment 1 of the normalized path.
pub fn segment_path(segment: &str, noise: u8) -> String {
    let lead = ["/s/", "//s/", "/./s/", "/x/../s/", "/s/./", "/s//"][usize::from(noise % 6)];
    format!("{lead}{segment}/end")
}

/// `/q?t=<value>`, with another parameter `before` it and two `after` it.
pub fn query_path(value: &str, before: bool, after: bool) -> String {
    let mut query = Vec::new();
    if before {
        query.push("a=1".to_owned());
    }
    query.push(format!("t={value}"));
    if after {
        query.push("x=%41&b".to_owned());
    }
    format!("/q?{}", query.join("&"))
}

/// A host `name` with letters in the case `choices` says, a trailing `dot` and a `port`.
pub fn host(name: &str, choices: &mut impl Iterator<Item = bool>, dot: bool, port: Option<u16>) -> String {
    let name: String =
        name.chars().map(|c| if choices.next().unwrap_or(false) { c.to_ascii_uppercase() } else { c }).collect();
    format!("{name}{}{}", if dot { "." } else { "" }, port.map(|p| format!(":{p}")).unwrap_or_default())
}

/// A gRPC service's or method's `name` with the bytes `choices` says escaped.
pub fn grpc_name(name: &str, choices: &mut impl Iterator<Item = bool>) -> String {
    let mut spelled = String::new();
    for b in name.bytes() {
        match choices.next().unwrap_or(false) {
            true => spelled.push_str(&escape(b, choices)),
            false => spelled.push(char::from(b)),
        }
    }
    spelled
}
