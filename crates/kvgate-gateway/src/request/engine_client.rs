//! The seam between the gateway and its engines. [`EngineClient`] is all the
//! request path and the monitor need from HTTP: POST a generation request
//! and get its head and a body stream, GET a probe path as text. Production
//! uses [`HttpEngines`] (hyper's pooled client for generation requests,
//! reqwest for probes); unit tests use the
//! scripted fake in `engine_fake.rs`, so retries before the first byte,
//! stream error tails and first-token detection are tested without sockets.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, StreamExt, TryStreamExt};
use http_body_util::{BodyDataStream, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::request::request_error::with_causes;

/// An engine's response body, chunk by chunk as it arrives.
pub(crate) type BodyStream = BoxStream<'static, Result<Bytes, String>>;

/// One generation request to an engine.
#[derive(Debug)]
pub(crate) struct EngineRequest {
    pub(crate) url: Uri,
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
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum SendError {
    /// Nothing listens (connection refused, unreachable).
    Unreachable(Cause),
    /// Anything else (reset, TLS, a body that broke, a non-2xx probe).
    Failed(Cause),
}

impl SendError {
    fn cause(&self) -> &Cause {
        match self {
            SendError::Unreachable(c) | SendError::Failed(c) => c,
        }
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.cause().text)
    }
}

impl std::error::Error for SendError {
    /// The HTTP client's own error, whose chain reaches the I/O error.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let e = self.cause().error.as_deref()?;
        Some(e as &(dyn std::error::Error + 'static))
    }
}

/// What went wrong: its text with every cause (what logs and answers say),
/// and the error itself where there is one, so that `source()` reaches the
/// engine's I/O error.
#[derive(Clone, Debug)]
pub(crate) struct Cause {
    text: String,
    error: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl Cause {
    fn of<E: std::error::Error + Send + Sync + 'static>(e: E) -> Cause {
        Cause { text: with_causes(&e), error: Some(Arc::new(e)) }
    }
}

impl From<&str> for Cause {
    fn from(text: &str) -> Cause {
        Cause { text: text.to_owned(), error: None }
    }
}

impl From<String> for Cause {
    fn from(text: String) -> Cause {
        Cause { text, error: None }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Equal by what they say.
impl PartialEq for Cause {
    fn eq(&self, other: &Cause) -> bool {
        self.text == other.text
    }
}

/// What the gateway needs from HTTP to its engines.
pub(crate) trait EngineClient: Send + Sync + Debug {
    /// POSTs `req`; resolves when the response head has arrived.
    fn post(&self, req: EngineRequest) -> BoxFuture<'static, Result<EngineResponse, SendError>>;

    /// Sends a bodiless `method` request to `url` (a stored response's
    /// GET or cancel, `stored_responses.rs`) and resolves with the head,
    /// whatever its status. Clients that cannot say so.
    fn bodiless(
        &self,
        method: Method,
        url: Uri,
        bearer: Option<String>,
    ) -> BoxFuture<'static, Result<EngineResponse, SendError>> {
        let _ = (method, url, bearer);
        Box::pin(std::future::ready(Err(SendError::Failed("not supported by this client".into()))))
    }

    /// GETs `url` within `timeout`; the body of a 2xx answer as text, a
    /// [`SendError::Failed`] naming the status otherwise.
    fn get(
        &self,
        url: String,
        bearer: Option<String>,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<String, SendError>>;
}

/// How the engine client connects: the timeouts and the TLS configuration
/// for https:// engines (`None`: plain HTTP only, as the configuration
/// refuses https:// engines without `tls.ca`).
#[derive(Debug, Clone)]
pub(crate) struct Connect {
    pub(crate) connect_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) tls: Option<rustls::ClientConfig>,
}

/// Engines over HTTP. Generation requests go through hyper's pooled client
/// directly: reqwest wraps the same client in layers the request path does
/// not use (redirects, retries, a URL type), and two of them parse the URL
/// again on every request, which was ~3 % of a short chat's gateway CPU.
/// Probes keep reqwest (its timeout and text helpers; they are rare).
#[derive(Debug)]
pub(crate) struct HttpEngines {
    client: reqwest::Client,
    post: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl HttpEngines {
    /// `client` for probes; a pooled hyper client built from `connect` for
    /// generation requests.
    pub(crate) fn new(client: reqwest::Client, connect: Connect) -> Result<HttpEngines, String> {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect.connect_timeout));
        // The TLS layer below takes https:// URLs; plain ones pass through.
        http.enforce_http(false);
        let mut tls = match connect.tls {
            Some(c) => c,
            // No trust anchors: the configuration refuses https:// engines
            // without `tls.ca`, and one that got here would not verify.
            None => rustls::ClientConfig::builder_with_provider(crate::doors::tls::provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        };
        // hyper-rustls sets ALPN itself, from the protocols enabled below.
        tls.alpn_protocols.clear();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let post = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(connect.idle_timeout)
            .pool_timer(TokioTimer::new())
            .build(connector);
        Ok(HttpEngines { client, post })
    }
}

fn post_error(e: hyper_util::client::legacy::Error) -> SendError {
    if e.is_connect() {
        SendError::Unreachable(Cause::of(e))
    } else {
        SendError::Failed(Cause::of(e))
    }
}

fn send_error(e: reqwest::Error) -> SendError {
    if e.is_connect() {
        SendError::Unreachable(Cause::of(e))
    } else {
        SendError::Failed(Cause::of(e))
    }
}

impl HttpEngines {
    /// One request to an engine through the pooled client.
    fn send(
        &self,
        method: Method,
        req: EngineRequest,
    ) -> BoxFuture<'static, Result<EngineResponse, SendError>> {
        let mut http = Request::new(Full::new(req.body));
        *http.method_mut() = method;
        *http.uri_mut() = req.url;
        let headers = http.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        for (n, v) in req.headers {
            headers.append(n, v);
        }
        if let Some(k) = &req.bearer {
            match HeaderValue::try_from(format!("Bearer {k}")) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    headers.insert(header::AUTHORIZATION, v);
                }
                Err(_) => {
                    let e = SendError::Failed("the engine's API key is not a valid header".into());
                    return Box::pin(std::future::ready(Err(e)));
                }
            }
        }
        let sent = self.post.request(http);
        Box::pin(async move {
            let (head, body) = sent.await.map_err(post_error)?.into_parts();
            Ok(EngineResponse {
                status: head.status.as_u16(),
                headers: head.headers,
                body: BodyDataStream::new(body).map_err(|e| with_causes(&e)).boxed(),
            })
        })
    }
}

impl EngineClient for HttpEngines {
    fn bodiless(
        &self,
        method: Method,
        url: Uri,
        bearer: Option<String>,
    ) -> BoxFuture<'static, Result<EngineResponse, SendError>> {
        let req = EngineRequest { url, body: Bytes::new(), headers: Vec::new(), bearer };
        self.send(method, req)
    }

    fn post(&self, req: EngineRequest) -> BoxFuture<'static, Result<EngineResponse, SendError>> {
        self.send(Method::POST, req)
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
                return Err(SendError::Failed(format!("HTTP {}", resp.status()).into()));
            }
            resp.text().await.map_err(send_error)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;

    fn engines() -> HttpEngines {
        let connect = Connect {
            connect_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(90),
            tls: None,
        };
        HttpEngines::new(reqwest::Client::new(), connect).expect("engines")
    }

    /// An engine that answers with what it received: method, path, the
    /// headers the gateway sets, and the body.
    async fn echo_engine() -> String {
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            post(|headers: HeaderMap, body: Bytes| async move {
                let h = |n: &str| {
                    headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned()
                };
                let text = format!(
                    "{}|{}|{}|{}|{}",
                    h("content-type"),
                    h("authorization"),
                    h("x-data-parallel-rank"),
                    h("host"),
                    String::from_utf8_lossy(&body)
                );
                ([("x-engine", "echo")], text)
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn a_post_carries_body_headers_and_key_and_streams_the_answer() {
        let base = echo_engine().await;
        let req = EngineRequest {
            url: Uri::try_from(format!("{base}/v1/chat/completions")).expect("uri"),
            body: Bytes::from_static(br#"{"prompt_token_ids":[1,2,3]}"#),
            headers: vec![(HeaderName::from_static("x-data-parallel-rank"), 3.into())],
            bearer: Some("sk-engine".into()),
        };
        let resp = engines().post(req).await.expect("answer");
        assert_eq!(resp.status, 200);
        assert_eq!(resp.headers.get("x-engine").map(|v| v.as_bytes()), Some(&b"echo"[..]));
        let body: Vec<Bytes> = resp.body.try_collect().await.expect("body");
        let host = base.trim_start_matches("http://");
        assert_eq!(
            String::from_utf8_lossy(&body.concat()),
            format!("application/json|Bearer sk-engine|3|{host}|{{\"prompt_token_ids\":[1,2,3]}}")
        );
    }

    #[tokio::test]
    async fn nothing_listening_is_unreachable_and_a_bad_key_is_refused_before_sending() {
        // A port that was free a moment ago: connection refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let url = Uri::try_from(format!("http://127.0.0.1:{port}/v1/completions")).expect("uri");
        let req = |bearer: Option<&str>| EngineRequest {
            url: url.clone(),
            body: Bytes::from_static(b"{}"),
            headers: Vec::new(),
            bearer: bearer.map(str::to_owned),
        };
        let e = engines().post(req(None)).await.expect_err("refused");
        assert!(matches!(e, SendError::Unreachable(_)), "{e:?}");
        // Its cause chain reaches the refused connection's I/O error.
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        let mut io_kind = None;
        while let Some(c) = cause {
            io_kind = io_kind.or(c.downcast_ref::<std::io::Error>().map(|io| io.kind()));
            cause = c.source();
        }
        assert_eq!(io_kind, Some(std::io::ErrorKind::ConnectionRefused), "{e:?}");
        let e = engines().post(req(Some("bad\nkey"))).await.expect_err("bad key");
        assert!(
            matches!(e, SendError::Failed(ref m) if m.to_string().contains("API key")),
            "{e:?}"
        );
    }
}
