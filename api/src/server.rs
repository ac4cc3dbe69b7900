//! The API server: listeners bound on the caller's thread (so errors such as
//! "socket in use" surface at start-up), served by a current-thread tokio
//! runtime on its own thread. Every connection is bounded: a cap on open
//! connections, a deadline for each request's headers (which also closes
//! idle keep-alive connections), a deadline and a size cap for bodies, and
//! VMM calls that run off the runtime thread; the VMM's event loop only
//! ever sees requests through its channel and never touches a socket.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use pagefold_vmm::control;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::listen::{ListenConfig, ListenError};
use crate::router::{router, AppState};
use crate::socket::{self, SocketError, SocketGuard};

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error("API on TCP {addr}: {source}")]
    Tcp {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("API server: {what}: {source}")]
    Setup {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Bounds on what clients may cost.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request body (bytes); larger gets 413.
    pub max_body: usize,
    /// Deadline for a request's headers, counted from the connection's
    /// start or the previous response (idle keep-alive connections close).
    pub header_timeout: Duration,
    /// Deadline for a request's body once its headers arrived (408).
    pub body_timeout: Duration,
    /// Open connections at most; further clients wait in the listen backlog.
    pub max_connections: usize,
    /// Threads for VMM and backend calls.
    pub max_blocking_threads: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body: 64 * 1024,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            max_connections: 256,
            max_blocking_threads: 16,
        }
    }
}

/// A running API server; stops (and removes its socket) at drop.
pub struct Server {
    stop: Option<watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
    socket: Option<SocketGuard>,
    tcp_addr: Option<SocketAddr>,
}

fn setup(what: &'static str) -> impl FnOnce(std::io::Error) -> ServerError {
    move |source| ServerError::Setup { what, source }
}

impl Server {
    /// Binds the listeners and starts serving `handle`'s VMM.
    pub fn start(
        handle: control::Handle,
        listen: &ListenConfig,
        limits: Limits,
    ) -> Result<Server, ServerError> {
        listen.validate()?;
        let tcp = match listen.tcp {
            Some(addr) => {
                let l = std::net::TcpListener::bind(addr)
                    .map_err(|source| ServerError::Tcp { addr, source })?;
                l.set_nonblocking(true)
                    .map_err(setup("non-blocking TCP listener"))?;
                Some(l)
            }
            None => None,
        };
        let tcp_addr = tcp
            .as_ref()
            .map(|l| l.local_addr())
            .transpose()
            .map_err(setup("TCP address"))?;
        let (unix, socket) = match listen.unix.as_deref().map(socket::bind).transpose()? {
            Some((l, g)) => {
                l.set_nonblocking(true)
                    .map_err(setup("non-blocking Unix listener"))?;
                (Some(l), Some(g))
            }
            None => (None, None),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(limits.max_blocking_threads)
            .thread_name("pagefold-api-call")
            .build()
            .map_err(setup("tokio runtime"))?;
        let mut state = AppState::new(handle);
        state.max_body = limits.max_body;
        state.body_timeout = limits.body_timeout;
        let (stop_tx, stop_rx) = watch::channel(false);
        let ctx = Ctx {
            app: router(state),
            limits,
            conns: Arc::new(Semaphore::new(limits.max_connections)),
            stop: stop_rx,
        };
        let thread = std::thread::Builder::new()
            .name("pagefold-api".into())
            .spawn(move || {
                rt.block_on(serve(unix, tcp, ctx));
                // Calls still waiting on the VMM are abandoned, not awaited.
                rt.shutdown_timeout(Duration::from_millis(200));
            })
            .map_err(setup("spawning the API thread"))?;
        Ok(Server {
            stop: Some(stop_tx),
            thread: Some(thread),
            socket,
            tcp_addr,
        })
    }

    pub fn socket_path(&self) -> Option<&Path> {
        self.socket.as_ref().map(|g| g.path())
    }

    /// The bound TCP address (useful with port 0).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    /// Stops accepting, lets open requests finish (2 s at most), removes
    /// the socket.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.socket.take();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[derive(Clone)]
struct Ctx {
    app: Router,
    limits: Limits,
    conns: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
}

enum Listener {
    Unix(tokio::net::UnixListener),
    Tcp(tokio::net::TcpListener),
}

impl Listener {
    /// Accepts one connection and serves it on its own task.
    async fn accept_one(&self, ctx: &Ctx, permit: OwnedSemaphorePermit) -> std::io::Result<()> {
        match self {
            Listener::Unix(l) => {
                let (s, _) = l.accept().await?;
                tokio::spawn(connection(s, ctx.clone(), permit));
            }
            Listener::Tcp(l) => {
                let (s, _) = l.accept().await?;
                let _ = s.set_nodelay(true);
                tokio::spawn(connection(s, ctx.clone(), permit));
            }
        }
        Ok(())
    }
}

async fn serve(
    unix: Option<std::os::unix::net::UnixListener>,
    tcp: Option<std::net::TcpListener>,
    ctx: Ctx,
) {
    let mut loops = tokio::task::JoinSet::new();
    if let Some(u) = unix {
        match tokio::net::UnixListener::from_std(u) {
            Ok(l) => drop(loops.spawn(accept_loop(Listener::Unix(l), ctx.clone()))),
            Err(e) => log::error!("API: Unix listener: {e}"),
        }
    }
    if let Some(t) = tcp {
        match tokio::net::TcpListener::from_std(t) {
            Ok(l) => drop(loops.spawn(accept_loop(Listener::Tcp(l), ctx.clone()))),
            Err(e) => log::error!("API: TCP listener: {e}"),
        }
    }
    while loops.join_next().await.is_some() {}
    // Every connection holds a permit: having them all back means every
    // open connection has finished.
    let all = ctx.limits.max_connections as u32;
    let _ = tokio::time::timeout(Duration::from_secs(2), ctx.conns.acquire_many(all)).await;
}

async fn accept_loop(l: Listener, ctx: Ctx) {
    let mut stop = ctx.stop.clone();
    loop {
        let permit = tokio::select! {
            p = ctx.conns.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = stop.changed() => break,
        };
        tokio::select! {
            r = l.accept_one(&ctx, permit) => {
                if let Err(e) = r {
                    // EMFILE and friends: back off instead of spinning.
                    log::warn!("API: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            _ = stop.changed() => break,
        }
    }
}

async fn connection<S>(s: S, ctx: Ctx, _permit: OwnedSemaphorePermit)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = TowerToHyperService::new(ctx.app.clone());
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(ctx.limits.header_timeout)
        .keep_alive(true)
        .max_buf_size(64 * 1024);
    let conn = b.serve_connection(TokioIo::new(s), svc);
    tokio::pin!(conn);
    let mut stop = ctx.stop.clone();
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                log::debug!("API connection: {e}");
            }
            return;
        }
        _ = stop.changed() => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
}
