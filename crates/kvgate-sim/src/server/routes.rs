//! The replica's HTTP surface: every route, mounted in one place, behind
//! vLLM's `--api-key` check. Handlers live in `http.rs` (generation, models,
//! metrics, tokenize), `messages.rs` (Anthropic's Messages API), `responses.rs`
//! (OpenAI's Responses API and its store) and
//! `render.rs` (render and version); this module is
//! the only one that names both. The runtime LoRA routes (`lora.rs`) are
//! mounted only when allowed.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::server::http::{self, Shared};
use crate::server::{lora, messages, render, responses};

pub(crate) fn router(state: Shared) -> Router {
    let mut router = Router::new();
    if state.config.allow_runtime_lora_updating {
        // Mounted only then, as vLLM does (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`):
        // otherwise the paths answer 404.
        router = router
            .route("/v1/load_lora_adapter", post(lora::load_lora_adapter))
            .route("/v1/unload_lora_adapter", post(lora::unload_lora_adapter));
    }
    router
        .route("/health", get(http::health))
        .route("/v1/models", get(http::models))
        .route("/metrics", get(http::metrics))
        .route("/reset_prefix_cache", post(http::reset_prefix_cache))
        .route("/debug/kv_blocks", get(http::kv_blocks))
        .route("/debug/kv_transfers", get(http::kv_transfers))
        .route("/v1/chat/completions", post(http::chat))
        .route("/v1/completions", post(http::completions))
        .route("/v1/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve))
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route("/inference/v1/generate", post(http::generate_tokens))
        .route("/v1/chat/completions/render", post(render::chat))
        .route("/v1/completions/render", post(render::completions))
        .route("/version", get(render::version))
        .route("/tokenize", post(http::tokenize))
        .route("/detokenize", post(http::detokenize))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), auth))
        .with_state(state)
}

/// vLLM's `--api-key`: only paths under `/v1` need the bearer token.
async fn auth(State(state): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        if req.uri().path().starts_with("/v1") && req.method() != axum::http::Method::OPTIONS {
            let ok = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.strip_prefix("Bearer ") == Some(key.as_str()));
            if !ok {
                return (StatusCode::UNAUTHORIZED, Json(json!({"error": "Unauthorized"})))
                    .into_response();
            }
        }
    }
    next.run(req).await
}
