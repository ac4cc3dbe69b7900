//! An HTTP/1.1 client for the API over the Unix socket (or loopback TCP),
//! built on hyper's connection-level client: used by the CLI (blocking,
//! one connection per command), the tests and the load generator (async,
//! keep-alive [`Connection`]s). The CLI uses its typed calls
//! ([`Client::health`], [`Client::vms`], [`Client::dedup`], ...), which
//! answer the same types the handlers serialize.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use pagefold_dedup::DedupSettings;
use pagefold_vmm::config::VmConfig;
use pagefold_vmm::vm::VmInfo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::dedup_view::DedupView;
use crate::view::{ErrorBody, Health};
use crate::vms::{StatePatch, Target as VmTarget};
use crate::PREFIX;

/// Errors talking to the API.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to the pagefold API at {target}: {source} (is `pagefold serve` or `pagefold run --api-sock` running? choose the socket with --api-sock)")]
    Connect {
        target: String,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("building the request: {0}")]
    Request(String),
    #[error("no answer from the pagefold API within {0:?}")]
    Timeout(Duration),
    #[error("client runtime: {0}")]
    Runtime(std::io::Error),
    /// The server answered with an error status (its message).
    #[error("{method} {path}: {message} ({status})")]
    Status {
        method: &'static str,
        path: String,
        status: u16,
        message: String,
    },
    /// A success answer whose body is not the documented one.
    #[error("{method} {path}: the API sent an unexpected body: {source}")]
    Body {
        method: &'static str,
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

impl ClientError {
    /// True when the server refused the request as the client's fault
    /// (4xx): bad input, no such VM, a conflict.
    pub fn is_client_fault(&self) -> bool {
        matches!(self, ClientError::Status { status, .. } if (400..500).contains(status))
    }
}

/// Where the API is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Unix(p) => write!(f, "{}", p.display()),
            Target::Tcp(a) => write!(f, "tcp {a}"),
        }
    }
}

/// A response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    pub fn json(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The server's `{"error": ...}` message, or the raw body.
    pub fn error_message(&self) -> String {
        match serde_json::from_slice::<ErrorBody>(&self.body) {
            Ok(e) => e.error,
            Err(_) => self.text(),
        }
    }

    /// The body as `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

/// One keep-alive connection (async).
pub struct Connection {
    sender: SendRequest<Full<Bytes>>,
}

impl Connection {
    /// Connects and starts the connection's driver task (needs a tokio
    /// runtime).
    pub async fn open(target: &Target) -> Result<Connection, ClientError> {
        let err = |source| ClientError::Connect {
            target: target.to_string(),
            source,
        };
        let sender = match target {
            Target::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p).await.map_err(err)?;
                handshake(s).await?
            }
            Target::Tcp(a) => {
                let s = tokio::net::TcpStream::connect(a).await.map_err(err)?;
                let _ = s.set_nodelay(true);
                handshake(s).await?
            }
        };
        Ok(Connection { sender })
    }

    /// Sends one request; `path` is the full path (e.g. `/api/v1/vms`).
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Reply, ClientError> {
        self.send(method, path, body.map(|v| v.to_string().into_bytes()))
            .await
    }

    /// Sends one request with an already encoded JSON body.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Reply, ClientError> {
        self.sender.ready().await?;
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, "localhost");
        let payload = match body {
            Some(v) => {
                b = b.header(CONTENT_TYPE, "application/json");
                Bytes::from(v)
            }
            None => Bytes::new(),
        };
        let req = b
            .body(Full::new(payload))
            .map_err(|e| ClientError::Request(e.to_string()))?;
        let resp = self.sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp.into_body().collect().await?.to_bytes().to_vec();
        Ok(Reply {
            status,
            content_type,
            body,
        })
    }
}

async fn handshake<S>(s: S) -> Result<SendRequest<Full<Bytes>>, ClientError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            log::debug!("API client connection: {e}");
        }
    });
    Ok(sender)
}

/// A blocking client: one connection per request.
pub struct Client {
    target: Target,
    rt: tokio::runtime::Runtime,
    /// Whole-request deadline (VM creation may take a while).
    pub timeout: Duration,
}

impl Client {
    pub fn new(target: Target) -> Result<Client, ClientError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ClientError::Runtime)?;
        Ok(Client {
            target,
            rt,
            timeout: Duration::from_secs(60),
        })
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Sends `method` to `path` (relative to `/api/v1`, e.g. `/vms`).
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Reply, ClientError> {
        self.send(method, path, body.map(|v| v.to_string().into_bytes()))
    }

    /// Sends `method` to `path` with an already encoded JSON body.
    fn send(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<Reply, ClientError> {
        let full = format!("{PREFIX}{path}");
        self.rt.block_on(async {
            let work = async {
                let mut c = Connection::open(&self.target).await?;
                c.send(method, &full, body).await
            };
            tokio::time::timeout(self.timeout, work)
                .await
                .map_err(|_| ClientError::Timeout(self.timeout))?
        })
    }
}

/// Typed calls: one per operation the CLI uses, each answering the body's
/// type; an error status is [`ClientError::Status`].
impl Client {
    /// Sends `body` (as JSON) and checks the status.
    fn typed(
        &self,
        method: &'static str,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<Reply, ClientError> {
        let bytes = body
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|e| ClientError::Request(e.to_string()))?;
        let r = self.send(method, path, bytes)?;
        if r.is_success() {
            Ok(r)
        } else {
            Err(status_error(method, path, &r))
        }
    }

    /// `GET /health`. A 503 that carries a health body (the dedup engine
    /// is stalled) is an answer, not an error.
    pub fn health(&self) -> Result<Health, ClientError> {
        let r = self.send("GET", "/health", None)?;
        if r.status == 503 {
            if let Ok(h) = r.decode::<Health>() {
                return Ok(h);
            }
        }
        if !r.is_success() {
            return Err(status_error("GET", "/health", &r));
        }
        decode("GET", "/health", &r)
    }

    /// `GET /vms`.
    pub fn vms(&self) -> Result<Vec<VmInfo>, ClientError> {
        let r = self.typed("GET", "/vms", None::<&()>)?;
        decode("GET", "/vms", &r)
    }

    /// `GET /dedup`; `None` when the process has no dedup backend (404).
    pub fn dedup(&self) -> Result<Option<DedupView>, ClientError> {
        let r = self.send("GET", "/dedup", None)?;
        match r.status {
            404 => Ok(None),
            _ if r.is_success() => decode("GET", "/dedup", &r).map(Some),
            _ => Err(status_error("GET", "/dedup", &r)),
        }
    }

    /// `PATCH /dedup`: the new state.
    pub fn patch_dedup(&self, p: &DedupSettings) -> Result<DedupView, ClientError> {
        let r = self.typed("PATCH", "/dedup", Some(p))?;
        decode("PATCH", "/dedup", &r)
    }

    /// `PUT /vms/{name}`: creates and starts the VM.
    pub fn create_vm(&self, vc: &VmConfig) -> Result<VmInfo, ClientError> {
        let path = format!("/vms/{}", vc.name);
        let r = self.typed("PUT", &path, Some(vc))?;
        decode("PUT", &path, &r)
    }

    /// `PATCH /vms/{name}`: pauses or resumes the VM.
    pub fn set_vm_state(&self, name: &str, state: VmTarget) -> Result<VmInfo, ClientError> {
        let path = format!("/vms/{name}");
        let r = self.typed("PATCH", &path, Some(&StatePatch { state }))?;
        decode("PATCH", &path, &r)
    }

    /// `PUT /vms/{name}/balloon`: asks the VM's balloon for `target_mib`.
    pub fn set_balloon(&self, name: &str, target_mib: u64) -> Result<VmInfo, ClientError> {
        let path = format!("/vms/{name}/balloon");
        let body = crate::balloon::BalloonTarget { target_mib };
        let r = self.typed("PUT", &path, Some(&body))?;
        decode("PUT", &path, &r)
    }

    /// `GET /vms/{name}`.
    pub fn vm(&self, name: &str) -> Result<VmInfo, ClientError> {
        let path = format!("/vms/{name}");
        let r = self.typed("GET", &path, None::<&()>)?;
        decode("GET", &path, &r)
    }

    /// `PUT /shutdown`: the daemon stops every VM and exits.
    pub fn shutdown(&self) -> Result<(), ClientError> {
        self.typed("PUT", "/shutdown", None::<&()>).map(drop)
    }

    /// `DELETE /vms/{name}`.
    pub fn delete_vm(&self, name: &str) -> Result<(), ClientError> {
        self.typed("DELETE", &format!("/vms/{name}"), None::<&()>)
            .map(drop)
    }
}

fn status_error(method: &'static str, path: &str, r: &Reply) -> ClientError {
    ClientError::Status {
        method,
        path: path.to_string(),
        status: r.status,
        message: r.error_message(),
    }
}

fn decode<T: DeserializeOwned>(
    method: &'static str,
    path: &str,
    r: &Reply,
) -> Result<T, ClientError> {
    r.decode().map_err(|source| ClientError::Body {
        method,
        path: path.to_string(),
        source,
    })
}
