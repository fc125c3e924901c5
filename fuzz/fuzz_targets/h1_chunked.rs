//! Chunked bodies (RFC 9112 §7.1): decoding never panics; it gives the same data and ends at the
//! same byte whatever the read boundaries; what follows the body stays in the buffer; and a body
//! re-chunked as the sidecar sends it decodes to the same data.
#![no_main]
#![forbid(unsafe_code)]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use sluice_http::h1::{Decoded, Framing, Malformed};

/// The decoded data, and how many bytes of `wire` the body took (all of them when it ended at
/// the end of the input or failed).
fn decode(wire: &[u8], step: usize) -> (Result<Vec<u8>, Malformed>, usize) {
    let mut framing = Framing::chunked();
    let mut buf = BytesMut::new();
    let mut data = Vec::new();
    let mut fed = 0;
    loop {
        match framing.decode(&mut buf) {
            Ok(Decoded::Data(d)) => {
                assert!(!d.is_empty(), "no empty data pieces");
                data.extend_from_slice(&d);
            }
            Ok(Decoded::End) => {
                assert!(framing.is_done());
                return (Ok(data), fed - buf.len());
            }
            Ok(Decoded::More) if fed < wire.len() => {
                let next = (fed + step).min(wire.len());
                buf.extend_from_slice(&wire[fed..next]);
                fed = next;
            }
            Ok(Decoded::More) => return (framing.at_eof().map(|()| data), fed),
            Err(e) => return (Err(e), fed),
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&step, wire)) = input.split_first() else { return };
    let (whole, end) = decode(wire, wire.len().max(1));
    let (stepped, stepped_end) = decode(wire, usize::from(step % 16) + 1);
    match (&whole, &stepped) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b, "the same data whatever the reads");
            assert_eq!(end, stepped_end, "the body ends at the same byte whatever the reads");
        }
        (Err(_), Err(_)) => {}
        _ => panic!("whole: {whole:?}, in steps of {}: {stepped:?}", step % 16 + 1),
    }
    if let Ok(data) = whole {
        // Re-chunked in pieces of up to 255 bytes, as the sidecar writes a body out.
        let mut out = BytesMut::new();
        for piece in data.chunks(255) {
            sluice_http::h1::write_number(&mut out, piece.len() as u64, 16);
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(piece);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        let (again, again_end) = decode(&out, 7);
        assert_eq!(again.as_deref(), Ok(&data[..]));
        assert_eq!(again_end, out.len());
    }
});
