//! A TCP proxy on loopback that a scenario can cut: connections through it are closed and new
//! ones refused until it is healed. Put between one client and the API server, it partitions
//! that client alone while the rest of the cluster keeps talking.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running proxy. Dropping it stops accepting and closes every connection it carries.
pub struct Proxy {
    /// Where clients connect instead of the upstream.
    pub addr: SocketAddr,
    cut: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy to 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let (cut, cut_rx) = watch::channel(false);
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if *cut_rx.borrow() {
                    drop(inbound);
                    continue;
                }
                let mut cut_rx = cut_rx.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let mut inbound = inbound;
                    // Ends when either side closes, when the proxy is cut, or when it is dropped
                    // (the sender goes and `wait_for` fails).
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut_rx.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Ok(Self { addr, cut, accept })
    }

    /// Cuts (`true`: open connections closed, new ones refused) or heals (`false`) the link.
    pub fn cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
