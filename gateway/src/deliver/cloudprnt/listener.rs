//! The CloudPRNT server's sockets: TCP, TLS unless `cloudprnt.plain`, at most
//! `cloudprnt.max_connections` open at once, each handshake bounded by
//! `cloudprnt.request_timeout_ms`. An [`axum::serve::Listener`], so axum serves HTTP on
//! what it accepts; handshakes run in tasks of their own, so a slow one delays no other.

use super::server::{Refusal, Server};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Connections accepted and set up, waiting for axum to take them.
const READY: usize = 64;

/// One accepted connection; its slot of `max_connections` is freed when it is dropped.
pub struct Conn {
    io: Io,
    _slot: OwnedSemaphorePermit,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// The accepted connections, set up by a task of its own ([`CloudListener::start`]).
pub struct CloudListener {
    ready: mpsc::Receiver<(Conn, SocketAddr)>,
    local: SocketAddr,
}

impl CloudListener {
    /// Accepts on `tcp` until the returned listener is dropped: over TLS with `tls`, at
    /// most `max_connections` at once (beyond, a socket is closed at once and counted
    /// `capacity`), a handshake failing or outlasting `handshake` counted
    /// `tls_handshake`.
    ///
    /// # Errors
    /// The socket's address cannot be read.
    pub fn start(
        tcp: TcpListener,
        tls: Option<TlsAcceptor>,
        max_connections: usize,
        handshake: Duration,
        server: Server,
    ) -> io::Result<CloudListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(READY);
        let slots = Arc::new(Semaphore::new(max_connections.max(1)));
        tokio::spawn(async move {
            loop {
                let (socket, addr) = tokio::select! {
                    accepted = tcp.accept() => match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of file descriptors and the like: wait rather than spin.
                            tracing::warn!(error = %e, "CloudPRNT listener cannot accept");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                    () = tx.closed() => return,
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    server.refuse(Refusal::Capacity, &addr.ip().to_string(), "cloudprnt.max_connections reached");
                    continue;
                };
                let _ = socket.set_nodelay(true);
                let Some(acceptor) = tls.clone() else {
                    if tx.send((Conn { io: Io::Plain(socket), _slot: slot }, addr)).await.is_err() {
                        return;
                    }
                    continue;
                };
                let (tx, server) = (tx.clone(), server.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(handshake, acceptor.accept(socket)).await {
                        Ok(Ok(s)) => {
                            let _ = tx.send((Conn { io: Io::Tls(Box::new(s)), _slot: slot }, addr)).await;
                        }
                        Ok(Err(e)) => server.refuse(Refusal::TlsHandshake, &addr.ip().to_string(), &e.to_string()),
                        Err(_) => server.refuse(Refusal::TlsHandshake, &addr.ip().to_string(), "timed out"),
                    }
                });
            }
        });
        Ok(CloudListener { ready, local })
    }
}

impl axum::serve::Listener for CloudListener {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task ended (it ends only when this listener is dropped).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
