//! The spare connection buffers of a thread. A connection waiting for its next request with
//! nothing of it read gives its read and write buffers back (held, they would be most of what an
//! idle connection costs, as nginx frees its keep-alive connections' buffers) and takes them
//! again when the application sends. Given back here rather than to the allocator, a busy
//! connection's buffers are used again at once instead of freed and allocated for each request;
//! at most [`SPARE_BUFFERS`] wait here, so idle connections still hold none of their own.

use std::cell::RefCell;

use bytes::BytesMut;

use crate::defaults::SPARE_BUFFERS;

/// What a connection's read and write buffers start at.
pub(super) const BUFFER: usize = 8 * 1024;

thread_local! {
    static SPARE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of at least [`BUFFER`] bytes: a spare one if this thread has one.
pub(super) fn take() -> BytesMut {
    let mut buf = SPARE.with(|spare| spare.borrow_mut().pop()).unwrap_or_default();
    buf.reserve(BUFFER);
    buf
}

/// Gives `buf` back, emptied: kept for [`take`] while there is room, else freed. (A read
/// buffer's head has been split off its front: [`take`] has the whole allocation again.)
pub(super) fn give_back(mut buf: BytesMut) {
    if buf.capacity() == 0 {
        return;
    }
    buf.clear();
    SPARE.with(|spare| {
        let mut spare = spare.borrow_mut();
        if spare.len() < SPARE_BUFFERS {
            spare.push(buf);
        }
    });
}
