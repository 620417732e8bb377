//! Prefill/decode disaggregation as vLLM 0.33's NIXL connector plays it
//! over HTTP (docs/pd-protocol.md), for replicas started with
//! `--kv-transfer-config`:
//!
//! - a request whose `kv_transfer_params` has `do_remote_decode: true` is a
//!   **prefill hop**: it runs as usual (the router sends `max_tokens: 1`),
//!   its blocks stay held when it finishes, and its response carries the
//!   parameters the decode side needs (top level, or on a stream's finish
//!   chunk). The blocks are freed when the lease ends
//!   (`kv_lease_duration`, 30 s of model time by default): the simulator
//!   does not model the decode side's read notification;
//! - a request with `do_remote_prefill: true` and the prefill's remote
//!   fields is a **decode hop**: it waits for the transfer of the prompt
//!   tokens this replica lacks (× KV bytes per token ÷ bandwidth, as
//!   Dynamo's mocker times it), then computes only the last prompt token.
//!
//! Without `--kv-transfer-config`, `kv_transfer_params` is ignored, as vLLM
//! ignores it without a connector. Every decode hop's parameters are kept
//! (the last 64) for `/debug/kv_transfers`, so tests can check what a
//! router forwarded.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde_json::{json, Map, Value};

/// Decode hops' parameters kept for `/debug/kv_transfers`.
const KEPT: usize = 64;

/// A replica's KV connector (`--kv-transfer-config`).
#[derive(Clone, Debug, PartialEq)]
pub struct KvTransferConfig {
    /// `kv_transfer_config.engine_id` (vLLM: a uuid4 by default).
    pub engine_id: String,
    /// The model's KV bytes per token (all layers).
    pub kv_bytes_per_token: u64,
    /// The link to other replicas, bytes per second.
    pub bandwidth_bytes_per_s: f64,
    /// How long a finished prefill hop holds its blocks for the decode
    /// side (model time): `kv_connector_extra_config.kv_lease_duration`.
    pub lease: Duration,
}

impl KvTransferConfig {
    /// Reads vLLM's `--kv-transfer-config` JSON: `kv_connector` must be
    /// `NixlConnector` (the one vLLM documents for P/D over HTTP);
    /// `kv_role` is accepted and ignored, as NixlConnector ignores it;
    /// `engine_id` and `kv_connector_extra_config.kv_lease_duration` are
    /// used when given. The transfer's speed is the simulator's own.
    pub fn from_vllm_json(
        text: &str,
        default_engine_id: &str,
        kv_bytes_per_token: u64,
        bandwidth_bytes_per_s: f64,
    ) -> Result<KvTransferConfig, String> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| format!("--kv-transfer-config is not JSON: {e}"))?;
        let Some(o) = v.as_object() else {
            return Err("--kv-transfer-config must be a JSON object".into());
        };
        match o.get("kv_connector").and_then(Value::as_str) {
            Some("NixlConnector") => {}
            Some(other) => {
                return Err(format!(
                "--kv-transfer-config: kv_connector {other:?} is not simulated; use NixlConnector"
            ))
            }
            None => return Err("--kv-transfer-config needs \"kv_connector\"".into()),
        }
        if let Some(role) = o.get("kv_role") {
            let ok = matches!(role.as_str(), Some("kv_producer" | "kv_consumer" | "kv_both"));
            if !ok {
                return Err(format!(
                    "--kv-transfer-config: kv_role {role} is not kv_producer, kv_consumer or kv_both"
                ));
            }
        }
        let lease = match v.pointer("/kv_connector_extra_config/kv_lease_duration") {
            None => 30.0,
            Some(v) => match v.as_f64() {
                Some(s) if s.is_finite() && s > 0.0 => s,
                _ => return Err(format!("kv_lease_duration {v} must be a number > 0")),
            },
        };
        if !(bandwidth_bytes_per_s.is_finite() && bandwidth_bytes_per_s > 0.0) {
            return Err("the KV transfer bandwidth must be > 0".into());
        }
        Ok(KvTransferConfig {
            engine_id: o
                .get("engine_id")
                .and_then(Value::as_str)
                .unwrap_or(default_engine_id)
                .to_owned(),
            kv_bytes_per_token,
            bandwidth_bytes_per_s,
            lease: Duration::from_secs_f64(lease.min(1e6)),
        })
    }

    /// Model time to receive `tokens` tokens' KV.
    pub fn transfer_time(&self, tokens: u64) -> Duration {
        let s = tokens as f64 * self.kv_bytes_per_token as f64 / self.bandwidth_bytes_per_s;
        Duration::from_secs_f64(s.clamp(0.0, 1e6))
    }
}

/// What a request's `kv_transfer_params` make of it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum KvRole {
    /// A plain request (no parameters, or no connector).
    Plain,
    /// `do_remote_decode`: prefill, hold the blocks, answer parameters.
    Prefill,
    /// `do_remote_prefill`: receive the prompt's KV, then decode. The
    /// parameters as received.
    Decode(Map<String, Value>),
}

/// The fields a decode hop needs from its prefill (vLLM's decode side
/// starts its lease heartbeats only when all are present).
const REMOTE_FIELDS: [&str; 5] =
    ["remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size"];

/// The role `params` (the body's `kv_transfer_params`) give a request.
pub(crate) fn role(params: Option<&Value>) -> Result<KvRole, String> {
    let Some(p) = params.filter(|p| !p.is_null()) else { return Ok(KvRole::Plain) };
    let Some(o) = p.as_object() else {
        return Err("kv_transfer_params must be an object".into());
    };
    let flag = |k: &str| o.get(k).and_then(Value::as_bool).unwrap_or(false);
    match (flag("do_remote_decode"), flag("do_remote_prefill")) {
        (true, true) => {
            Err("kv_transfer_params: do_remote_decode and do_remote_prefill are exclusive".into())
        }
        (true, false) => Ok(KvRole::Prefill),
        (false, true) => {
            if let Some(k) = REMOTE_FIELDS.iter().find(|k| o.get(**k).is_none_or(Value::is_null)) {
                return Err(format!(
                    "kv_transfer_params: do_remote_prefill needs {k} (the prefill response's \
                     kv_transfer_params, forwarded unchanged)"
                ));
            }
            Ok(KvRole::Decode(o.clone()))
        }
        (false, false) => Ok(KvRole::Plain),
    }
}

/// What a finished prefill hop answers in `kv_transfer_params`: the fields
/// vLLM 0.33's NIXL scheduler returns (`request_finished`).
pub(crate) fn prefill_answer(
    config: &KvTransferConfig,
    request_id: &str,
    addr: std::net::SocketAddr,
    prompt_tokens: usize,
    block_size: u32,
    cached_tokens: u32,
) -> Value {
    let blocks = prompt_tokens.div_ceil(block_size.max(1) as usize);
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_block_ids": [(0..blocks).collect::<Vec<_>>()],
        "remote_engine_id": config.engine_id,
        "remote_request_id": request_id,
        "remote_host": addr.ip().to_string(),
        "remote_port": addr.port(),
        "tp_size": 1,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": prompt_tokens,
        "remote_blocks_expiry_time": null,
        "transfer_mode": "pull",
        "remote_prefill_cached_tokens": cached_tokens,
    })
}

/// The last hops' parameters, newest last.
#[derive(Debug, Default)]
pub(crate) struct Received(Mutex<VecDeque<Value>>);

impl Received {
    pub(crate) fn push(&self, params: &Map<String, Value>) {
        let mut q = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if q.len() >= KEPT {
            q.pop_front();
        }
        q.push_back(Value::Object(params.clone()));
    }

    pub(crate) fn all(&self) -> Vec<Value> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllms_config_and_refuses_what_it_cannot_play() {
        let c = KvTransferConfig::from_vllm_json(
            r#"{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_connector_extra_config":{"kv_lease_duration":12}}"#,
            "e1",
            262_144,
            64e9,
        )
        .unwrap();
        assert_eq!((c.engine_id.as_str(), c.lease), ("e1", Duration::from_secs(12)));
        // 1,000 tokens × 256 KiB ÷ 64 GB/s.
        assert_eq!(c.transfer_time(1000), Duration::from_secs_f64(262_144_000.0 / 64e9));
        for bad in [
            "nope",
            "[]",
            r#"{"kv_role":"kv_both"}"#,
            r#"{"kv_connector":"LMCacheConnectorV1"}"#,
            r#"{"kv_connector":"NixlConnector","kv_role":"kv_nothing"}"#,
            r#"{"kv_connector":"NixlConnector","kv_connector_extra_config":{"kv_lease_duration":-1}}"#,
        ] {
            assert!(KvTransferConfig::from_vllm_json(bad, "e", 1, 1.0).is_err(), "{bad}");
        }
    }

    #[test]
    fn roles_follow_the_flags() {
        assert_eq!(role(None), Ok(KvRole::Plain));
        assert_eq!(role(Some(&Value::Null)), Ok(KvRole::Plain));
        assert_eq!(role(Some(&json!({"do_remote_decode": true}))), Ok(KvRole::Prefill));
        assert!(role(Some(&json!({"do_remote_decode": true, "do_remote_prefill": true}))).is_err());
        assert!(role(Some(&json!([1]))).is_err());
        let missing = role(Some(&json!({"do_remote_prefill": true, "remote_engine_id": "e"})));
        assert!(missing.unwrap_err().contains("remote_request_id"));
        let a = prefill_answer(
            &KvTransferConfig::from_vllm_json(r#"{"kv_connector":"NixlConnector"}"#, "p", 1, 1.0)
                .unwrap(),
            "r1",
            "127.0.0.1:8000".parse().unwrap(),
            40,
            16,
            16,
        );
        assert_eq!(a["remote_block_ids"], json!([[0, 1, 2]]));
        assert!(matches!(role(Some(&a)), Ok(KvRole::Decode(_))));
    }
}
