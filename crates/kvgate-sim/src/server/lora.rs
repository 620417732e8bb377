//! LoRA adapters on the HTTP side, as vLLM 0.33's serving layer keeps them:
//! the registry of servable adapters (static `--lora-modules` plus runtime
//! loads), the `--lora-modules` argument forms, and the runtime routes
//! `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`.
//!
//! Status codes, error types and messages follow vLLM's
//! `vllm/entrypoints/openai/models/serving.py` (`OpenAIServingModels`:
//! `load_lora_adapter`, `unload_lora_adapter` and their request checks) and
//! the routes' answers (a plain-text success body, no content type; an
//! error as vLLM's JSON error body). Where the engine's slots come in, the
//! driver calls [`crate::Engine::load_lora`] / `unload_lora` on every rank.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::server::driver::Command;
use crate::server::http::{error_typed, parse_json, Shared};

/// One adapter the replica serves (vLLM's `LoRAModulePath`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraModule {
    /// The name requests put in `model`.
    pub name: String,
    /// Where the weights would be read from; `/v1/models` shows it as `root`.
    pub path: String,
    /// The served model it extends (`/v1/models` `parent`); the first served
    /// name when unset or not a served name.
    #[serde(default)]
    pub base_model_name: Option<String>,
}

impl LoraModule {
    /// An adapter known by name only (`--lora-adapter NAME`): its path is its name.
    pub fn named(name: &str) -> LoraModule {
        LoraModule { name: name.to_owned(), path: name.to_owned(), base_model_name: None }
    }

    /// One `--lora-modules` value in either of vLLM's forms: `name=path`, or
    /// JSON `{"name": .., "path": .., "base_model_name": ..}` (vLLM's
    /// `LoRAParserAction` in `vllm/entrypoints/openai/cli_args.py`).
    pub fn parse(item: &str) -> Result<LoraModule, String> {
        let item = item.trim();
        if item.starts_with('{') {
            return serde_json::from_str(item)
                .map_err(|_| format!("Invalid JSON format for --lora-modules: {item}"));
        }
        match item.split('=').collect::<Vec<_>>()[..] {
            [name, path] if !name.is_empty() && !path.is_empty() => {
                Ok(LoraModule { name: name.to_owned(), path: path.to_owned(), base_model_name: None })
            }
            _ => Err(format!(
                "Invalid format for --lora-modules: {item}. Expected format: 'name=path' or JSON format: '{{\"name\": \"name\", \"path\": \"lora_path\", \"base_model_name\": \"id\"}}'"
            )),
        }
    }
}

/// vLLM's reading of `VLLM_ALLOW_RUNTIME_LORA_UPDATING` (`vllm/envs.py`):
/// true when the value, trimmed and lower-cased, is `1` or `true`.
pub fn runtime_lora_updating_from_env(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.trim().to_lowercase().as_str(), "1" | "true"))
}

/// vLLM's `InvalidUserInput` 400.
fn invalid(message: String) -> Response {
    error_typed(StatusCode::BAD_REQUEST, "InvalidUserInput", message)
}

/// A body field of the request model: a missing or non-string field is a
/// validation error before any handler runs (the message; the caller
/// answers [`validation_error`]).
fn required_str(body: &Value, field: &str, model: &str) -> Result<String, String> {
    match body.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(format!(
            "1 validation error for {model}\n{field}\n  Input should be a valid string"
        )),
        None => Err(format!("1 validation error for {model}\n{field}\n  Field required")),
    }
}

/// A 400 as vLLM answers request-validation (pydantic) errors; the message
/// text is ours, not pydantic's.
fn validation_error(message: String) -> Response {
    error_typed(StatusCode::BAD_REQUEST, "Bad Request", message)
}

fn engine_stopped() -> Response {
    error_typed(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailableError", "engine stopped")
}

/// vLLM's success answer: the text alone, status 200, no content type
/// (Starlette's `Response(content=...)` without a media type).
fn success(text: String) -> Response {
    let mut r = Response::new(Body::from(text));
    *r.status_mut() = StatusCode::OK;
    r
}

/// Sends one command per rank and waits for every answer; false when an
/// engine has stopped.
async fn on_every_rank(state: &Shared, make: impl Fn(oneshot::Sender<()>) -> Command) -> bool {
    for rank in &state.ranks {
        let (tx, rx) = oneshot::channel();
        if rank.send(make(tx)).is_err() || rx.await.is_err() {
            return false;
        }
    }
    true
}

/// `POST /v1/load_lora_adapter` `{"lora_name", "lora_path", "load_inplace"?}`.
/// The adapter becomes servable after `lora_load_ms` (scaled by
/// `--speedup`), resident in a slot of every rank, listed last.
pub(super) async fn load_lora_adapter(State(state): State<Shared>, body: Bytes) -> Response {
    let body = match parse_json(&body) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let model = "LoadLoRAAdapterRequest";
    let (name, path) =
        match (required_str(&body, "lora_name", model), required_str(&body, "lora_path", model)) {
            (Ok(n), Ok(p)) => (n, p),
            (Err(m), _) | (_, Err(m)) => return validation_error(m),
        };
    let load_inplace = body.get("load_inplace").and_then(Value::as_bool).unwrap_or(false);
    // vLLM holds a lock per adapter name; one lock for all keeps it simple
    // (loads of different adapters wait for each other).
    let _updating = state.lora_update.lock().await;
    if name.is_empty() || path.is_empty() {
        return invalid("Both 'lora_name' and 'lora_path' must be provided.".to_owned());
    }
    if !load_inplace && state.has_adapter(&name) {
        return invalid(format!(
            "The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True."
        ));
    }
    let wait = state.config.engine.lora_load_duration().div_f64(state.config.speedup);
    tokio::time::sleep(wait).await;
    let n = name.clone();
    if !on_every_rank(&state, |tx| Command::LoadLora(n.clone(), tx)).await {
        return engine_stopped();
    }
    let module = LoraModule { name: name.clone(), path, base_model_name: None };
    state.with_adapters(|adapters| match adapters.iter_mut().find(|a| a.name == name) {
        Some(existing) => *existing = module,
        None => adapters.push(module),
    });
    success(format!("Success: LoRA adapter '{name}' added successfully."))
}

/// `POST /v1/unload_lora_adapter` `{"lora_name"}`: no longer servable at once;
/// its slots are freed (requests already queued with it still finish).
pub(super) async fn unload_lora_adapter(State(state): State<Shared>, body: Bytes) -> Response {
    let body = match parse_json(&body) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let name = match required_str(&body, "lora_name", "UnloadLoRAAdapterRequest") {
        Ok(n) => n,
        Err(m) => return validation_error(m),
    };
    let _updating = state.lora_update.lock().await;
    if name.is_empty() {
        return invalid("'lora_name' needs to be provided to unload a LoRA adapter.".to_owned());
    }
    if !state.has_adapter(&name) {
        return error_typed(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            format!("The lora adapter '{name}' cannot be found."),
        );
    }
    state.with_adapters(|adapters| adapters.retain(|a| a.name != name));
    let n = name.clone();
    if !on_every_rank(&state, |tx| Command::UnloadLora(n.clone(), tx)).await {
        return engine_stopped();
    }
    success(format!("Success: LoRA adapter '{name}' removed successfully."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lora_modules_forms() {
        assert_eq!(
            LoraModule::parse("sql=/adapters/sql").unwrap(),
            LoraModule { name: "sql".into(), path: "/adapters/sql".into(), base_model_name: None }
        );
        let j = LoraModule::parse(r#"{"name":"a","path":"/p","base_model_name":"m"}"#).unwrap();
        assert_eq!(j.base_model_name.as_deref(), Some("m"));
        assert!(LoraModule::parse("noequals").is_err());
        assert!(LoraModule::parse("a=b=c").is_err());
        assert!(LoraModule::parse(r#"{"name":"a"}"#).is_err());
        assert!(LoraModule::parse(r#"{"name":"a","path":"p","x":1}"#).is_err());
    }

    #[test]
    fn env_reading_is_vllms() {
        for yes in ["1", "true", "True", " TRUE "] {
            assert!(runtime_lora_updating_from_env(Some(yes)), "{yes}");
        }
        for no in ["0", "yes", "on", "", "false"] {
            assert!(!runtime_lora_updating_from_env(Some(no)), "{no}");
        }
        assert!(!runtime_lora_updating_from_env(None));
    }
}
