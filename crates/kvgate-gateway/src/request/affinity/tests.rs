use super::*;

fn key(k: &str) -> AffinityKey {
    AffinityKey::new(Some(k))
}

#[test]
fn hmac_matches_rfc_4231_case_two() {
    // Key "Jefe" is shorter than SHA-256's output, so it is used as is:
    // build the key the way the RFC does, not through the config hashing.
    let mut k = [0u8; 32];
    k[..4].copy_from_slice(b"Jefe");
    let key = AffinityKey { key: k, shared: true };
    let mac = key.mac(b"what do ya want for nothing?");
    let want = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
    let got: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(got, want);
}

#[test]
fn an_issued_id_resolves_on_any_instance_with_the_key() {
    let a = key("shared");
    let id = a.issue("replica-1", "resp_0123456789abcdef").unwrap();
    assert!(id.starts_with(PREFIX));
    let owned = key("shared").resolve(&id).unwrap();
    assert_eq!(
        owned,
        Owned { owner: "replica-1".into(), engine_id: "resp_0123456789abcdef".into() }
    );
    // Another key, an altered id, or an engine's own id do not resolve.
    assert_eq!(key("other").resolve(&id), Err(IdError::Forged));
    let mut payload = URL_SAFE_NO_PAD.decode(&id[PREFIX.len()..]).unwrap();
    payload[3] ^= 1;
    let altered = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(&payload));
    assert_eq!(a.resolve(&altered), Err(IdError::Forged));
    assert_eq!(a.resolve("resp_0123456789abcdef"), Err(IdError::Foreign));
    assert_eq!(a.resolve("chatcmpl-1"), Err(IdError::Foreign));
    assert_eq!(a.resolve("resp_"), Err(IdError::Foreign));
    // A per-process key verifies only its own ids.
    let lone = AffinityKey::new(None);
    assert!(!lone.shared);
    let id = lone.issue("r", "resp_x").unwrap();
    assert!(lone.resolve(&id).is_ok());
    assert_eq!(AffinityKey::new(None).resolve(&id), Err(IdError::Forged));
}

#[test]
fn ids_in_a_stream_are_rewritten_across_chunk_cuts() {
    let k = key("k");
    let prev_client = k.issue("r1", "resp_prev").unwrap();
    let mut w = Rewriter::new(k.clone(), "r1", Some(("resp_prev".into(), prev_client.clone())));
    let stream = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_new\",\"previous_response_id\":\"resp_prev\"}}\n\nevent: response.completed\ndata: {\"response\":{\"id\":\"resp_new\"}}\n\n";
    let mut out = Vec::new();
    for piece in stream.as_bytes().chunks(7) {
        out.extend_from_slice(&w.chunk(piece));
    }
    out.extend_from_slice(&w.flush());
    let text = String::from_utf8(out).unwrap();
    let new_client = k.issue("r1", "resp_new").unwrap();
    assert!(!text.contains("\"resp_new\""), "{text}");
    assert!(!text.contains("\"resp_prev\""), "{text}");
    assert_eq!(text.matches(&new_client).count(), 2, "{text}");
    assert!(text.contains(&prev_client));
    assert_eq!(text.len(), stream.len() + 2 * (new_client.len() - 8) + (prev_client.len() - 9));
}

#[test]
fn a_whole_body_and_an_engine_error_are_rewritten() {
    let k = key("k");
    let mut w = Rewriter::new(k.clone(), "r2", None);
    let out = w.body(br#"{"id":"resp_abc","object":"response"}"#);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(k.resolve(v["id"].as_str().unwrap()).unwrap().engine_id, "resp_abc");
    let client = k.issue("r2", "resp_gone").unwrap();
    let mut w = Rewriter::new(k, "r2", Some(("resp_gone".into(), client.clone())));
    let out = w.body(br#"{"error":{"message":"Response with id 'resp_gone' not found."}}"#);
    assert!(String::from_utf8(out.to_vec()).unwrap().contains(&client));
}

#[test]
fn any_client_text_resolves_to_an_error_or_a_verified_owner_never_a_panic() {
    let k = key("k");
    let good = k.issue("r", "resp_1").unwrap();
    let payload = URL_SAFE_NO_PAD.decode(&good[PREFIX.len()..]).unwrap();
    // Every truncation and every one-byte change of a valid payload.
    for n in 0..payload.len() {
        let cut = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(&payload[..n]));
        assert!(k.resolve(&cut).is_err(), "cut at {n}");
        for bit in 0..8 {
            let mut p = payload.clone();
            p[n] ^= 1 << bit;
            let changed = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(&p));
            assert!(k.resolve(&changed).is_err(), "byte {n} bit {bit}");
        }
    }
    // Text that is not base64, overlong names, and odd bytes.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for len in 0..300 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let text: String = (0..len)
            .map(|i| char::from(b"resp_AZaz09-+/=%\0\xff"[(x as usize + i) % 18]))
            .collect();
        let _ = k.resolve(&text);
        let _ = k.resolve(&format!("{PREFIX}{text}"));
    }
    assert!(k.issue(&"n".repeat(256), "resp_1").is_none(), "a name too long to carry");
}
