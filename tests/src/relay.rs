//! `sluice-relay`: a TCP relay that knows nothing of HTTP. Each connection it accepts is joined
//! to a new connection to the upstream, and bytes are copied both ways as they come. The sidecar
//! benchmark runs it beside nginx and the sidecar as the ceiling of any proxy on the machine:
//! the reads, writes and wake-ups that moving a request and its response cost, with no parsing,
//! routing or admission at all.

use std::net::SocketAddr;

use clap::Parser;
use sluice_runtime::errln;
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Parser)]
#[command(name = "sluice-relay", about = "TCP relay, the sidecar benchmark's ceiling")]
pub struct Args {
    /// Address to listen on.
    #[arg(long)]
    pub addr: SocketAddr,
    /// Address every connection is relayed to.
    #[arg(long)]
    pub upstream: SocketAddr,
}

/// Relays on one thread until the process is killed.
pub fn run(args: Args) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async {
        let listener =
            TcpListener::bind(args.addr).await.map_err(|e| format!("cannot listen on {}: {e}", args.addr))?;
        loop {
            let (downstream, _) = listener.accept().await.map_err(|e| format!("accept: {e}"))?;
            tokio::spawn(async move {
                if let Err(e) = relay(downstream, args.upstream).await {
                    let _ = errln!("sluice-relay: {e}");
                }
            });
        }
    })
}

async fn relay(mut downstream: TcpStream, upstream: SocketAddr) -> std::io::Result<()> {
    // As the proxies do: a request or response goes out as soon as it is written.
    downstream.set_nodelay(true)?;
    let mut upstream = TcpStream::connect(upstream).await?;
    upstream.set_nodelay(true)?;
    tokio::io::copy_bidirectional(&mut downstream, &mut upstream).await.map(drop)
}
