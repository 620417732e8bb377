//! A scripted [`EngineClient`] for unit tests: the next generation requests
//! get the queued [`Answer`]s in order, whichever engine they go to, then
//! the default (a short SSE stream); probes always succeed. Every generation request is
//! recorded, so tests see where it went and what it carried.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::{self, StreamExt};

use crate::locks::lock;
use crate::request::engine_client::{EngineClient, EngineRequest, EngineResponse, SendError};

/// How a stream ends after its chunks.
#[derive(Clone, Debug)]
pub(crate) enum End {
    /// Cleanly (the chunks carry `[DONE]` or not, as the test wrote them).
    Close,
    /// With a broken body.
    Break,
    /// Never: the engine stalls.
    Stall,
}

/// One scripted answer.
#[derive(Clone, Debug)]
pub(crate) enum Answer {
    /// Connection refused.
    Refuse,
    /// This status with this body (JSON).
    Status(u16, &'static str),
    /// 200 `text/event-stream`: chunks, each after its delay, then the end.
    Sse(Vec<(Duration, &'static str)>, End),
    /// No response head, ever.
    Hang,
    /// 200 `text/event-stream` whose chunks the test sends, each when it
    /// chooses (see [`fed`]); dropping the sender closes the stream.
    Fed(Arc<Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<&'static str>>>>),
}

/// A [`Answer::Fed`] stream and the sender of its chunks.
pub(crate) fn fed() -> (Answer, tokio::sync::mpsc::UnboundedSender<&'static str>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    (Answer::Fed(Arc::new(Mutex::new(Some(rx)))), tx)
}

/// A short well-formed completion stream: one token, then `[DONE]`.
pub(crate) fn one_token_stream() -> Answer {
    Answer::Sse(
        vec![
            (Duration::ZERO, "data: {\"choices\":[{\"index\":0,\"text\":\"hi\"}]}\n\n"),
            (Duration::ZERO, "data: [DONE]\n\n"),
        ],
        End::Close,
    )
}

/// One generation request as the fake saw it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    /// `host:port` of the engine.
    pub(crate) engine: String,
    pub(crate) path: String,
    pub(crate) body: Bytes,
    pub(crate) headers: Vec<(String, String)>,
}

#[derive(Debug, Default)]
pub(crate) struct FakeEngines {
    /// Answers for whichever engine is asked next.
    next: Mutex<VecDeque<Answer>>,
    pub(crate) seen: Mutex<Vec<Seen>>,
}

impl FakeEngines {
    /// Queues `answers` for the next requests, whichever engine they go to
    /// (a test cannot know which replica the router picks first).
    pub(crate) fn next(&self, answers: impl IntoIterator<Item = Answer>) {
        lock(&self.next).extend(answers);
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        lock(&self.seen).clone()
    }
}

fn authority(url: &axum::http::Uri) -> String {
    crate::replicas::replica::Replica::endpoint_of(url)
}

impl EngineClient for FakeEngines {
    fn post(&self, req: EngineRequest) -> BoxFuture<'static, Result<EngineResponse, SendError>> {
        let engine = authority(&req.url);
        let headers = req
            .headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        let path = req.url.path().to_owned();
        lock(&self.seen).push(Seen { engine: engine.clone(), path, body: req.body, headers });
        let answer = lock(&self.next).pop_front().unwrap_or_else(one_token_stream);
        Box::pin(async move {
            let mut headers = HeaderMap::new();
            match answer {
                Answer::Refuse => Err(SendError::Unreachable("connection refused".into())),
                Answer::Hang => std::future::pending().await,
                Answer::Status(status, body) => {
                    headers.insert("content-type", HeaderValue::from_static("application/json"));
                    let body = stream::iter([Ok(Bytes::from_static(body.as_bytes()))]).boxed();
                    Ok(EngineResponse { status, headers, body })
                }
                Answer::Sse(chunks, end) => {
                    headers.insert("content-type", HeaderValue::from_static("text/event-stream"));
                    let chunks = stream::iter(chunks).then(|(delay, text)| async move {
                        tokio::time::sleep(delay).await;
                        Ok(Bytes::from_static(text.as_bytes()))
                    });
                    let tail = match end {
                        End::Close => stream::empty().boxed(),
                        End::Break => stream::iter([Err("connection reset".to_owned())]).boxed(),
                        End::Stall => stream::pending().boxed(),
                    };
                    Ok(EngineResponse { status: 200, headers, body: chunks.chain(tail).boxed() })
                }
                Answer::Fed(rx) => {
                    headers.insert("content-type", HeaderValue::from_static("text/event-stream"));
                    let Some(rx) = lock(&rx).take() else {
                        return Err(SendError::Failed("a fed answer is used once".into()));
                    };
                    let body = chunks_from(rx).map(|t| Ok(Bytes::from_static(t.as_bytes())));
                    Ok(EngineResponse { status: 200, headers, body: body.boxed() })
                }
            }
        })
    }

    fn get(
        &self,
        url: String,
        _bearer: Option<String>,
        _timeout: Duration,
    ) -> BoxFuture<'static, Result<String, SendError>> {
        let body = if url.ends_with("/v1/models") { r#"{"object":"list","data":[]}"# } else { "" };
        Box::pin(async move { Ok(body.to_owned()) })
    }
}

/// The chunks a test sends, as a stream that ends when the sender goes.
fn chunks_from(
    rx: tokio::sync::mpsc::UnboundedReceiver<&'static str>,
) -> impl futures_util::Stream<Item = &'static str> {
    stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|t| (t, rx)) })
}
