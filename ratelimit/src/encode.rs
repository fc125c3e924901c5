//! One part of a resource id: every byte but the unreserved `A-Z a-z 0-9 - . _ ~`
//! percent-encoded, so that parts joined by `/` or `=` stay apart and an id holds no glob
//! character of the servers' templates.

use std::fmt::Write;

pub fn component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}
