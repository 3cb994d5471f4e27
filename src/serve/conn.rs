//! The service's connections ([`Limited`], an axum [`Listener`]): at most
//! [`crate::serve::ServeConfig::max_conns`] are open at once (the next one is accepted when one
//! closes; until then it waits in the kernel's backlog, so idle keep-alive connections can no
//! longer lock every other client out without bound), and a connection on which nothing is read
//! or written for [`crate::serve::ServeConfig::idle`] is closed (a half-sent header, a stalled
//! body, an idle keep-alive).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// A TCP listener with a connection cap and an idle timeout (see the module docs).
pub struct Limited {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    idle: Duration,
}

impl Limited {
    /// `inner` with at most `max_conns` connections open (≥ 1), each closed after `idle` without
    /// progress.
    pub fn new(inner: TcpListener, max_conns: usize, idle: Duration) -> Self {
        Limited {
            inner,
            permits: Arc::new(Semaphore::new(max_conns.max(1))),
            idle,
        }
    }
}

impl Listener for Limited {
    type Io = Conn;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Conn, Self::Addr) {
        // The semaphore is never closed.
        let permit = match self.permits.clone().acquire_owned().await {
            Ok(p) => p,
            Err(_) => unreachable!("the connection semaphore is never closed"),
        };
        let (io, addr) = Listener::accept(&mut self.inner).await;
        let conn = Conn {
            io,
            _permit: permit,
            idle: self.idle,
            timer: Box::pin(tokio::time::sleep(self.idle)),
        };
        (conn, addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// One connection of [`Limited`]: its slot is given back when it is dropped.
pub struct Conn {
    io: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
}

impl Conn {
    fn progress(&mut self) {
        let next = Instant::now() + self.idle;
        self.timer.as_mut().reset(next);
    }

    /// `Pending` from the stream: an error once the connection has been idle too long.
    fn idle_check(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection idle too long",
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.progress();
                }
                Poll::Ready(r)
            }
            Poll::Pending => this.idle_check(cx).map(Err),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(r) => {
                if matches!(r, Ok(n) if n > 0) {
                    this.progress();
                }
                Poll::Ready(r)
            }
            Poll::Pending => this.idle_check(cx).map(Err),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
