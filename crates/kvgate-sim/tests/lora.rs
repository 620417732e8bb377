//! LoRA adapters over real HTTP: the runtime load and unload routes with
//! vLLM 0.33's answers, `/v1/models` with served names and adapters, and
//! the LoRA metrics' text.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kvgate_sim::server::metrics::{scrape, scrape_labeled};
use kvgate_sim::server::{LoraModule, Replica, ServerConfig};
use kvgate_sim::EngineConfig;
use serde_json::{json, Value};

mod support;
use support::{replica, MODEL};

fn config() -> ServerConfig {
    ServerConfig {
        engine: EngineConfig { hash_seed: Some(7), lora_load_ms: 20.0, ..EngineConfig::default() },
        model: MODEL.to_owned(),
        speedup: 50.0,
        ..ServerConfig::default()
    }
}

/// Status, content type and body text of a POST.
async fn post(r: &Replica, path: &str, body: Value) -> (u16, Option<String>, String) {
    let resp =
        reqwest::Client::new().post(format!("{}{path}", r.url())).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    let ctype =
        resp.headers().get(reqwest::header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_owned());
    (status, ctype, resp.text().await.unwrap())
}

fn error_of(body: &str) -> (String, String, u64) {
    let v: Value = serde_json::from_str(body).unwrap();
    let e = &v["error"];
    (
        e["type"].as_str().unwrap().into(),
        e["message"].as_str().unwrap().into(),
        e["code"].as_u64().unwrap(),
    )
}

async fn complete(r: &Replica, model: &str, max_tokens: u32) -> (u16, Value) {
    let body =
        json!({"model": model, "prompt": (0..40).collect::<Vec<u32>>(), "max_tokens": max_tokens});
    let (status, _, text) = post(r, "/v1/completions", body).await;
    (status, serde_json::from_str(&text).unwrap())
}

async fn models(r: &Replica) -> Vec<Value> {
    let v: Value =
        reqwest::get(format!("{}/v1/models", r.url())).await.unwrap().json().await.unwrap();
    v["data"].as_array().unwrap().clone()
}

async fn metrics(r: &Replica) -> String {
    reqwest::get(format!("{}/metrics", r.url())).await.unwrap().text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_load_and_unload_answer_as_vllm() {
    let r = replica(ServerConfig { allow_runtime_lora_updating: true, ..config() }).await;
    let load = "/v1/load_lora_adapter";
    let unload = "/v1/unload_lora_adapter";

    // A missing field fails validation before the handler.
    let (status, _, body) = post(&r, load, json!({"lora_name": "sql"})).await;
    assert_eq!(status, 400);
    assert!(error_of(&body).1.contains("lora_path"), "{body}");
    // Empty fields are the handler's own check.
    let (status, _, body) = post(&r, load, json!({"lora_name": "", "lora_path": ""})).await;
    assert_eq!(status, 400);
    assert_eq!(
        error_of(&body),
        (
            "InvalidUserInput".into(),
            "Both 'lora_name' and 'lora_path' must be provided.".into(),
            400
        )
    );

    // Not servable before the load.
    let (status, v) = complete(&r, "sql", 2).await;
    assert_eq!(status, 404);
    assert_eq!(v["error"]["message"], "The model `sql` does not exist.");
    assert_eq!(v["error"]["type"], "NotFoundError");

    let (status, ctype, body) =
        post(&r, load, json!({"lora_name": "sql", "lora_path": "/adapters/sql"})).await;
    assert_eq!((status, body.as_str()), (200, "Success: LoRA adapter 'sql' added successfully."));
    assert_eq!(ctype, None, "vLLM answers plain text without a content type");
    let (status, _, body) =
        post(&r, load, json!({"lora_name": "sql", "lora_path": "/adapters/sql"})).await;
    assert_eq!(status, 400);
    assert_eq!(error_of(&body), (
        "InvalidUserInput".into(),
        "The lora adapter 'sql' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.".into(),
        400
    ));

    let cards = models(&r).await;
    let ids: Vec<&str> = cards.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [MODEL, "sql"]);
    assert_eq!(cards[1]["root"], "/adapters/sql");
    assert_eq!(cards[1]["parent"], MODEL);
    assert_eq!(cards[1]["max_model_len"], Value::Null);
    assert_eq!(cards[0]["parent"], Value::Null);
    assert_eq!(cards[0]["permission"][0]["object"], "model_permission");

    let (status, v) = complete(&r, "sql", 2).await;
    assert_eq!(status, 200);
    assert_eq!(v["model"], "sql", "an adapter's response names the adapter");

    let (status, ctype, body) = post(&r, unload, json!({"lora_name": "sql"})).await;
    assert_eq!((status, body.as_str()), (200, "Success: LoRA adapter 'sql' removed successfully."));
    assert_eq!(ctype, None);
    let (status, _, body) = post(&r, unload, json!({"lora_name": "sql"})).await;
    assert_eq!(status, 404);
    assert_eq!(
        error_of(&body),
        ("NotFoundError".into(), "The lora adapter 'sql' cannot be found.".into(), 404)
    );
    let (status, _, body) = post(&r, unload, json!({"lora_name": ""})).await;
    assert_eq!(status, 400);
    assert_eq!(error_of(&body).1, "'lora_name' needs to be provided to unload a LoRA adapter.");
    let (status, _, _) = post(&r, unload, json!({})).await;
    assert_eq!(status, 400);

    let (status, _) = complete(&r, "sql", 2).await;
    assert_eq!(status, 404, "unloaded: vLLM's 404 again");
    assert_eq!(models(&r).await.len(), 1);
    // The runtime load took the one slot; the request found it resident.
    let text = metrics(&r).await;
    assert_eq!(scrape(&text, "kvgate_sim_lora_loads_total"), Some(1.0));
    assert_eq!(scrape(&text, "kvgate_sim_lora_evictions_total"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_routes_are_not_mounted_unless_allowed() {
    let r = replica(ServerConfig { lora_adapters: vec!["a".into()], ..config() }).await;
    let (status, _, _) =
        post(&r, "/v1/load_lora_adapter", json!({"lora_name": "b", "lora_path": "/b"})).await;
    assert_eq!(status, 404);
    let (status, _, _) = post(&r, "/v1/unload_lora_adapter", json!({"lora_name": "a"})).await;
    assert_eq!(status, 404);
    assert_eq!(complete(&r, "a", 1).await.0, 200, "the static adapter still serves");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_names_and_lora_modules_in_models_and_responses() {
    let json_module = r#"{"name": "j", "path": "/p/j", "base_model_name": "alias-b"}"#;
    let r = replica(ServerConfig {
        model: "org/base".into(),
        served_model_names: vec!["alias-a".into(), "alias-b".into()],
        lora_adapters: vec!["plain".into()],
        lora_modules: vec![
            LoraModule::parse("sql=/p/sql").unwrap(),
            LoraModule::parse(json_module).unwrap(),
        ],
        engine: EngineConfig { max_loras: 4, ..config().engine },
        ..config()
    })
    .await;
    let cards = models(&r).await;
    let row = |c: &Value| {
        (
            c["id"].as_str().unwrap().to_owned(),
            c["root"].as_str().unwrap().to_owned(),
            c["parent"].clone(),
        )
    };
    let rows: Vec<_> = cards.iter().map(row).collect();
    assert_eq!(
        rows,
        [
            ("alias-a".into(), "org/base".into(), Value::Null),
            ("alias-b".into(), "org/base".into(), Value::Null),
            ("plain".into(), "plain".into(), json!("alias-a")),
            ("sql".into(), "/p/sql".into(), json!("alias-a")),
            ("j".into(), "/p/j".into(), json!("alias-b")),
        ]
    );
    assert!(cards[0]["max_model_len"].as_u64().unwrap() > 0);

    // Any served name is accepted; responses name the first.
    let (status, v) = complete(&r, "alias-b", 1).await;
    assert_eq!((status, v["model"].as_str()), (200, Some("alias-a")));
    assert_eq!(complete(&r, "org/base", 1).await.0, 404, "the path is not a served name");
    assert_eq!(complete(&r, "j", 1).await.1["model"], "j");
    let text = metrics(&r).await;
    assert!(text.contains("model_name=\"alias-a\""));
    assert!(!text.contains("model_name=\"org/base\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lora_metrics_text() {
    // Without adapters: no LoRA metric at all.
    let plain = replica(config()).await;
    complete(&plain, MODEL, 2).await;
    assert!(!metrics(&plain).await.contains("lora"));

    let r = replica(ServerConfig { lora_adapters: vec!["a".into(), "b".into()], ..config() }).await;
    // Startup loads a then b into the single slot: b evicts a.
    let text = metrics(&r).await;
    assert_eq!(scrape(&text, "kvgate_sim_lora_loads_total"), Some(2.0));
    assert_eq!(scrape(&text, "kvgate_sim_lora_evictions_total"), Some(1.0));
    assert!(text.contains(
        "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n"
    ));
    let idle = "max_lora=\"1\",waiting_lora_adapters=\"\",running_lora_adapters=\"\"";
    let t0 = scrape_labeled(&text, "vllm:lora_requests_info", idle).unwrap();
    assert!(t0 > 1.0e9, "the value is a Unix time: {t0}");
    let line = text.lines().find(|l| l.starts_with("vllm:lora_requests_info{")).unwrap();
    assert!(line.split(' ').nth(1).unwrap().contains("e+09"), "Go-style float: {line}");

    // a loads again (evicting b), b is then loaded back, and a second
    // request for b finds it resident.
    for (adapter, loads, evictions) in [("a", 3.0, 2.0), ("b", 4.0, 3.0), ("b", 4.0, 3.0)] {
        assert_eq!(complete(&r, adapter, 4).await.0, 200);
        let text = metrics(&r).await;
        assert_eq!(scrape(&text, "kvgate_sim_lora_loads_total"), Some(loads), "{adapter}");
        assert_eq!(scrape(&text, "kvgate_sim_lora_evictions_total"), Some(evictions));
    }
    // Both adapters at once with one slot: both served, one after the other.
    let (ra, rb) = tokio::join!(complete(&r, "a", 4), complete(&r, "b", 4));
    assert_eq!((ra.0, rb.0), (200, 200));
    let text = metrics(&r).await;
    let a_live = "waiting_lora_adapters=\"a\",running_lora_adapters=\"a\"";
    let b_live = "waiting_lora_adapters=\"b\",running_lora_adapters=\"b\"";
    assert!(
        scrape_labeled(&text, "vllm:lora_requests_info", a_live).is_some()
            || scrape_labeled(&text, "vllm:lora_requests_info", b_live).is_some(),
        "{text}"
    );
    // Idle again: the empty series is the latest.
    let latest = text
        .lines()
        .filter(|l| l.starts_with("vllm:lora_requests_info{"))
        .max_by(|x, y| {
            let v = |l: &str| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap();
            v(x).total_cmp(&v(y))
        })
        .unwrap();
    assert!(latest.contains(idle), "{latest}");
}
