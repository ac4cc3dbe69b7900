//! The API server: listeners bound on the caller's thread (so errors such as
//! "socket in use" surface at start-up), served by a current-thread tokio
//! runtime on its own thread. Every connection is bounded: a cap on open
//! connections, a deadline for each request's headers (which also closes
//! idle keep-alive connections), a deadline and a size cap for bodies, and
//! VMM calls that run off the runtime thread; the VMM's event loop only
//! ever sees requests through its channel and never touches a socket.
//!
//! At the connection cap, idle connections never starve new clients: a new
//! connection is accepted first, and if no slot is free the connection that
//! has been idle longest (no request in flight) is closed to make room.
//! Without that, 256 idle keep-alive clients made every new request wait
//! for a header timeout (10 s).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use pagefold_vmm::control;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

use crate::listen::{ListenConfig, ListenError};
use crate::router::{metrics_router, router};
use crate::socket::{self, SocketError, SocketGuard};
use crate::state::AppState;

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
    #[error("metrics on TCP {addr}: {source}")]
    Metrics {
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
    /// Open connections at most; past it, the longest-idle connection is
    /// closed for a new one (clients all busy: the new one waits).
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
    metrics_addr: Option<SocketAddr>,
}

fn setup(what: &'static str) -> impl FnOnce(std::io::Error) -> ServerError {
    move |source| ServerError::Setup { what, source }
}

/// A non-blocking TCP listener on `addr`.
fn bind_tcp(
    addr: SocketAddr,
    err: impl Fn(std::io::Error) -> ServerError,
) -> Result<std::net::TcpListener, ServerError> {
    let l = std::net::TcpListener::bind(addr).map_err(&err)?;
    l.set_nonblocking(true).map_err(err)?;
    Ok(l)
}

impl Server {
    /// Binds the listeners and starts serving `handle`'s VMM.
    pub fn start(
        handle: control::Handle,
        listen: &ListenConfig,
        limits: Limits,
    ) -> Result<Server, ServerError> {
        listen.validate()?;
        let tcp = listen
            .tcp
            .map(|addr| bind_tcp(addr, |source| ServerError::Tcp { addr, source }))
            .transpose()?;
        let metrics = listen
            .metrics
            .map(|addr| bind_tcp(addr, |source| ServerError::Metrics { addr, source }))
            .transpose()?;
        let local = |l: &Option<std::net::TcpListener>| {
            l.as_ref()
                .map(|l| l.local_addr())
                .transpose()
                .map_err(setup("TCP address"))
        };
        let tcp_addr = local(&tcp)?;
        let metrics_addr = local(&metrics)?;
        let (unix, socket) = match listen
            .unix
            .as_deref()
            .map(|p| socket::bind(p, listen.unix_group))
            .transpose()?
        {
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
        let metrics_app = metrics_router(state.clone());
        let ctx = Ctx {
            app: router(state),
            limits,
            conns: Arc::new(Semaphore::new(limits.max_connections)),
            open: Arc::new(OpenConns::default()),
            stop: stop_rx,
        };
        // The thread installs its seccomp filter first and says whether
        // that worked before it serves anything.
        let (filtered_tx, filtered_rx) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("pagefold-api".into())
            .spawn(move || {
                let r = pagefold_vmm::seccomp::install(pagefold_vmm::seccomp::ThreadKind::Api);
                let ok = r.is_ok();
                let _ = filtered_tx.send(r);
                if !ok {
                    return;
                }
                rt.block_on(serve(unix, tcp, metrics.map(|m| (m, metrics_app)), ctx));
                // Calls still waiting on the VMM are abandoned, not awaited.
                rt.shutdown_timeout(Duration::from_millis(200));
            })
            .map_err(setup("spawning the API thread"))?;
        match filtered_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(setup("seccomp filter of the API thread")(
                    std::io::Error::other(e.to_string()),
                ));
            }
            Err(_) => {
                let _ = thread.join();
                return Err(setup("seccomp filter of the API thread")(
                    std::io::Error::other("the API thread ended"),
                ));
            }
        }
        Ok(Server {
            stop: Some(stop_tx),
            thread: Some(thread),
            socket,
            tcp_addr,
            metrics_addr,
        })
    }

    pub fn socket_path(&self) -> Option<&Path> {
        self.socket.as_ref().map(|g| g.path())
    }

    /// The bound TCP address (useful with port 0).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    /// The bound address of the metrics-only listener.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
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
    open: Arc<OpenConns>,
    stop: watch::Receiver<bool>,
}

/// One open connection, as the shedding logic sees it.
struct ConnState {
    /// Requests in flight (a busy connection is never shed).
    busy: AtomicUsize,
    /// The tick of its last request start or end (smaller: idle longer).
    last_active: AtomicU64,
    /// Asks the connection to close.
    shed: Notify,
}

/// Every open connection, so that one can be closed to make room.
#[derive(Default)]
struct OpenConns {
    /// A logical clock for `last_active` (cheaper than `Instant`s, and
    /// strictly ordered).
    tick: AtomicU64,
    next_id: AtomicU64,
    conns: Mutex<BTreeMap<u64, Arc<ConnState>>>,
}

impl OpenConns {
    fn now(&self) -> u64 {
        self.tick.fetch_add(1, Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<ConnState>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self) -> (u64, Arc<ConnState>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let c = Arc::new(ConnState {
            busy: AtomicUsize::new(0),
            last_active: AtomicU64::new(self.now()),
            shed: Notify::new(),
        });
        self.lock().insert(id, c.clone());
        (id, c)
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Asks the connection idle longest to close; false if every open
    /// connection has a request in flight. The connection leaves the set
    /// at once, so a second call picks another.
    fn shed_idlest(&self) -> bool {
        let mut conns = self.lock();
        let idlest = conns
            .iter()
            .filter(|(_, c)| c.busy.load(Ordering::Relaxed) == 0)
            .min_by_key(|(_, c)| c.last_active.load(Ordering::Relaxed))
            .map(|(id, _)| *id);
        match idlest.and_then(|id| conns.remove(&id)) {
            Some(c) => {
                c.shed.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Removes a connection from [`OpenConns`] when its task ends, however it ends.
struct Registered {
    open: Arc<OpenConns>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open.remove(self.id);
    }
}

enum Listener {
    Unix(tokio::net::UnixListener),
    Tcp(tokio::net::TcpListener),
}

enum Accepted {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

impl Listener {
    async fn accept(&self) -> std::io::Result<Accepted> {
        Ok(match self {
            Listener::Unix(l) => Accepted::Unix(l.accept().await?.0),
            Listener::Tcp(l) => {
                let (s, _) = l.accept().await?;
                let _ = s.set_nodelay(true);
                Accepted::Tcp(s)
            }
        })
    }
}

impl Accepted {
    /// Serves the connection on its own task.
    fn spawn(self, ctx: &Ctx, permit: OwnedSemaphorePermit) {
        match self {
            Accepted::Unix(s) => drop(tokio::spawn(connection(s, ctx.clone(), permit))),
            Accepted::Tcp(s) => drop(tokio::spawn(connection(s, ctx.clone(), permit))),
        }
    }
}

/// A connection slot for a client that is already accepted: a free one,
/// else one made by closing the longest-idle connection; if every
/// connection is busy, the next slot that frees up. None once stopping.
async fn slot(ctx: &Ctx, stop: &mut watch::Receiver<bool>) -> Option<OwnedSemaphorePermit> {
    loop {
        match ctx.conns.clone().try_acquire_owned() {
            Ok(p) => return Some(p),
            Err(tokio::sync::TryAcquireError::Closed) => return None,
            Err(tokio::sync::TryAcquireError::NoPermits) => {}
        }
        let shed = ctx.open.shed_idlest();
        tokio::select! {
            p = ctx.conns.clone().acquire_owned() => return p.ok(),
            _ = stop.changed() => return None,
            // A shed connection frees its slot within moments; if none
            // was idle, look again now and then (one may have become idle).
            _ = tokio::time::sleep(Duration::from_millis(if shed { 1000 } else { 50 })) => {}
        }
    }
}

async fn serve(
    unix: Option<std::os::unix::net::UnixListener>,
    tcp: Option<std::net::TcpListener>,
    metrics: Option<(std::net::TcpListener, Router)>,
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
    if let Some((t, app)) = metrics {
        // Its connections share the cap and the deadlines of the others.
        let mctx = Ctx { app, ..ctx.clone() };
        match tokio::net::TcpListener::from_std(t) {
            Ok(l) => drop(loops.spawn(accept_loop(Listener::Tcp(l), mctx))),
            Err(e) => log::error!("API: metrics listener: {e}"),
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
        let conn = tokio::select! {
            r = l.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    log::warn!("API: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        match slot(&ctx, &mut stop).await {
            Some(permit) => conn.spawn(&ctx, permit),
            None => break,
        }
    }
}

async fn connection<S>(s: S, ctx: Ctx, _permit: OwnedSemaphorePermit)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (id, state) = ctx.open.add();
    let _registered = Registered {
        open: ctx.open.clone(),
        id,
    };
    let svc = TowerToHyperService::new(Tracked {
        inner: ctx.app.clone(),
        state: state.clone(),
        open: ctx.open.clone(),
    });
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
        _ = state.shed.notified() => {
            if state.busy.load(Ordering::Relaxed) == 0 {
                // Idle (at most part of a request's headers came): close
                // now, as any keep-alive peer must expect.
                return;
            }
        }
    }
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
}

/// The router, counting each connection's requests in flight and when it
/// was last active (see [`OpenConns::shed_idlest`]).
#[derive(Clone)]
struct Tracked {
    inner: Router,
    state: Arc<ConnState>,
    open: Arc<OpenConns>,
}

impl<B> tower::Service<hyper::Request<B>> for Tracked
where
    Router: tower::Service<
        hyper::Request<B>,
        Response = axum::response::Response,
        Error = std::convert::Infallible,
    >,
    <Router as tower::Service<hyper::Request<B>>>::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        tower::Service::<hyper::Request<B>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, req: hyper::Request<B>) -> Self::Future {
        let busy = Busy::new(self.state.clone(), self.open.clone());
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            drop(busy);
            r
        })
    }
}

/// A request in flight on a connection (also when its future is dropped).
struct Busy {
    state: Arc<ConnState>,
    open: Arc<OpenConns>,
}

impl Busy {
    fn new(state: Arc<ConnState>, open: Arc<OpenConns>) -> Busy {
        state.busy.fetch_add(1, Ordering::Relaxed);
        state.last_active.store(open.now(), Ordering::Relaxed);
        Busy { state, open }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.state
            .last_active
            .store(self.open.now(), Ordering::Relaxed);
        self.state.busy.fetch_sub(1, Ordering::Relaxed);
    }
}
