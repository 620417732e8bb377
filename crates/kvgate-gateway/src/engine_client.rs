//! The seam between the gateway and its engines. [`EngineClient`] is all the
//! request path and the monitor need from HTTP: POST a generation request
//! and get its head and a body stream, GET a probe path as text. Production
//! uses [`HttpEngines`] (reqwest, one pooled client); unit tests use the
//! scripted fake in `engine_fake.rs`, so retries before the first byte,
//! stream error tails and first-token detection are tested without sockets.

use std::fmt::Debug;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, StreamExt, TryStreamExt};

/// An engine's response body, chunk by chunk as it arrives.
pub(crate) type BodyStream = BoxStream<'static, Result<Bytes, String>>;

/// One generation request to an engine.
#[derive(Debug)]
pub(crate) struct EngineRequest {
    pub(crate) url: reqwest::Url,
    /// JSON.
    pub(crate) body: Bytes,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    /// The engine's API key, sent as a bearer token.
    pub(crate) bearer: Option<String>,
}

/// An engine's answer: its head, and its body still to be read.
pub(crate) struct EngineResponse {
    pub(crate) status: u16,
    pub(crate) headers: HeaderMap,
    pub(crate) body: BodyStream,
}

impl Debug for EngineResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineResponse").field("status", &self.status).finish_non_exhaustive()
    }
}

/// Why a request got no answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SendError {
    /// Nothing listens (connection refused, unreachable).
    Unreachable(String),
    /// Anything else (reset, TLS, a body that broke, a non-2xx probe).
    Failed(String),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Unreachable(e) | SendError::Failed(e) => f.write_str(e),
        }
    }
}

/// What the gateway needs from HTTP to its engines.
pub(crate) trait EngineClient: Send + Sync + Debug {
    /// POSTs `req`; resolves when the response head has arrived.
    fn post(&self, req: EngineRequest) -> BoxFuture<'static, Result<EngineResponse, SendError>>;

    /// GETs `url` within `timeout`; the body of a 2xx answer as text, a
    /// [`SendError::Failed`] naming the status otherwise.
    fn get(
        &self,
        url: String,
        bearer: Option<String>,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<String, SendError>>;
}

/// Engines over HTTP, through one pooled reqwest client.
#[derive(Debug)]
pub(crate) struct HttpEngines {
    client: reqwest::Client,
}

impl HttpEngines {
    pub(crate) fn new(client: reqwest::Client) -> HttpEngines {
        HttpEngines { client }
    }
}

fn send_error(e: reqwest::Error) -> SendError {
    let text = with_causes(&e);
    if e.is_connect() {
        SendError::Unreachable(text)
    } else {
        SendError::Failed(text)
    }
}

/// `e` and each of its causes, `: `-separated: reqwest's own message says
/// only that sending failed, the reason (refused, a TLS certificate that
/// expired or chains to no trusted CA...) is in its sources.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

impl EngineClient for HttpEngines {
    fn post(&self, req: EngineRequest) -> BoxFuture<'static, Result<EngineResponse, SendError>> {
        let mut rb = self
            .client
            .post(req.url)
            .header(axum::http::header::CONTENT_TYPE, "application/json")
            .body(req.body);
        for (n, v) in req.headers {
            rb = rb.header(n, v);
        }
        if let Some(k) = &req.bearer {
            rb = rb.bearer_auth(k);
        }
        Box::pin(async move {
            let mut resp = rb.send().await.map_err(send_error)?;
            Ok(EngineResponse {
                status: resp.status().as_u16(),
                headers: std::mem::take(resp.headers_mut()),
                body: resp.bytes_stream().map_err(|e| e.to_string()).boxed(),
            })
        })
    }

    fn get(
        &self,
        url: String,
        bearer: Option<String>,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<String, SendError>> {
        let mut rb = self.client.get(url).timeout(timeout);
        if let Some(k) = &bearer {
            rb = rb.bearer_auth(k);
        }
        Box::pin(async move {
            let resp = rb.send().await.map_err(send_error)?;
            if !resp.status().is_success() {
                return Err(SendError::Failed(format!("HTTP {}", resp.status())));
            }
            resp.text().await.map_err(send_error)
        })
    }
}
