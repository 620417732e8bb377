//! OpenAI's Responses API on the simulated engine, over real HTTP, as vLLM
//! 0.33 serves it with its response store on: the whole response, the
//! streamed event sequence, a conversation continued by
//! `previous_response_id` (whose prompt holds the stored history), GET and
//! cancel by id, and vLLM's not-found error for an id this replica does
//! not hold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kvgate_sim::server::Replica;
use serde_json::{json, Value};

mod support;
use support::MODEL;

async fn replica() -> Replica {
    support::api_replica().await
}

async fn call(req: reqwest::RequestBuilder) -> (u16, Value, String) {
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null), text)
}

async fn create(r: &Replica, body: &Value) -> (u16, Value, String) {
    call(reqwest::Client::new().post(format!("{}/v1/responses", r.url())).json(body)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_conversation_continues_and_unknown_ids_are_not_found() {
    let r = replica().await;
    let first = json!({"model": MODEL, "instructions": "Be terse.", "input": "Name three primes.",
        "max_output_tokens": 4});
    let (status, v, text) = create(&r, &first).await;
    assert_eq!(status, 200, "{text}");
    // The sim's tokens never stop by themselves: every answer ends at
    // max_output_tokens, which vLLM reports as incomplete.
    assert_eq!(
        (v["object"].as_str(), v["status"].as_str()),
        (Some("response"), Some("incomplete"))
    );
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    let id = v["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("resp_"));
    let answer = v["output"][0]["content"][0]["text"].as_str().unwrap();
    assert!(!answer.is_empty());
    let prompt0 = v["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(v["usage"]["output_tokens"], 4);

    // The continuation's prompt holds the first turn and its answer.
    let next = json!({"model": MODEL, "input": "And the next?", "max_output_tokens": 2,
        "previous_response_id": id});
    let (status, v, text) = create(&r, &next).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(v["previous_response_id"], id.as_str());
    let prompt1 = v["usage"]["input_tokens"].as_u64().unwrap();
    assert!(prompt1 > prompt0 + 4, "{prompt1} vs {prompt0}");
    let second = v["id"].as_str().unwrap().to_owned();

    let client = reqwest::Client::new();
    let (status, v, text) = call(client.get(format!("{}/v1/responses/{second}", r.url()))).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(v["id"], second.as_str());
    let (status, v, _) =
        call(client.post(format!("{}/v1/responses/{second}/cancel", r.url()))).await;
    assert_eq!(status, 400);
    assert_eq!(v["error"]["message"], "Cannot cancel a synchronous response.");

    // vLLM's not-found, for a continuation, a GET and a cancel.
    let unknown = json!({"model": MODEL, "input": "x", "previous_response_id": "resp_nope"});
    for (status, v, _) in [
        create(&r, &unknown).await,
        call(client.get(format!("{}/v1/responses/resp_nope", r.url()))).await,
        call(client.post(format!("{}/v1/responses/resp_nope/cancel", r.url()))).await,
    ] {
        assert_eq!(status, 404);
        assert_eq!(v["error"]["message"], "Response with id 'resp_nope' not found.");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "response_id");
    }
    // `store: false` keeps nothing.
    let (_, v, _) = create(&r, &json!({"model": MODEL, "input": "x", "store": false})).await;
    let (status, _, _) =
        call(client.get(format!("{}/v1/responses/{}", r.url(), v["id"].as_str().unwrap()))).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_vllms_event_sequence() {
    let r = replica().await;
    let body = json!({"model": MODEL, "input": "Count.", "max_output_tokens": 3, "stream": true});
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/responses", r.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let text = resp.text().await.unwrap();
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: ")).unwrap().to_owned();
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            (name, serde_json::from_str(data).unwrap())
        })
        .collect();
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete",
        ]
    );
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], i as u64);
    }
    let deltas: String = events.iter().filter_map(|(_, d)| d["delta"].as_str()).collect();
    let done = &events.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["content"][0]["text"], deltas.as_str());
    assert_eq!(done["id"], events[0].1["response"]["id"]);
    // Stored: the streamed response can be continued.
    let next = json!({"model": MODEL, "input": "More.", "max_output_tokens": 1,
        "previous_response_id": done["id"]});
    let (status, _, text) = create(&r, &next).await;
    assert_eq!(status, 200, "{text}");
}
