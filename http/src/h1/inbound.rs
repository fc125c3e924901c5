//! The read side of an application's HTTP/1.1 connection. It has one owner at a time: a
//! request body is lent the connection's reader, with what was read past the head, and hands it
//! back over a oneshot channel once it has read its end, stalled for the idle timeout, or is
//! dropped; the connection's loop watches the application (leaving, the next head) only while it
//! holds it. `100 Continue` is asked for and granted over two more, when the body is first read.

use std::{
    future::Future,
    io,
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use tokio::{io::AsyncWrite, net::tcp::OwnedReadHalf, sync::oneshot};

use super::{
    codec::{self, Decoded, Framing},
    outbound::{Timed, Watch},
};
use crate::{body::BoxError, time::Timer};

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The read side of a connection: its read half, and what was read of it and not yet taken.
pub(super) struct Reader {
    pub(super) read: OwnedReadHalf,
    pub(super) input: BytesMut,
}

impl Reader {
    /// Buffers are taken when there is something to read.
    pub(super) fn new(read: OwnedReadHalf) -> Reader {
        Reader { read, input: BytesMut::new() }
    }

    pub(super) fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        codec::poll_read_more(&mut self.read, &mut self.input, cx)
    }
}

/// What a request body hands back.
pub(super) struct Returned {
    reader: Reader,
    /// How far the body was decoded.
    framing: Framing,
    /// The body was to wait for `100 Continue` and was never read: the application may never
    /// send it.
    unasked: bool,
    /// The body stopped arriving for the idle timeout while it was read.
    stalled: bool,
}

/// A request body on an HTTP/1.1 connection of the application; `None` for a request without one.
pub struct Inbound(Option<Box<Lent>>);

/// A body that has the connection's reader, or had it.
struct Lent {
    /// The reader, and where it goes back: taken when it does.
    held: Option<(Reader, oneshot::Sender<Returned>)>,
    framing: Framing,
    /// Until `100 Continue` has gone out, for a request that asked for it.
    expect: Option<Continue>,
    idle_timeout: Duration,
    /// Runs while the body waits for bytes that have not come.
    stall: Timer,
    armed: bool,
}

/// A body's side of `Expect: 100-continue`: it asks when first read, then waits for the interim
/// response to have gone out.
struct Continue {
    ask: Option<oneshot::Sender<()>>,
    go: oneshot::Receiver<()>,
}

impl Lent {
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BoxError>>> {
        if let Some(Continue { ask, go }) = &mut self.expect {
            if let Some(ask) = ask.take() {
                let _ = ask.send(());
            }
            if ready!(Pin::new(go).poll(cx)).is_err() {
                return Poll::Ready(Some(Err("the answer came before the request body was read".into())));
            }
            self.expect = None;
        }
        let Some((reader, _)) = &mut self.held else {
            // Handed back at its end, or stalled: the connection then answers and closes.
            return if self.framing.is_done() { Poll::Ready(None) } else { Poll::Pending };
        };
        let polled = codec::poll_body(&mut reader.read, &mut reader.input, &mut self.framing, cx);
        if polled.is_pending() {
            if !self.armed {
                self.stall.start(self.idle_timeout);
                self.armed = true;
            }
            if self.stall.poll_fired(cx).is_ready() {
                self.hand_back(true);
            }
            return Poll::Pending;
        }
        self.armed = false;
        if self.framing.is_done() {
            self.hand_back(false);
        }
        polled
    }

    fn hand_back(&mut self, stalled: bool) {
        if let Some((reader, back)) = self.held.take() {
            let unasked = self.expect.as_ref().is_some_and(|c| c.ask.is_some());
            let _ = back.send(Returned { reader, framing: self.framing.clone(), unasked, stalled });
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.hand_back(false);
    }
}

impl http_body::Body for Inbound {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(lent) = &mut self.get_mut().0 else { return Poll::Ready(None) };
        lent.poll_data(cx).map(|data| data.map(|data| data.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(|lent| lent.framing.is_done())
    }

    fn size_hint(&self) -> SizeHint {
        let remaining = self.0.as_ref().map_or(Some(0), |lent| lent.framing.remaining());
        remaining.map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// The read side as the connection's loop holds it during an exchange: the reader, unless the
/// request's body has it.
pub(super) struct Input {
    pub(super) reader: Option<Reader>,
    /// The request's body as far as it was decoded, once the reader is here.
    framing: Framing,
    unasked: bool,
    /// Where a lent reader comes back.
    back: Option<oneshot::Receiver<Returned>>,
    /// The loop's side of `Expect: 100-continue`.
    expect: Option<Continuing>,
    max_header_bytes: usize,
}

/// The loop's side of `Expect: 100-continue`: once the body asks, the interim response is
/// written, then the body may read.
struct Continuing {
    ask: oneshot::Receiver<()>,
    go: oneshot::Sender<()>,
    /// How much of the interim response has gone out, once asked.
    written: Option<usize>,
}

impl Input {
    pub(super) fn holding(reader: Reader, max_header_bytes: usize) -> Input {
        Input {
            reader: Some(reader),
            framing: Framing::EMPTY,
            unasked: false,
            back: None,
            expect: None,
            max_header_bytes,
        }
    }

    /// The body of a request framed by `framing`, lent the reader if it has bytes to read;
    /// `continues` if it waits for `100 Continue`.
    pub(super) fn lend(
        reader: Reader,
        framing: Framing,
        continues: bool,
        idle_timeout: Duration,
        max_header_bytes: usize,
    ) -> (Inbound, Input) {
        let mut input = Input::holding(reader, max_header_bytes);
        if framing.is_done() {
            return (Inbound(None), input);
        }
        let (back, returns) = oneshot::channel();
        input.back = Some(returns);
        let expect = continues.then(|| {
            let ((ask, asked), (go, gone)) = (oneshot::channel(), oneshot::channel());
            input.expect = Some(Continuing { ask: asked, go, written: None });
            Continue { ask: Some(ask), go: gone }
        });
        let lent = Lent {
            held: input.reader.take().map(|reader| (reader, back)),
            framing,
            expect,
            idle_timeout,
            stall: Timer::default(),
            armed: false,
        };
        (Inbound(Some(Box::new(lent))), input)
    }

    /// Takes the reader back when the body returns it; whether the body had stalled.
    pub(super) fn poll_back(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        let Some(back) = &mut self.back else { return Poll::Pending };
        let returned = ready!(Pin::new(back).poll(cx));
        self.back = None;
        // A body returns the reader when dropped at the latest; were it lost, the connection
        // would close, its reader never here.
        Poll::Ready(returned.is_ok_and(|returned| self.take_back(returned)))
    }

    /// Whether the body had stalled.
    fn take_back(&mut self, returned: Returned) -> bool {
        self.reader = Some(returned.reader);
        self.framing = returned.framing;
        self.unasked = returned.unasked;
        returned.stalled
    }

    /// Writes `100 Continue` once the body asks for it, then lets the body read; an error if
    /// the write failed.
    pub(super) fn poll_continue(&mut self, write: &mut Timed, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(continuing) = &mut self.expect else { return Ok(()) };
        let mut written = match continuing.written {
            Some(written) => written,
            None => match Pin::new(&mut continuing.ask).poll(cx) {
                Poll::Ready(Ok(())) => 0,
                // Dropped unread.
                Poll::Ready(Err(_)) => {
                    self.expect = None;
                    return Ok(());
                }
                Poll::Pending => return Ok(()),
            },
        };
        while written < CONTINUE.len() {
            continuing.written = Some(written);
            match Pin::new(&mut *write).poll_write(cx, &CONTINUE[written..]) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => written += n,
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => return Ok(()),
            }
        }
        if let Some(continuing) = self.expect.take() {
            let _ = continuing.go.send(());
        }
        Ok(())
    }

    /// Whether the application has closed its connection while its request waits for an answer
    /// (queued by a limit, or at the upstream): the caller then drops the request, which leaves
    /// the queue or abandons the upstream exchange, as nginx and Envoy do. Only once the request
    /// body is read; what arrives meanwhile (a pipelined request) is kept, up to
    /// `max_header_bytes`.
    pub(super) fn gone(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(reader) = &mut self.reader else { return false };
        while self.framing.is_done() && reader.input.len() <= self.max_header_bytes {
            match reader.poll_read_more(cx) {
                Poll::Ready(Ok(0) | Err(_)) => return true,
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => break,
            }
        }
        false
    }

    /// Ends the request's body once its answer is in: skips what of it has already arrived,
    /// which a refused request's small body usually has, so the connection can serve the next
    /// one; not a body that waits for `100 Continue`, which the application may never send, nor
    /// one still read elsewhere. Whether the body is all read, and the reader here.
    pub(super) fn finish_body(&mut self) -> bool {
        // A body read from now on gets no `100 Continue`: the answer is in.
        self.expect = None;
        if let Some(back) = &mut self.back {
            let Ok(returned) = back.try_recv() else { return false };
            self.back = None;
            self.take_back(returned);
        }
        let Some(reader) = &mut self.reader else { return false };
        if !self.unasked {
            while let Ok(Decoded::Data(_)) = self.framing.decode(&mut reader.input) {}
        }
        self.framing.is_done()
    }
}

impl Watch for Input {
    fn left(&mut self, cx: &mut Context<'_>) -> bool {
        // A request body read to its end since gives the reader back.
        let _ = self.poll_back(cx);
        self.gone(cx)
    }
}
