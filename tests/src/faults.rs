//! A TCP fault proxy for the fault tests: it listens on a free loopback port, relays every
//! connection to a target, and can be switched at any time between passing bytes through,
//! delaying them, blackholing them, resetting connections and cutting them.
//!
//! It runs on a thread and runtime of its own, so that a test blocked on a process start or a
//! status page does not stall the traffic it relays.

use std::{
    io,
    net::SocketAddr,
    thread,
    time::{Duration, Instant},
};

use bytes::Bytes;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpListener, TcpSocket, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::{mpsc, watch},
    time::sleep_until,
};

use crate::harness::free_port;

/// What the proxy does to the traffic it relays, new and existing connections alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Bytes pass as they come.
    Pass,
    /// Every chunk is forwarded this long after it was read, either way: added latency, not a
    /// limit on throughput.
    Delay(Duration),
    /// Connections are accepted and read, but nothing is forwarded and nothing answered: a
    /// partition. What was read is held and delivered when the mode changes back, as TCP's
    /// retransmissions would deliver it once a real partition heals.
    Blackhole,
    /// Every connection, existing or new, is reset (RST).
    Reset,
    /// Existing connections are closed and new ones refused: the listener is gone until the
    /// mode changes.
    Cut,
}

/// Chunks read but not yet forwarded, per direction of a connection; a full queue stops reading
/// and leaves the rest to TCP's flow control.
const QUEUE: usize = 64;

/// Read size of one chunk.
const CHUNK: usize = 16 * 1024;

pub struct FaultProxy {
    addr: SocketAddr,
    /// Dropped to stop the proxy: every task of it then ends.
    fault: Option<watch::Sender<Fault>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts relaying a free loopback port to `target`, passing everything.
    pub fn start(target: SocketAddr) -> FaultProxy {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let (fault, watched) = watch::channel(Fault::Pass);
        let (bound, is_bound) = std::sync::mpsc::channel();
        let thread = thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let listener = listen(addr).expect("the fault proxy listens");
                bound.send(()).expect("the test waits");
                serve(listener, addr, target, watched).await;
            });
        });
        is_bound.recv().expect("the fault proxy started");
        FaultProxy { addr, fault: Some(fault), thread: Some(thread) }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set(&self, fault: Fault) {
        self.fault.as_ref().expect("running").send_replace(fault);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.fault = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Binds with SO_REUSEADDR, so that a cut can give the port up and take it again at once.
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn serve(listener: TcpListener, addr: SocketAddr, target: SocketAddr, mut fault: watch::Receiver<Fault>) {
    let mut listener = Some(listener);
    loop {
        let current = *fault.borrow_and_update();
        match current {
            Fault::Cut => listener = None,
            _ if listener.is_none() => listener = Some(listen(addr).expect("the fault proxy listens again")),
            _ => {}
        }
        let Some(open) = &listener else {
            if fault.changed().await.is_err() {
                return;
            }
            continue;
        };
        tokio::select! {
            changed = fault.changed() => if changed.is_err() { return },
            accepted = open.accept() => {
                let Ok((client, _)) = accepted else { continue };
                // The mode now, not at the top of the loop: a change may be waiting beside this
                // connection, and one set before the client connected must apply to it.
                if *fault.borrow() == Fault::Reset {
                    let _ = client.set_zero_linger();
                } else {
                    tokio::spawn(relay(client, target, fault.clone()));
                }
            }
        }
    }
}

/// Relays one connection until either side ends it or a reset or cut does.
async fn relay(client: TcpStream, target: SocketAddr, mut fault: watch::Receiver<Fault>) {
    // A connection accepted during a blackhole reaches the target once the partition heals.
    let upstream = loop {
        let current = *fault.borrow_and_update();
        match current {
            Fault::Blackhole => {}
            Fault::Reset => return drop(client.set_zero_linger()),
            Fault::Cut => return,
            Fault::Pass | Fault::Delay(_) => match TcpStream::connect(target).await {
                Ok(upstream) => break upstream,
                // As the target itself would: refused, so reset.
                Err(_) => return drop(client.set_zero_linger()),
            },
        }
        if fault.changed().await.is_err() {
            return;
        }
    };
    let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    let up = direction(&mut client_read, &mut upstream_write, fault.clone());
    let down = direction(&mut upstream_read, &mut client_write, fault.clone());
    let both = async move { tokio::try_join!(up, down) };
    let ended = fault.wait_for(|f| matches!(f, Fault::Reset | Fault::Cut));
    let reset = tokio::select! {
        _ = both => false,
        fault = ended => fault.is_ok_and(|f| *f == Fault::Reset),
    };
    if reset {
        // A write half sends a FIN when dropped, which would come before the RST: forgotten, it
        // leaves the close to its read half.
        for (read, write) in [(&client_read, client_write), (&upstream_read, upstream_write)] {
            let _ = read.as_ref().set_zero_linger();
            write.forget();
        }
    }
}

/// Copies one direction: a reader queues what it reads with the time it was read, and a writer
/// forwards each chunk when the fault in force lets it.
async fn direction(from: &mut OwnedReadHalf, to: &mut OwnedWriteHalf, fault: watch::Receiver<Fault>) -> io::Result<()> {
    let (queue, mut queued) = mpsc::channel::<(Instant, Bytes)>(QUEUE);
    let read = async move {
        let mut buffer = vec![0; CHUNK];
        loop {
            let n = from.read(&mut buffer).await?;
            if n == 0 || queue.send((Instant::now(), Bytes::copy_from_slice(&buffer[..n]))).await.is_err() {
                return Ok::<_, io::Error>(());
            }
        }
    };
    let write = async move {
        let mut fault = fault;
        while let Some((read_at, chunk)) = queued.recv().await {
            loop {
                let current = *fault.borrow_and_update();
                match current {
                    Fault::Pass => break,
                    Fault::Delay(delay) => {
                        // Woken early by a change of mode, the chunk is looked at again.
                        tokio::select! {
                            _ = sleep_until((read_at + delay).into()) => break,
                            _ = fault.changed() => continue,
                        }
                    }
                    // Held; a reset or cut ends the connection from `relay`.
                    _ => {}
                }
                if fault.changed().await.is_err() {
                    return Ok(());
                }
            }
            to.write_all(&chunk).await?;
        }
        // The reader saw the end of its side: pass the half-close on.
        to.shutdown().await
    };
    tokio::try_join!(read, write).map(drop)
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;

    use super::*;

    /// An echo server on a free port.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    /// Sends `message` and reads its echo: how long that took, or the error.
    async fn round_trip(stream: &mut TcpStream, message: &[u8], timeout: Duration) -> io::Result<Duration> {
        let start = Instant::now();
        stream.write_all(message).await?;
        let mut answer = vec![0; message.len()];
        match tokio::time::timeout(timeout, stream.read_exact(&mut answer)).await {
            Ok(read) => read?,
            Err(_) => return Err(ErrorKind::TimedOut.into()),
        };
        assert_eq!(answer, message);
        Ok(start.elapsed())
    }

    #[tokio::test]
    async fn passes_delays_blackholes_resets_and_cuts() {
        let proxy = FaultProxy::start(echo().await);
        let second = Duration::from_secs(1);
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(round_trip(&mut stream, b"pass", second).await.unwrap() < Duration::from_millis(500));

        // Either way: twice the delay per round trip.
        proxy.set(Fault::Delay(Duration::from_millis(200)));
        let took = round_trip(&mut stream, b"delay", 5 * second).await.unwrap();
        assert!(took >= Duration::from_millis(400), "{took:?}");

        // Nothing comes back during the blackhole; what was sent arrives once it heals.
        proxy.set(Fault::Blackhole);
        let error = round_trip(&mut stream, b"hole", Duration::from_millis(500)).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::TimedOut);
        let mut during = TcpStream::connect(proxy.addr()).await.expect("accepted during a blackhole");
        during.write_all(b"held").await.unwrap();
        proxy.set(Fault::Pass);
        let mut held = [0; 8];
        stream.read_exact(&mut held[..4]).await.unwrap();
        assert_eq!(&held[..4], b"hole");
        during.read_exact(&mut held[4..]).await.unwrap();
        assert_eq!(&held[4..], b"held");

        // A reset ends the open connection with an RST and greets new ones with one.
        proxy.set(Fault::Reset);
        let mut buffer = [0; 1];
        let error = tokio::time::timeout(5 * second, stream.read(&mut buffer)).await.unwrap().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ConnectionReset);
        // The RST may come before the connect call has returned.
        let fresh = async {
            let mut fresh = TcpStream::connect(proxy.addr()).await?;
            fresh.read(&mut buffer).await
        };
        let error = tokio::time::timeout(5 * second, fresh).await.unwrap().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ConnectionReset);

        // A cut closes open connections and refuses new ones until it is lifted.
        proxy.set(Fault::Pass);
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut stream, b"again", second).await.unwrap();
        proxy.set(Fault::Cut);
        assert_eq!(tokio::time::timeout(5 * second, stream.read(&mut buffer)).await.unwrap().unwrap(), 0, "closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let refused = TcpStream::connect(proxy.addr()).await.unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
        proxy.set(Fault::Pass);
        let mut stream = tokio::time::timeout(5 * second, async {
            loop {
                match TcpStream::connect(proxy.addr()).await {
                    Ok(stream) => return stream,
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        })
        .await
        .expect("listening again");
        round_trip(&mut stream, b"healed", second).await.unwrap();
    }
}
