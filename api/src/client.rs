//! An HTTP/1.1 client for the API over the Unix socket (or loopback TCP),
//! built on hyper's connection-level client: used by the CLI (blocking,
//! one connection per command), the tests and the load generator (async,
//! keep-alive [`Connection`]s).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use serde_json::Value;

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
        match self.json() {
            Ok(v) => match v.get("error").and_then(Value::as_str) {
                Some(m) => m.to_string(),
                None => self.text(),
            },
            Err(_) => self.text(),
        }
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
        self.sender.ready().await?;
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, "localhost");
        let payload = match body {
            Some(v) => {
                b = b.header(CONTENT_TYPE, "application/json");
                Bytes::from(v.to_string())
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
        let full = format!("{PREFIX}{path}");
        self.rt.block_on(async {
            let work = async {
                let mut c = Connection::open(&self.target).await?;
                c.request(method, &full, body).await
            };
            tokio::time::timeout(self.timeout, work)
                .await
                .map_err(|_| ClientError::Timeout(self.timeout))?
        })
    }
}
