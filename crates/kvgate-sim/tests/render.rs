//! vLLM 0.33's render routes, `/version`, and the request-level metrics
//! over real HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, OnceLock};

use kvgate_sim::server::metrics::{scrape, scrape_histogram, scrape_labeled};
use kvgate_sim::server::{start, Replica, ServerConfig};
use kvgate_sim::EngineConfig;
use kvgate_tokenize::service::{Tokenize, TokenizeService};
use kvgate_tokenize::{ChatRequest, ChatTokenizer, Endpoint};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::net::TcpListener;

const MODEL: &str = "Qwen/Qwen3-0.6B";

/// The tokenizer `kvgate tokenize` uses, called as it calls it.
fn bundled() -> &'static ChatTokenizer {
    static T: OnceLock<ChatTokenizer> = OnceLock::new();
    T.get_or_init(|| ChatTokenizer::bundled().unwrap())
}

async fn replica(api_key: Option<&str>) -> Replica {
    let t = Tokenize::new(ChatTokenizer::bundled().unwrap(), None);
    let tokenizer = Arc::new(TokenizeService::new(t, 1).unwrap());
    let config = ServerConfig {
        engine: EngineConfig { hash_seed: Some(7), num_gpu_blocks: 512, ..EngineConfig::default() },
        model: MODEL.to_owned(),
        speedup: 50.0,
        api_key: api_key.map(str::to_owned),
        ..ServerConfig::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    start(config, listener, tokenizer).await.unwrap()
}

async fn send(r: &Replica, path: &str, body: &str) -> (StatusCode, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", r.url()))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn post(r: &Replica, path: &str, body: &Value) -> Value {
    let (status, v) = send(r, path, &body.to_string()).await;
    assert!(status.is_success(), "{path}: {status} {v}");
    v
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|t| u32::try_from(t.as_u64().unwrap()).unwrap()).collect()
}

fn chat_body() -> Value {
    json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three primes, please."},
        ],
        "max_tokens": 3,
        "temperature": 0.5,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_render_gives_the_ids_kvgate_tokenize_computes() {
    let r = replica(None).await;
    let body = chat_body();
    let rendered = post(&r, "/v1/chat/completions/render", &body).await;
    let mut expected: ChatRequest = serde_json::from_value(body.clone()).unwrap();
    expected.endpoint = Endpoint::ChatCompletions;
    let expected = bundled().encode_chat(&expected).unwrap();
    assert_eq!(ids(&rendered["token_ids"]), expected);

    // vLLM's GenerateRequest shape.
    assert!(rendered["request_id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(rendered["model"], MODEL);
    assert_eq!(rendered["output_mode"], "tokens");
    assert_eq!(rendered["stream"], false);
    assert_eq!(rendered["priority"], 0);
    assert_eq!(rendered["sampling_params"]["max_tokens"], 3);
    assert_eq!(rendered["sampling_params"]["temperature"], 0.5);
    assert_eq!(rendered["sampling_params"]["output_kind"], 2);
    assert_eq!(rendered["parse_context"]["tool_choice"], "none");
    assert_eq!(rendered["parse_context"]["history_tool_call_cnt"], 0);
    for key in ["features", "token_offsets", "kv_transfer_params", "cache_salt"] {
        assert!(rendered.get(key).is_some_and(Value::is_null), "{key}: {rendered}");
    }

    // The same prompt the chat route runs.
    let done = post(&r, "/v1/chat/completions", &body).await;
    assert_eq!(done["usage"]["prompt_tokens"].as_u64().unwrap(), expected.len() as u64);
    // Rendering is not the engine tokenizing for generation.
    let text = reqwest::get(format!("{}/metrics", r.url())).await.unwrap().text().await.unwrap();
    assert_eq!(scrape(&text, "kvgate_sim_tokenizations_total"), Some(1.0));

    // The request id comes from X-Request-Id when given.
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions/render", r.url()))
        .header("x-request-id", "abc")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.json::<Value>().await.unwrap()["request_id"], "chatcmpl-abc");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_render_gives_the_ids_kvgate_tokenize_computes() {
    let r = replica(None).await;
    let prompt = "The quick brown fox jumps over the lazy dog.";
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 5, "request_id": "q"});
    let rendered = post(&r, "/v1/completions/render", &body).await;
    let list = rendered.as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(ids(&list[0]["token_ids"]), bundled().encode_prompt(prompt).unwrap());
    assert_eq!(list[0]["request_id"], "cmpl-q");
    assert_eq!(list[0]["sampling_params"]["max_tokens"], 5);
    assert!(list[0]["parse_context"].is_null());

    // A batch renders one request per prompt; token prompts pass through.
    let body = json!({"model": MODEL, "prompt": [[5, 6, 7], [8, 9]], "request_id": "b"});
    let rendered = post(&r, "/v1/completions/render", &body).await;
    let list = rendered.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(ids(&list[0]["token_ids"]), [5, 6, 7]);
    assert_eq!(ids(&list[1]["token_ids"]), [8, 9]);
    assert_eq!(list[1]["request_id"], "cmpl-b-1");
    let body = json!({"model": MODEL, "prompt": ["a b", "c"], "add_special_tokens": false});
    let rendered = post(&r, "/v1/completions/render", &body).await;
    assert_eq!(ids(&rendered[1]["token_ids"]), bundled().encode_text_no_special("c").unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_errors_are_vllm_shaped() {
    let r = replica(None).await;
    for (path, body) in [
        ("/v1/chat/completions/render", "{not json"),
        ("/v1/chat/completions/render", r#"{"model": "Qwen/Qwen3-0.6B"}"#),
        ("/v1/chat/completions/render", r#"{"messages": 3}"#),
        ("/v1/chat/completions/render", "[]"),
        ("/v1/completions/render", "{not json"),
        ("/v1/completions/render", r#"{"model": "Qwen/Qwen3-0.6B"}"#),
        ("/v1/completions/render", r#"{"prompt": []}"#),
        ("/v1/completions/render", r#"{"prompt": [[]]}"#),
        ("/v1/completions/render", r#"{"prompt": {"x": 1}}"#),
    ] {
        let (status, v) = send(&r, path, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}: {v}");
        assert_eq!(v["error"]["code"], 400, "{v}");
        assert_eq!(v["error"]["type"], "BadRequestError", "{v}");
        assert!(v["error"]["message"].is_string(), "{v}");
    }
    let (status, v) = send(&r, "/v1/completions/render", r#"{"model": "x", "prompt": "a"}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    // Longer than the context (512 blocks of 16).
    let long = json!({"prompt": vec![1; 9000]}).to_string();
    let (status, v) = send(&r, "/v1/completions/render", &long).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("maximum context length"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_answers_and_render_needs_the_api_key() {
    let r = replica(Some("k")).await;
    let v: Value =
        reqwest::get(format!("{}/version", r.url())).await.unwrap().json().await.unwrap();
    assert_eq!(v, json!({"version": "0.33.0"}));
    let body = chat_body().to_string();
    let (status, _) = send(&r, "/v1/chat/completions/render", &body).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/completions/render", r.url()))
        .bearer_auth("k")
        .json(&json!({"prompt": [1, 2]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

/// The request-level histograms over HTTP: observed once per finished
/// request, consistent with the usage the response reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_metrics_are_observed_at_finish() {
    let r = replica(None).await;
    let prompt: Vec<u32> = (100..400).collect();
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 4, "ignore_eos": true});
    let first = post(&r, "/v1/completions", &body).await;
    let second = post(&r, "/v1/completions", &body).await;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(cached, 288, "18 full blocks of the 300-token prompt");
    let text = reqwest::get(format!("{}/metrics", r.url())).await.unwrap().text().await.unwrap();
    let h = |name: &str| scrape_histogram(&text, name).unwrap_or_else(|| panic!("{name}"));
    for name in [
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_time_per_output_token_seconds",
    ] {
        assert_eq!(h(name).count, 2.0, "{name}");
        assert!(h(name).sum > 0.0 || name.contains("queue"), "{name}");
    }
    assert_eq!(h("vllm:request_prompt_tokens").sum, 600.0);
    assert_eq!(h("vllm:request_generation_tokens").sum, 8.0);
    assert_eq!(h("vllm:request_prefill_kv_computed_tokens").sum, (600 - cached) as f64);
    assert_eq!(h("vllm:iteration_tokens_total").sum, (600 - cached + 8) as f64);
    assert_eq!(scrape(&text, "vllm:prompt_tokens_total"), Some(600.0));
    assert_eq!(scrape(&text, "vllm:generation_tokens_total"), Some(8.0));
    assert_eq!(
        scrape_labeled(&text, "vllm:request_success_total", "finished_reason=\"length\""),
        Some(2.0)
    );
    // Phases add up: e2e = queue + inference, inference = prefill + decode.
    let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
    let (e2e, queue, inference) = (
        h("vllm:e2e_request_latency_seconds").sum,
        h("vllm:request_queue_time_seconds").sum,
        h("vllm:request_inference_time_seconds").sum,
    );
    assert!(close(e2e, queue + inference), "{e2e} vs {queue} + {inference}");
    let (prefill, decode) =
        (h("vllm:request_prefill_time_seconds").sum, h("vllm:request_decode_time_seconds").sum);
    assert!(close(inference, prefill + decode));
}
