//! `/dashboard` (issue 10) against the real binary and its embedded
//! simulated replicas: the admin key guards the page and its stream (as a
//! header or through the login cookie, never in the URL), the cookie opens
//! only the dashboard, the stream's frames carry live values, and one
//! sampler serves every viewer and stops when nobody watches.
//! `scripts/browser-test.sh` drives the page itself in Chromium.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{client, spawn_serve, wait_ready, Serve};

const KEY: &str = "dashboard-admin-key-1";

fn serve() -> Serve {
    spawn_serve(
        &[],
        &[
            "--admin-key",
            KEY,
            "--sim-replicas",
            "2",
            "--set",
            "dashboard.interval_ms=200",
            "--set",
            "embedded_sims.speedup=10",
        ],
    )
}

/// A GET with extra headers: status, `Set-Cookie` and body.
async fn get(url: &str, headers: &[(&str, &str)]) -> (StatusCode, Option<String>, String) {
    let mut rb = client().get(url);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    let r = rb.send().await.unwrap();
    let status = r.status();
    let cookie = r.headers().get("set-cookie").map(|v| v.to_str().unwrap().to_owned());
    // A stream that was let in never ends: read its status only.
    let body = if url.ends_with("/stream") && status.is_success() {
        String::new()
    } else {
        r.text().await.unwrap()
    };
    (status, cookie, body)
}

async fn login(admin: &str, key: &str) -> (StatusCode, Option<String>) {
    let r = client()
        .post(format!("{admin}/dashboard/login"))
        .header("x-kvgate-admin-key", key)
        .send()
        .await
        .unwrap();
    (r.status(), r.headers().get("set-cookie").map(|v| v.to_str().unwrap().to_owned()))
}

/// The frames of one `/dashboard/stream` connection.
struct Frames {
    resp: reqwest::Response,
    buf: String,
}

impl Frames {
    async fn open(admin: &str, header: (&str, &str)) -> Frames {
        let resp = client()
            .get(format!("{admin}/dashboard/stream"))
            .header(header.0, header.1)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        Frames { resp, buf: String::new() }
    }

    /// The next `frame` event's JSON.
    async fn next(&mut self) -> Value {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let event: String = self.buf.drain(..end + 2).collect();
                if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                    assert!(event.starts_with("event: frame\n"), "{event}");
                    return serde_json::from_str(data).unwrap();
                }
                continue; // a keep-alive comment
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.resp.chunk())
                .await
                .expect("no frame within 10 s")
                .unwrap()
                .expect("the stream ended");
            self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_key_guards_the_page_and_its_stream() {
    let kv = serve();
    wait_ready(&kv.base).await;
    let page = format!("{}/dashboard", kv.admin);
    let stream = format!("{}/dashboard/stream", kv.admin);

    // Without credentials: the login form, with no dashboard in it.
    let (s, _, body) = get(&page, &[]).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(body.contains("id=\"login-form\"") && !body.contains("decision-stream"), "{body}");
    assert_eq!(get(&stream, &[]).await.0, StatusCode::UNAUTHORIZED);

    let forged = format!("kvgate_dashboard=1700000000.{}", "ab".repeat(32));
    let key_as_cookie = format!("kvgate_dashboard={KEY}");
    for (what, header) in [
        ("wrong key", ("x-kvgate-admin-key", "not-the-admin-key")),
        ("wrong bearer", ("authorization", "Bearer not-the-admin-key")),
        ("forged cookie", ("cookie", forged.as_str())),
        ("key as cookie", ("cookie", key_as_cookie.as_str())),
    ] {
        for url in [&page, &stream] {
            assert_eq!(get(url, &[header]).await.0, StatusCode::UNAUTHORIZED, "{what} {url}");
        }
    }
    // Never a key in the URL.
    assert_eq!(get(&format!("{page}?key={KEY}"), &[]).await.0, StatusCode::UNAUTHORIZED);

    // The key as a header opens both.
    let (s, _, body) = get(&page, &[("x-kvgate-admin-key", KEY)]).await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.contains("id=\"decision-stream\""));
    assert_eq!(
        get(&stream, &[("authorization", &format!("Bearer {KEY}"))]).await.0,
        StatusCode::OK
    );

    // Login: a wrong key gets no cookie; the right one an HttpOnly,
    // SameSite=Strict cookie that is not the key.
    let (s, cookie) = login(&kv.admin, "wrong-key-123").await;
    assert_eq!((s, cookie), (StatusCode::UNAUTHORIZED, None));
    let (s, cookie) = login(&kv.admin, KEY).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let cookie = cookie.expect("a login cookie");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/dashboard", "Max-Age=43200"] {
        assert!(cookie.contains(attr), "{attr} missing from {cookie}");
    }
    assert!(!cookie.contains(KEY));
    let pair = cookie.split(';').next().unwrap().to_owned();
    assert_eq!(get(&page, &[("cookie", &pair)]).await.0, StatusCode::OK);
    assert_eq!(get(&stream, &[("cookie", &pair)]).await.0, StatusCode::OK);
    // A tampered cookie is refused.
    let tampered = format!("{}0", &pair[..pair.len() - 1]);
    let tampered =
        if tampered == pair { format!("{}1", &pair[..pair.len() - 1]) } else { tampered };
    assert_eq!(get(&page, &[("cookie", &tampered)]).await.0, StatusCode::UNAUTHORIZED);
    // The cookie opens the dashboard only, never the admin API.
    assert_eq!(
        get(&format!("{}/admin/replicas", kv.admin), &[("cookie", &pair)]).await.0,
        StatusCode::UNAUTHORIZED
    );
    // The dashboard is not on the client API's listener (admin has its own).
    assert_eq!(get(&format!("{}/dashboard", kv.base), &[("x-kvgate-admin-key", KEY)]).await.0, 404);

    // The page and the stream are hardened against framing and caching.
    let r = client().get(&page).header("x-kvgate-admin-key", KEY).send().await.unwrap();
    let h = r.headers();
    assert_eq!(h["cache-control"], "no-store");
    assert_eq!(h["x-frame-options"], "DENY");
    assert!(h["content-security-policy"].to_str().unwrap().contains("script-src 'self'"));

    // Logout clears the cookie.
    let r = client().post(format!("{}/dashboard/logout", kv.admin)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(r.headers()["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
    // Assets are public (no data in them) and exist.
    for a in ["app.js", "chart.js", "login.js", "style.css"] {
        let (s, _, body) = get(&format!("{}/dashboard/assets/{a}", kv.admin), &[]).await;
        assert_eq!(s, StatusCode::OK, "{a}");
        assert!(body.len() > 100, "{a}");
    }
    assert_eq!(get(&format!("{}/dashboard/assets/../x", kv.admin), &[]).await.0, 404);
}

async fn chat(base: &str, user: &str) {
    let system = "You are a careful assistant. ".repeat(60);
    let body = json!({
        "model": "Qwen/Qwen3-0.6B",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 4,
        // Streamed: the gateway times first tokens on streams.
        "stream": true,
    });
    let r = client().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("data: [DONE]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_carry_live_values() {
    let kv = serve();
    wait_ready(&kv.base).await;
    let mut frames = Frames::open(&kv.admin, ("x-kvgate-admin-key", KEY)).await;
    let first = frames.next().await;
    assert_eq!(first["replicas"].as_array().unwrap().len(), 2);
    assert_eq!(first["interval_ms"], 200);

    for i in 0..12 {
        chat(&kv.base, &format!("question number {i}")).await;
    }
    // Frames come every 200 ms; wait for one that has seen the traffic
    // through every path: decisions, events into the index, scrapes, TTFTs.
    let mut last_seq = first["seq"].as_u64().unwrap();
    let live = |f: &Value| {
        let fleet = &f["fleet"];
        let reps = f["replicas"].as_array().unwrap();
        fleet["decisions"][0].as_u64() == Some(12)
            && fleet["ttft_samples"].as_u64() == Some(12)
            && fleet["requests_per_s"].as_f64().is_some_and(|r| r > 0.0)
            && fleet["predicted_hit_rate"].as_f64().is_some_and(|h| h > 0.0)
            && f["decisions"].as_array().unwrap().len() == 12
            && reps.iter().any(|r| r["events_per_s"].as_f64().is_some_and(|e| e > 0.0))
            && reps.iter().all(|r| r["capacity_blocks"][0].as_u64().is_some_and(|c| c > 0))
            && reps.iter().any(|r| r["index_blocks"][0].as_u64().is_some_and(|b| b > 0))
    };
    let mut frame = first.clone();
    for _ in 0..50 {
        frame = frames.next().await;
        let seq = frame["seq"].as_u64().unwrap();
        assert!(seq > last_seq, "frames in order: {seq} after {last_seq}");
        last_seq = seq;
        if live(&frame) {
            break;
        }
    }
    assert!(live(&frame), "no frame showed the traffic: {frame:#}");
    let fleet = &frame["fleet"];
    let (p50, p90) = (fleet["ttft_p50_s"].as_f64().unwrap(), fleet["ttft_p90_s"].as_f64().unwrap());
    assert!(0.0 < p50 && p50 <= p90 && p90 < 30.0, "p50 {p50} p90 {p90}");
    // Twelve requests sharing a long system prompt: after the first, the
    // prefix is cached, so kvgate predicts hits.
    assert!(fleet["predicted_hit_rate"].as_f64().unwrap() > 0.3, "{fleet}");
    let d = &frame["decisions"][0];
    assert!(d["reason"]["kind"].as_str().is_some_and(|k| !k.is_empty()), "{d}");
    assert_eq!(d["candidates"].as_array().unwrap().len(), 2);
    assert!(d["candidates"][0]["predicted_ttft_s"].as_f64().is_some());
    let routed: u64 =
        frame["replicas"].as_array().unwrap().iter().map(|r| r["routed"].as_u64().unwrap()).sum();
    assert_eq!(routed, 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sampler_for_all_viewers_and_none_without_viewers() {
    let kv = serve();
    wait_ready(&kv.base).await;
    let header = ("x-kvgate-admin-key", KEY);
    let mut a = Frames::open(&kv.admin, header).await;
    let mut b = Frames::open(&kv.admin, header).await;
    let mut last_a = Value::Null;
    for _ in 0..4 {
        last_a = a.next().await;
    }
    // Both viewers get the very same frames (same number, same instant):
    // one sampler, not one per viewer.
    let seq_a = last_a["seq"].as_u64().unwrap();
    let mut last_b = b.next().await;
    while last_b["seq"].as_u64().unwrap() < seq_a {
        last_b = b.next().await;
    }
    assert_eq!(last_b["seq"], last_a["seq"], "b skipped a frame");
    assert_eq!(last_b["uptime_s"], last_a["uptime_s"], "two samplers");
    assert!(seq_a >= 4);
    drop((a, b));
    // With nobody watching the sampler stops at its next tick; a new viewer
    // starts a new one, whose frames count from 1 again.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut c = Frames::open(&kv.admin, header).await;
    assert_eq!(c.next().await["seq"], 1);
}
