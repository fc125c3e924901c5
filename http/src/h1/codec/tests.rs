use super::*;

/// Decodes `wire` fed in pieces of `step` bytes; the body's data, or the first error.
fn decode_in_steps(mut framing: Framing, wire: &[u8], step: usize) -> Result<Vec<u8>, Malformed> {
    let mut buf = BytesMut::new();
    let mut body = Vec::new();
    let mut pieces = wire.chunks(step);
    loop {
        match framing.decode(&mut buf)? {
            Decoded::Data(data) => body.extend_from_slice(&data),
            Decoded::End => return Ok(body),
            Decoded::More => match pieces.next() {
                Some(piece) => buf.extend_from_slice(piece),
                None => return framing.at_eof().map(|()| body),
            },
        }
    }
}

fn headers(fields: &[(&str, &str)]) -> HeaderMap {
    fields
        .iter()
        .map(|(n, v)| (HeaderName::from_bytes(n.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap()))
        .collect()
}

#[test]
fn content_length_bodies_end_at_their_length() {
    for step in [1, 3, 100] {
        assert_eq!(decode_in_steps(Framing::Length(5), b"hello", step).unwrap(), b"hello");
    }
    let mut buf = BytesMut::from(&b"hiGET / HTTP/1.1\r\n"[..]);
    let mut framing = Framing::Length(2);
    assert_eq!(framing.decode(&mut buf), Ok(Decoded::Data(Bytes::from_static(b"hi"))));
    assert_eq!(framing.decode(&mut buf), Ok(Decoded::End));
    assert_eq!(&buf[..], b"GET / HTTP/1.1\r\n", "the next message stays in the buffer");
    assert_eq!(
        decode_in_steps(Framing::Length(5), b"hel", 10),
        Err(Malformed("connection closed before the end of the body"))
    );
}

#[test]
fn chunked_bodies_decode_across_split_reads() {
    let wire = b"5;name=value;x\r\nhello\r\n1\r\n \r\nA \r\n0123456789\r\n0\r\nx-trailer: dropped\r\n\r\n";
    for step in [1, 2, 7, 1000] {
        assert_eq!(decode_in_steps(Framing::chunked(), wire, step).unwrap(), b"hello 0123456789", "step {step}");
    }
    let mut buf = BytesMut::from(&b"0\r\n\r\nnext"[..]);
    let mut framing = Framing::chunked();
    assert_eq!(framing.decode(&mut buf), Ok(Decoded::End));
    assert!(framing.is_done());
    assert_eq!(&buf[..], b"next");
}

#[test]
fn malformed_chunked_bodies_are_errors() {
    for wire in [
        &b"\r\n"[..],
        b"g\r\nx\r\n0\r\n\r\n",
        b"-1\r\n",
        b"5\r\nhelloXX0\r\n\r\n",
        b"11111111111111111\r\n",
        b"0\r\nbad\ntrailer\r\n\r\n",
        b"5;x\nhello\r\nhello\r\n0\r\n\r\n",
        b"0\r\nx: y\r\n\rGET / HTTP/1.1\r\n\r\n",
        b"5;x=\"\x00\"\r\nhello\r\n0\r\n\r\n",
    ] {
        assert!(decode_in_steps(Framing::chunked(), wire, 3).is_err(), "{:?}", String::from_utf8_lossy(wire));
    }
    let long_line = format!("5;{}\r\nhello\r\n0\r\n\r\n", "x".repeat(MAX_CHUNK_LINE));
    assert_eq!(
        decode_in_steps(Framing::chunked(), long_line.as_bytes(), 512),
        Err(Malformed("chunk size line too long"))
    );
    assert!(decode_in_steps(Framing::chunked(), b"5\r\nhel", 10).is_err(), "truncated");
}

#[test]
fn until_close_bodies_end_with_the_connection() {
    assert_eq!(decode_in_steps(Framing::UntilClose, b"all of it", 4).unwrap(), b"all of it");
}

#[test]
fn framed_headers_carry_one_length_of_the_sidecars_own() {
    let given = headers(&[
        ("content-length", "5, 5"),
        ("x-a", "1"),
        ("content-length", "5"),
        ("transfer-encoding", "chunked"),
        ("trailer", "x-checksum"),
    ]);
    let mut out = BytesMut::new();
    assert_eq!(write_framed_headers(&mut out, &given, Some(5)), Some(Framing::Length(5)));
    assert_eq!(&out[..], b"x-a: 1\r\ncontent-length: 5\r\n");
    out.clear();
    assert_eq!(write_framed_headers(&mut out, &given, None), None);
    assert_eq!(&out[..], b"x-a: 1\r\n");
    assert_eq!(write_chunked(&mut out), Framing::chunked());
    assert_eq!(&out[..], b"x-a: 1\r\ntransfer-encoding: chunked\r\n");
}

#[test]
fn content_lengths_must_agree_and_be_numbers() {
    assert_eq!(content_length(&headers(&[])), Ok(None));
    assert_eq!(content_length(&headers(&[("content-length", "42")])), Ok(Some(42)));
    assert_eq!(content_length(&headers(&[("content-length", "7, 7"), ("content-length", "7")])), Ok(Some(7)));
    for bad in ["-1", "+5", "1 2", "0x10", "", "99999999999999999999"] {
        assert!(content_length(&headers(&[("content-length", bad)])).is_err(), "{bad:?}");
    }
    assert_eq!(
        content_length(&headers(&[("content-length", "5"), ("content-length", "6")])),
        Err(Malformed("conflicting content-length values"))
    );
    let coding = |values: &[&str]| {
        transfer_coding(&headers(&values.iter().map(|v| ("transfer-encoding", *v)).collect::<Vec<_>>()))
    };
    assert_eq!(coding(&[]), None);
    assert_eq!(coding(&["Chunked"]), Some(Coding::Chunked));
    assert_eq!(coding(&["chunked,"]), Some(Coding::Chunked));
    for layered in [&["gzip, Chunked"][..], &["gzip", "chunked"], &["identity, chunked"]] {
        assert_eq!(coding(layered), Some(Coding::Layered), "{layered:?}");
    }
    for unchunked in [&["chunked, gzip"][..], &["chunked", "identity"], &["chunked, chunked"], &["gzip"], &[""]] {
        assert_eq!(coding(unchunked), Some(Coding::Unchunked), "{unchunked:?}");
    }
}

#[test]
fn heads_parse_when_complete() {
    let mut buf = BytesMut::from(&b"POST /a?b=1 HTTP/1.1\r\nHost: app\r\nX-Two: 1\r\nx-two: 2\r\n"[..]);
    assert!(parse_request(&mut buf, 1024).unwrap().is_none());
    buf.extend_from_slice(b"\r\nbody");
    let head = parse_request(&mut buf, 1024).unwrap().unwrap();
    assert_eq!((head.method, head.version), (Method::POST, Version::HTTP_11));
    assert_eq!(head.uri, "/a?b=1");
    assert_eq!(head.headers["host"], "app");
    assert_eq!(head.headers.get_all("x-two").iter().collect::<Vec<_>>(), ["1", "2"]);
    assert_eq!(&buf[..], b"body");
    // A head that does not end within the limit is never taken, whatever follows it.
    let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: app\r\nX-Long: 0123456789\r\n\r\n"[..]);
    assert!(parse_request(&mut buf, 40).unwrap().is_none());
    assert!(parse_request(&mut buf, 60).unwrap().is_some());

    let mut buf = BytesMut::from(&b"HTTP/1.0 204 No Content\r\nConnection: keep-alive\r\n\r\n"[..]);
    let head = parse_response(&mut buf, 1024).unwrap().unwrap();
    assert_eq!((head.status, head.version), (StatusCode::NO_CONTENT, Version::HTTP_10));
    assert!(keep_alive(head.version, &head.headers), "HTTP/1.0 with Connection: Keep-Alive");
    assert!(!keep_alive(
        Version::HTTP_11,
        &HeaderMap::from_iter([(http::header::CONNECTION, HeaderValue::from_static("x, Close"))])
    ));
}

fn response(status: u16, fields: &[(&str, &str)]) -> ResponseHead {
    ResponseHead { status: StatusCode::from_u16(status).unwrap(), version: Version::HTTP_11, headers: headers(fields) }
}

#[test]
fn responses_are_framed_as_rfc_9112_says() {
    let sized = [("content-length", "10")];
    assert_eq!(response_framing(&Method::HEAD, &response(200, &sized)), Ok(Framing::EMPTY));
    assert_eq!(response_framing(&Method::GET, &response(204, &[])), Ok(Framing::EMPTY));
    assert_eq!(response_framing(&Method::GET, &response(304, &sized)), Ok(Framing::EMPTY));
    assert_eq!(response_framing(&Method::GET, &response(200, &sized)), Ok(Framing::Length(10)));
    assert_eq!(
        response_framing(&Method::GET, &response(200, &[("transfer-encoding", "chunked")])),
        Ok(Framing::chunked())
    );
    // The sidecar asks for no other coding, and would pass the body on without it.
    for coding in ["gzip", "gzip, chunked"] {
        assert!(response_framing(&Method::GET, &response(200, &[("transfer-encoding", coding)])).is_err());
    }
    assert_eq!(response_framing(&Method::GET, &response(200, &[])), Ok(Framing::UntilClose));
    let both = [("transfer-encoding", "chunked"), ("content-length", "3")];
    assert!(response_framing(&Method::GET, &response(200, &both)).is_err());
    // HTTP/1.0 has no transfer codings: framing that names one is faulty, even on a 204.
    for status in [200, 204] {
        let mut old = response(status, &[("transfer-encoding", "chunked"), ("connection", "keep-alive")]);
        old.version = Version::HTTP_10;
        let refused = response_framing(&Method::GET, &old);
        assert_eq!(refused, Err(Malformed("HTTP/1.0 response with transfer-encoding")));
    }
    assert!(response_framing(&Method::GET, &response(200, &[("content-length", "3, 4")])).is_err());
}

#[test]
fn requests_are_framed_against_smuggling() {
    let framing = |version, fields: &[(&str, &str)]| request_framing(version, &headers(fields));
    assert_eq!(framing(Version::HTTP_11, &[]), Ok(Framing::EMPTY));
    assert_eq!(framing(Version::HTTP_11, &[("content-length", "3")]), Ok(Framing::Length(3)));
    assert_eq!(framing(Version::HTTP_11, &[("transfer-encoding", "chunked")]), Ok(Framing::chunked()));
    let both = [("transfer-encoding", "chunked"), ("content-length", "3")];
    assert_eq!(
        framing(Version::HTTP_11, &both),
        Err(Rejection::Malformed("both transfer-encoding and content-length".into()))
    );
    assert!(matches!(framing(Version::HTTP_10, &[("transfer-encoding", "chunked")]), Err(Rejection::Malformed(_))));
    assert!(matches!(
        framing(Version::HTTP_11, &[("transfer-encoding", "chunked, gzip")]),
        Err(Rejection::Malformed(_))
    ));
    assert_eq!(
        framing(Version::HTTP_11, &[("transfer-encoding", "gzip, chunked")]),
        Err(Rejection::NotImplemented("transfer codings other than chunked"))
    );
}

#[test]
fn the_date_line_is_an_http_date() {
    let mut out = BytesMut::new();
    write_date(&mut out);
    write_date(&mut out);
    // The second comes from the cache.
    let text = std::str::from_utf8(&out).unwrap();
    let lines: Vec<&str> = text.split_terminator("\r\n").collect();
    assert_eq!(lines.len(), 2, "{text:?}");
    for line in lines {
        assert!(line.strip_prefix("date: ").is_some_and(|d| httpdate::parse_http_date(d).is_ok()), "{text:?}");
    }
}

#[test]
fn malformed_heads_are_errors() {
    for wire in [
        &b"GET / HTTP/2.0\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nbad header\r\n\r\n",
        b"GET / HTTP/1.1\r\nx: a\x01b\r\n\r\n",
        b"G@T / HTTP/1.1\r\n\r\n",
    ] {
        assert!(parse_request(&mut BytesMut::from(wire), 1024).is_err(), "{:?}", String::from_utf8_lossy(wire));
    }
    assert!(parse_response(&mut BytesMut::from(&b"HTTP/1.1 2000 OK\r\n\r\n"[..]), 1024).is_err());
}

#[test]
fn numbers_are_written_in_their_radix() {
    let mut out = BytesMut::new();
    write_number(&mut out, 0, 10);
    out.extend_from_slice(b" ");
    write_number(&mut out, 1234567, 10);
    out.extend_from_slice(b" ");
    write_number(&mut out, 255, 16);
    assert_eq!(&out[..], b"0 1234567 FF");
}
