//! Raw sockets for tests that need exact bytes on the wire: a client that writes what it is given
//! and reads what comes back, and an upstream that records every byte it receives, connection by
//! connection, and answers as its test tells it to.

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

/// A connection to `addr` whose reads and writes give up after 20 s, so that a peer that stops
/// answering fails the test rather than hanging it.
pub fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    stream
}

/// Reads one response head and its `content-length` body; returns the status code.
pub fn response(stream: &mut TcpStream) -> u16 {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).expect("read a response");
        assert!(n > 0, "closed before a whole response: {:?}", String::from_utf8_lossy(&bytes));
        bytes.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let Some(end) = text.find("\r\n\r\n") else { continue };
        let length = text[..end]
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
            .unwrap_or(0usize);
        if bytes.len() >= end + 4 + length {
            return text[9..12].parse().expect("a status code");
        }
    }
}

/// Reads until the peer closes (or resets); everything it sent.
pub fn read_all(stream: &mut TcpStream) -> String {
    let mut bytes = Vec::new();
    let _ = stream.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Reads up to the end of a message head (and whatever came with it); `None` if the connection
/// closed or failed first.
pub fn read_head(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Some(head)
}

/// Waits until the peer closes `stream`, reading and dropping what it sends first; how long
/// that took. Panics if it is still open when the read timeout runs out.
pub fn closed_after(stream: &mut TcpStream) -> Duration {
    let start = Instant::now();
    let mut buf = [0u8; 64 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return start.elapsed(),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return start.elapsed(),
            Err(e) => panic!("the connection stayed open ({e}) after {:?}", start.elapsed()),
        }
    }
}

/// The bytes one connection has received so far.
type Record = Arc<Mutex<Vec<u8>>>;

/// An upstream on a raw socket: each connection is served on a thread of its own by the test's
/// handler, and every byte read from it is recorded.
pub struct RawUpstream {
    addr: SocketAddr,
    /// One record per connection, in the order they were accepted.
    received: Arc<Mutex<Vec<Record>>>,
}

/// One accepted connection, as the handler sees it.
pub struct Connection {
    stream: TcpStream,
    /// Everything read from it so far.
    record: Record,
    /// Read past the last head taken.
    unread: Vec<u8>,
}

impl Connection {
    /// The next request head, recorded; what came after it waits for the next call. `None` once
    /// the peer closed or the read failed.
    pub fn read_head(&mut self) -> Option<String> {
        self.read_until(b"\r\n\r\n").map(|head| String::from_utf8_lossy(&head).into_owned())
    }

    /// Everything up to the first `end` and `end` itself (e.g. a chunked body's last chunk),
    /// recorded; what came after it waits for the next call. `None` once the peer closed or the
    /// read failed.
    pub fn read_until(&mut self, end: &[u8]) -> Option<Vec<u8>> {
        let mut buf = [0u8; 16 * 1024];
        // Where `end` may start that has not been looked at yet.
        let mut from = 0;
        loop {
            if let Some(at) = self.unread[from..].windows(end.len()).position(|w| w == end) {
                return Some(self.unread.drain(..from + at + end.len()).collect());
            }
            from = self.unread.len().saturating_sub(end.len() - 1);
            match self.stream.read(&mut buf) {
                Ok(0) | Err(_) => return None,
                Ok(n) => {
                    self.record.lock().unwrap().extend_from_slice(&buf[..n]);
                    self.unread.extend_from_slice(&buf[..n]);
                }
            }
        }
    }

    /// Reads what follows the last head taken (its body), recorded; 0 once the peer closed.
    pub fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.unread.is_empty() {
            let n = buf.len().min(self.unread.len());
            buf[..n].copy_from_slice(&self.unread[..n]);
            self.unread.drain(..n);
            return Ok(n);
        }
        let n = self.stream.read(buf)?;
        self.record.lock().unwrap().extend_from_slice(&buf[..n]);
        Ok(n)
    }

    pub fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }
}

impl RawUpstream {
    /// Listens on a loopback port; `handle` serves each connection (it closes when `handle`
    /// returns).
    pub fn start(handle: impl Fn(Connection) + Send + Sync + 'static) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
        let addr = listener.local_addr().unwrap();
        let received: Arc<Mutex<Vec<Record>>> = Arc::default();
        let connections = received.clone();
        let handle = Arc::new(handle);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let record = Arc::new(Mutex::new(Vec::new()));
                connections.lock().unwrap().push(record.clone());
                let handle = handle.clone();
                thread::spawn(move || handle(Connection { stream, record, unread: Vec::new() }));
            }
        });
        RawUpstream { addr, received }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What each connection has received so far, in the order they were accepted.
    pub fn received(&self) -> Vec<String> {
        let connections = self.received.lock().unwrap();
        connections.iter().map(|c| String::from_utf8_lossy(&c.lock().unwrap()).into_owned()).collect()
    }

    /// The request heads received so far whose request line starts with `start` (e.g. "GET /x").
    pub fn requests(&self, start: &str) -> usize {
        self.received().iter().map(|bytes| bytes.split("\r\n\r\n").filter(|head| head.starts_with(start)).count()).sum()
    }
}
