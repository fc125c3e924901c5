//! The defaults and limits of Sluice's HTTP: what its connections toward the application and
//! toward upstreams hold and wait for, named once.

use std::time::Duration;

/// HTTP/2 streams one application connection may open at once (nginx allows 128, Go 250); what
/// all connections hold together is bounded by the listener's `max_requests`.
pub const MAX_HTTP2_STREAMS: u32 = 200;

/// Flow-control windows of the application's HTTP/2 connections, for a stream and for the whole
/// connection: what a connection may send ahead of what the sidecar has forwarded. RFC 9113's
/// own initial window; hyper's 1 MiB would let each connection park a megabyte of request body.
/// On loopback a window of this size still carries hundreds of megabytes a second.
pub const HTTP2_WINDOW: u32 = 65_535;

/// An application HTTP/2 stream's response data queued beyond what its flow control lets go
/// (hyper's default is 400 KiB a stream): an application that stops reading holds this much of
/// each response, and the upstream is asked for no more.
pub const HTTP2_SEND_BUFFER: usize = 16 * 1024;

/// Flow-control windows of the upstream HTTP/2 connections: what an upstream may send ahead of
/// what the application has taken, per stream and for a connection of up to
/// [`STREAMS_PER_HTTP2_CONNECTION`] streams (hyper's client allows 2 MiB and 5 MiB).
pub const UPSTREAM_HTTP2_STREAM_WINDOW: u32 = 64 * 1024;
pub const UPSTREAM_HTTP2_CONNECTION_WINDOW: u32 = 1024 * 1024;

/// After answering a request whose body it did not read (a rejection, say), the sidecar closes
/// its side and reads and drops what the application still sends, for up to this long and this
/// many bytes: closing with unread data would send a reset, which can destroy the answer before
/// the application has read it (the lingering close of nginx and Apache).
pub const LINGER_TIME: Duration = Duration::from_secs(2);
pub const LINGER_BYTES: usize = 16 << 20;

/// Idle pooled connections kept per upstream, and how long.
pub const UPSTREAM_POOL_IDLE: usize = 256;
pub const UPSTREAM_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Largest response head accepted from an upstream, over HTTP/1.1 or HTTP/2.
pub const UPSTREAM_MAX_HEADER_BYTES: usize = 64 * 1024;

/// Streams the sidecar opens on one upstream HTTP/2 connection before it opens another: what
/// RFC 9113 §6.5.2 asks every peer to allow at least.
pub const STREAMS_PER_HTTP2_CONNECTION: usize = 100;

/// Time to establish a TCP connection to an upstream.
pub const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Spare connection buffers (8 KiB each) a worker thread keeps for its connections to take
/// again (see `h1::spare`): enough for a busy thread's connections to take theirs without the
/// allocator, few enough that thousands of idle connections still hold none (512 KiB a thread).
pub const SPARE_BUFFERS: usize = 64;
