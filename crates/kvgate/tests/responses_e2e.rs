//! OpenAI's Responses API end to end, with conversation affinity: two
//! in-process `kvgate serve` instances that share an affinity key, behind a
//! client that alternates between them (a plain round-robin balancer), in
//! front of two in-process simulated replicas whose response stores, like
//! vLLM's, live in their own memory. A 20-turn `previous_response_id`
//! chain succeeds on every turn and every turn runs on the replica that
//! holds the conversation (the engines' own request counts say so); GET and
//! cancel by id reach that replica through the other instance; forged ids
//! are refused and never sent anywhere; streams keep vLLM's event shapes
//! with the ids rewritten; a drained owner means the state is gone for a
//! new turn, while its responses can still be read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use kvgate_gateway::Gateway;
use kvgate_sim::server::Replica;
use kvgate_tokenize::service::{Tokenize, TokenizeService};
use kvgate_tokenize::ChatTokenizer;
use serde_json::{json, Value};
use support::{exchange, gw_config, inproc_sim, local_client, metric, replica_cfg, start_gateway};

mod support;

const MODEL: &str = "Qwen/Qwen3-0.6B";

fn client() -> reqwest::Client {
    local_client()
}

/// A gateway over `sims` (named sim-0, sim-1, ...) with `key`; its base
/// URL and admin URL.
async fn gateway(sims: &[Replica], key: &str) -> (Gateway, String, String) {
    let replicas =
        sims.iter().enumerate().map(|(i, s)| replica_cfg(&format!("sim-{i}"), s)).collect();
    let mut c = gw_config(replicas);
    c.auth.affinity_key = Some(key.to_owned());
    let (gw, base) = start_gateway(c).await;
    let admin = format!("http://{}", gw.admin_addr().unwrap());
    (gw, base, admin)
}

async fn send(req: reqwest::RequestBuilder) -> (u16, String, String) {
    exchange(req).await
}

async fn post(url: &str, body: &Value) -> (u16, String, String) {
    send(client().post(url).json(body)).await
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Requests the engine of `sim` finished.
async fn finished(sim: &Replica) -> f64 {
    metric(&sim.url(), "vllm:request_prompt_tokens_count").await
}

/// The `event:` names of an SSE body, and each event's data as JSON.
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("");
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or("null");
            (name.to_owned(), json_of(data))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_stays_on_its_replica_through_any_instance() {
    let tok = Arc::new(
        TokenizeService::new(Tokenize::new(ChatTokenizer::bundled().unwrap(), None), 1).unwrap(),
    );
    let sims = [inproc_sim(&tok).await, inproc_sim(&tok).await];
    let (_a, base_a, admin_a) = gateway(&sims, "fleet-affinity-key").await;
    let (_b, base_b, _) = gateway(&sims, "fleet-affinity-key").await;
    let bases = [base_a.clone(), base_b.clone()];
    let instructions = "You are a careful coding agent in a large repository. ".repeat(20);

    // 20 turns, each through the other instance.
    let mut previous: Option<String> = None;
    let mut owner = String::new();
    let mut ids = Vec::new();
    for turn in 0..20 {
        let mut body = json!({
            "model": MODEL, "instructions": instructions, "max_output_tokens": 4,
            "input": format!("Step {turn}: what next?"),
        });
        if let Some(p) = &previous {
            body["previous_response_id"] = json!(p);
        }
        let base = &bases[turn % 2];
        let (status, replica, text) = post(&format!("{base}/v1/responses"), &body).await;
        assert_eq!(status, 200, "turn {turn}: {text}");
        let v = json_of(&text);
        assert_eq!(v["object"], "response", "{text}");
        // The sim stops at max_output_tokens: incomplete, as vLLM says.
        assert_eq!(v["status"], "incomplete", "{text}");
        assert_eq!(v["previous_response_id"], previous.clone().map_or(Value::Null, Value::from));
        let id = v["id"].as_str().unwrap().to_owned();
        assert!(id.starts_with("resp_") && !ids.contains(&id), "turn {turn}: {id}");
        if turn == 0 {
            owner = replica.clone();
        }
        assert_eq!(replica, owner, "turn {turn} went to another replica");
        ids.push(id.clone());
        previous = Some(id);
    }
    // The engines agree: every turn ran on the owner, none elsewhere (the
    // chain would have broken there: the other store does not know it).
    let owner_i: usize = owner.strip_prefix("sim-").unwrap().parse().unwrap();
    assert_eq!(finished(&sims[owner_i]).await, 20.0);
    assert_eq!(finished(&sims[1 - owner_i]).await, 0.0);
    // The engine never sees kvgate's ids, nor the client the engine's.
    let last = ids.last().unwrap().clone();
    let direct = client().get(format!("{}/v1/responses/{last}", sims[owner_i].url())).send();
    assert_eq!(direct.await.unwrap().status(), 404);

    // GET and cancel by id through the instance that did not answer it.
    let (status, replica, text) = send(client().get(format!("{base_a}/v1/responses/{last}"))).await;
    assert_eq!((status, replica.as_str()), (200, owner.as_str()), "{text}");
    let v = json_of(&text);
    assert_eq!(v["id"], last.as_str());
    assert_eq!(v["previous_response_id"], ids[18].as_str());
    let (status, replica, text) =
        send(client().post(format!("{base_b}/v1/responses/{}/cancel", ids[3]))).await;
    // The owner knows it (another replica would say 404): a finished
    // response cannot be cancelled, in vLLM's words.
    assert_eq!((status, replica.as_str()), (400, owner.as_str()), "{text}");
    assert!(text.contains("Cannot cancel a synchronous response"), "{text}");

    // Forged and foreign ids: a clear 4xx, no engine asked.
    let before = finished(&sims[0]).await + finished(&sims[1]).await;
    let mut forged = last.clone().into_bytes();
    let mid = forged.len() / 2;
    forged[mid] = if forged[mid] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    for bad in [forged.as_str(), "resp_0123456789abcdef0123456789abcdef"] {
        let body = json!({"model": MODEL, "input": "hi", "previous_response_id": bad});
        let (status, _, text) = post(&format!("{base_b}/v1/responses"), &body).await;
        assert_eq!(status, 400, "{text}");
        assert_eq!(json_of(&text)["error"]["param"], "previous_response_id", "{text}");
        let (status, _, text) = send(client().get(format!("{base_a}/v1/responses/{bad}"))).await;
        assert_eq!(status, 404, "{text}");
    }
    assert_eq!(finished(&sims[0]).await + finished(&sims[1]).await, before);
    // An instance with another key cannot read the fleet's ids.
    let (_c, base_c, _) = gateway(&sims, "another-key").await;
    let (status, _, text) = send(client().get(format!("{base_c}/v1/responses/{last}"))).await;
    assert_eq!(status, 404, "{text}");

    // Streamed, continuing the chain through B: vLLM's events, the ids
    // rewritten in every event that carries one.
    let body = json!({"model": MODEL, "input": "Stream it.", "max_output_tokens": 3,
        "stream": true, "previous_response_id": last});
    let (status, replica, text) = post(&format!("{base_b}/v1/responses"), &body).await;
    assert_eq!((status, replica.as_str()), (200, owner.as_str()), "{text}");
    let evs = events(&text);
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"response.created"), "{text}");
    assert_eq!(names.last(), Some(&"response.incomplete"), "{text}");
    assert_eq!(names.iter().filter(|n| **n == "response.output_text.delta").count(), 3, "{text}");
    let streamed = evs[0].1["response"]["id"].as_str().unwrap().to_owned();
    for (name, data) in &evs {
        if let Some(id) = data["response"]["id"].as_str() {
            assert_eq!(id, streamed, "{name}");
            assert_eq!(data["response"]["previous_response_id"], last.as_str(), "{name}");
        }
    }
    assert!(!ids.contains(&streamed));
    // ... and the streamed id continues the conversation through A.
    let body = json!({"model": MODEL, "input": "Go on.", "max_output_tokens": 2,
        "previous_response_id": streamed});
    let (status, replica, text) = post(&format!("{base_a}/v1/responses"), &body).await;
    assert_eq!((status, replica.as_str()), (200, owner.as_str()), "{text}");

    // A new conversation with unsupported content is refused, not routed.
    let body = json!({"model": MODEL, "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]});
    let (status, _, text) = post(&format!("{base_a}/v1/responses"), &body).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("unsupported"), "{text}");

    let metrics =
        client().get(format!("{base_a}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"route="responses""#), "{metrics}");

    // The owner drained on A: its conversations' state is gone there.
    let drain = client().post(format!("{admin_a}/admin/replicas/{owner}/drain")).send().await;
    assert_eq!(drain.unwrap().status(), 200);
    let body = json!({"model": MODEL, "input": "Still there?", "previous_response_id": last});
    let (status, _, text) = post(&format!("{base_a}/v1/responses"), &body).await;
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("state is gone"), "{text}");
    // Reads still reach a draining owner: it holds the response and
    // takes no new work from them.
    let (status, replica, text) = send(client().get(format!("{base_a}/v1/responses/{last}"))).await;
    assert_eq!((status, replica.as_str()), (200, owner.as_str()), "{text}");
}
