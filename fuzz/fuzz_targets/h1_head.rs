//! HTTP/1.1 heads, requests and responses: parsing never panics, whatever the bytes and however
//! they arrive; a head is taken the same whether it came whole or byte by byte, and exactly its
//! bytes leave the buffer; the framing read from its fields is one of RFC 9112's, and a head
//! written back with a length parses again to the same fields and that length.
#![no_main]
#![forbid(unsafe_code)]

use bytes::BytesMut;
use http::HeaderMap;
use libfuzzer_sys::fuzz_target;
use sluice_http::h1;

const MAX_HEAD: usize = 8 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, wire)) = data.split_first() else { return };
    if selector & 1 == 0 {
        check(wire, |buf| h1::parse_request(buf, MAX_HEAD).map(|h| h.map(|h| h.headers)));
    } else {
        check(wire, |buf| h1::parse_response(buf, MAX_HEAD).map(|h| h.map(|h| h.headers)));
    }
});

type Parse = fn(&mut BytesMut) -> Result<Option<HeaderMap>, h1::Malformed>;

fn check(wire: &[u8], parse: Parse) {
    let mut whole = BytesMut::from(wire);
    let outcome = parse(&mut whole);
    if let Ok(Some(headers)) = &outcome {
        let taken = wire.len() - whole.len();
        assert!(taken <= MAX_HEAD, "a head longer than the limit was taken");
        assert_eq!(&wire[taken..], &whole[..], "only the head leaves the buffer");
        framing(headers);
    }
    // Fed a byte at a time, a head is refused or taken at the same point: no read boundary
    // changes where it ends.
    let mut piecewise = BytesMut::new();
    for &b in wire {
        piecewise.extend_from_slice(&[b]);
        let before = piecewise.len();
        match parse(&mut piecewise) {
            Ok(None) => {}
            Ok(Some(_)) => {
                let taken = before - piecewise.len();
                assert!(
                    matches!(&outcome, Ok(Some(_)) if wire.len() - whole.len() == taken),
                    "byte by byte took a head of {taken} bytes; whole: {:?}",
                    outcome.map(|h| h.map(|_| wire.len() - whole.len()))
                );
                return;
            }
            Err(e) => {
                assert!(outcome.is_err(), "byte by byte refused ({e}) what whole parsing did not");
                return;
            }
        }
    }
    assert!(matches!(outcome, Ok(None)), "whole parsing ended a head that byte by byte did not");
}

/// The body framing a head asks for, and its head written back out with a length.
fn framing(headers: &HeaderMap) {
    let length = h1::content_length(headers);
    if let Ok(Some(n)) = length {
        let mut out = BytesMut::from(&b"HTTP/1.1 200 OK\r\n"[..]);
        assert_eq!(h1::write_framed_headers(&mut out, headers, Some(n)), Some(h1::Framing::Length(n)));
        out.extend_from_slice(b"\r\n");
        let written = h1::parse_response(&mut out, usize::MAX).expect("a head written parses").expect("whole");
        assert_eq!(h1::content_length(&written.headers), Ok(Some(n)));
        assert_eq!(h1::transfer_coding(&written.headers), None);
        let kept = |h: &HeaderMap| {
            h.iter()
                .filter(|(name, _)| !matches!(name.as_str(), "content-length" | "transfer-encoding" | "trailer"))
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(kept(&written.headers), kept(headers), "fields other than the framing pass unchanged");
    }
}
