//! A TCP proxy between clients and one server that a test can slow down,
//! stall or cut: the network trouble a consumer sees while the servers see
//! nothing wrong (a partition between one client and the cluster). It
//! listens on a free loopback port and forwards to `upstream`, also on
//! loopback; nothing else is ever a target.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the proxy does to traffic now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// Forwards at once.
    Up,
    /// Forwards each chunk after this long, both ways.
    Slow(Duration),
    /// Forwards nothing (bytes wait, as behind a link that drops packets
    /// until it heals); connections stay open.
    Stalled,
    /// Closes every open connection and refuses new ones.
    Down,
}

struct State {
    link: Mutex<Link>,
    /// The pumps of open connections, aborted when the link goes down.
    open: Mutex<Vec<JoinHandle<()>>>,
}

pub struct ChaosProxy {
    pub addr: SocketAddr,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl ChaosProxy {
    /// A proxy to `upstream` (a loopback address).
    pub async fn start(upstream: SocketAddr) -> Result<ChaosProxy> {
        anyhow::ensure!(
            upstream.ip().is_loopback(),
            "the proxy forwards to loopback only"
        );
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            link: Mutex::new(Link::Up),
            open: Mutex::new(Vec::new()),
        });
        let shared = Arc::clone(&state);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if link(&shared) == Link::Down {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let up = tokio::spawn(pump(Arc::clone(&shared), cr, sw));
                let down = tokio::spawn(pump(Arc::clone(&shared), sr, cw));
                let mut open = shared.open.lock().unwrap_or_else(|e| e.into_inner());
                open.retain(|h| !h.is_finished());
                open.extend([up, down]);
            }
        });
        Ok(ChaosProxy {
            addr,
            state,
            accept,
        })
    }

    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// Sets the link; `Down` cuts every open connection too.
    pub fn set(&self, to: Link) {
        *self.state.link.lock().unwrap_or_else(|e| e.into_inner()) = to;
        if to == Link::Down {
            for pump in self
                .state
                .open
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .drain(..)
            {
                pump.abort();
            }
        }
    }
}

impl Drop for ChaosProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.set(Link::Down);
    }
}

fn link(state: &State) -> Link {
    *state.link.lock().unwrap_or_else(|e| e.into_inner())
}

/// Copies `from` to `to` as the link allows, until either side closes.
async fn pump(
    state: Arc<State>,
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            match link(&state) {
                Link::Up => break,
                Link::Slow(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Link::Stalled => tokio::time::sleep(Duration::from_millis(50)).await,
                Link::Down => return,
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Bytes pass up, wait while stalled, and a cut closes the connection.
    #[tokio::test]
    async fn the_link_forwards_stalls_and_cuts() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 16];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let proxy = ChaosProxy::start(upstream).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        let mut b = [0u8; 2];
        c.write_all(b"hi").await.unwrap();
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"hi");
        proxy.set(Link::Stalled);
        c.write_all(b"yo").await.unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(300), c.read_exact(&mut b)).await;
        assert!(waited.is_err(), "a stalled link forwarded");
        proxy.set(Link::Up);
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"yo");
        proxy.set(Link::Down);
        let n = tokio::time::timeout(Duration::from_secs(2), c.read(&mut b))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0, "a cut connection closed");
    }
}
