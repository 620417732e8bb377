//! One engine replica in the configuration (`[[replicas]]`, `--replica`), and
//! how it receives the prompt tokens kvgate computed.

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// How a replica receives the prompt tokens kvgate computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Passthrough {
    /// Chat gets `kv_transfer_params.prompt_token_ids` (vLLM skips its own
    /// template and tokenizer); completions get a token-id `prompt`.
    #[default]
    KvTransferParams,
    /// Completions get a token-id `prompt`; chat bodies go untouched.
    TokenPrompt,
    /// Bodies go untouched (the engine tokenizes again).
    None,
}

impl Passthrough {
    /// The snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Passthrough::KvTransferParams => "kv_transfer_params",
            Passthrough::TokenPrompt => "token_prompt",
            Passthrough::None => "none",
        }
    }
}

/// One vLLM replica.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaConfig {
    /// Base URL of its OpenAI server, e.g. `http://10.0.0.5:8000`.
    pub url: String,
    /// Name in logs, metrics and explanations (default: the URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its KV-event PUB endpoint (`--kv-events-config` `endpoint`), e.g.
    /// `tcp://10.0.0.5:5557`. Without it kvgate sees no cache state for this
    /// replica (reported loudly) and routes it by load only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<String>,
    /// Its replay ROUTER endpoint (`replay_endpoint`), to recover lost events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<String>,
    /// Event topic prefix (`topic`); empty takes every topic.
    #[serde(default)]
    pub topic: String,
    /// The engine's `--api-key`; sent to this engine only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Its `--block-size`; checked against its events and `/metrics`.
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    /// How prompt tokens are handed over.
    #[serde(default)]
    pub passthrough: Passthrough,
    /// The engine runs `--scheduling-policy priority`: it is sent each
    /// request's vLLM `priority` (the client's, or its band's). Without
    /// it a client's `priority` is removed from the body, since vLLM
    /// refuses a non-zero one without priority scheduling.
    #[serde(default)]
    pub priority_scheduling: bool,
    /// The server's `--data-parallel-size`: its ranks are separate caches,
    /// each a candidate of its own (`NAME#r`), with events on the port of
    /// `events` (and `replay`) plus r, as vLLM offsets them.
    #[serde(default = "default_dp_size")]
    pub dp_size: u32,
    /// The one data-parallel rank this entry is (requests carry
    /// `X-data-parallel-rank`); set by the `dp_size` expansion, or by hand
    /// for ranks whose event ports do not follow the +r rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_rank: Option<u32>,
    /// The pool (`[[pools]]` name) it serves; none is the first pool. Set
    /// by its place inside a `[[pools]]` entry; needed for replicas added
    /// with `--replica` or the admin API when there are several pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Its part in prefill/decode disaggregation: `both` (default),
    /// `prefill` (prefill hops only) or `decode` (`[disagg]`).
    #[serde(default)]
    pub role: crate::config::disagg_config::Role,
}

fn default_block_size() -> u32 {
    16
}

fn default_dp_size() -> u32 {
    1
}

/// The most data-parallel ranks one replica entry may expand into.
pub const MAX_DP_SIZE: u32 = 256;

impl ReplicaConfig {
    /// A replica at `url` with defaults.
    pub fn new(url: impl Into<String>) -> ReplicaConfig {
        ReplicaConfig {
            url: url.into(),
            name: None,
            events: None,
            replay: None,
            topic: String::new(),
            api_key: None,
            block_size: default_block_size(),
            passthrough: Passthrough::default(),
            priority_scheduling: false,
            dp_size: default_dp_size(),
            dp_rank: None,
            pool: None,
            role: crate::config::disagg_config::Role::Both,
        }
    }

    /// The entries this one stands for: itself, or with `dp_size` k > 1 one
    /// entry per rank, named `NAME#r`, pinned to rank r, with events and
    /// replay on the ports plus r.
    pub fn ranks(&self) -> Result<Vec<ReplicaConfig>, String> {
        if self.dp_size <= 1 {
            return Ok(vec![self.clone()]);
        }
        if self.dp_rank.is_some() {
            return Err(format!(
                "replica {}: dp_size and dp_rank are exclusive (one entry is one rank, or all)",
                self.display_name()
            ));
        }
        if self.dp_size > MAX_DP_SIZE {
            return Err(format!(
                "replica {}: dp_size {} is over {MAX_DP_SIZE}",
                self.display_name(),
                self.dp_size
            ));
        }
        let name = self.display_name().trim_end_matches('/').to_owned();
        (0..self.dp_size)
            .map(|rank| {
                let offset = |e: &Option<String>| {
                    e.as_deref().map(|e| kvgate_events::offset_endpoint_port(e, rank)).transpose()
                };
                Ok(ReplicaConfig {
                    name: Some(format!("{name}#{rank}")),
                    events: offset(&self.events)?,
                    replay: offset(&self.replay)?,
                    dp_size: 1,
                    dp_rank: Some(rank),
                    ..self.clone()
                })
            })
            .collect()
    }

    /// The display name.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.url)
    }

    /// Parses the `--replica` flag:
    /// `URL[,events=tcp://H:P][,replay=tcp://H:P][,topic=T][,api_key=K][,block_size=N][,passthrough=MODE][,priority_scheduling=BOOL][,name=N][,dp_size=K][,dp_rank=R][,pool=P]`.
    pub fn parse_spec(spec: &str) -> Result<ReplicaConfig, ConfigError> {
        let mut parts = spec.split(',');
        let url = parts.next().unwrap_or_default().trim();
        if url.is_empty() {
            return Err(ConfigError::Invalid(format!("--replica {spec:?}: missing URL")));
        }
        let mut r = ReplicaConfig::new(url);
        for part in parts {
            let Some((k, v)) = part.split_once('=') else {
                return Err(ConfigError::Invalid(format!(
                    "--replica {spec:?}: {part:?} is not key=value"
                )));
            };
            let v = v.trim();
            match k.trim() {
                "events" => r.events = Some(v.to_owned()),
                "replay" => r.replay = Some(v.to_owned()),
                "topic" => r.topic = v.to_owned(),
                "api_key" => r.api_key = Some(v.to_owned()),
                "name" => r.name = Some(v.to_owned()),
                "pool" => r.pool = Some(v.to_owned()),
                "role" => {
                    r.role = match v {
                        "both" => crate::config::disagg_config::Role::Both,
                        "prefill" => crate::config::disagg_config::Role::Prefill,
                        "decode" => crate::config::disagg_config::Role::Decode,
                        _ => {
                            return Err(ConfigError::Invalid(format!(
                                "--replica {spec:?}: role must be both, prefill or decode"
                            )))
                        }
                    }
                }
                "dp_size" => {
                    r.dp_size = v.parse().ok().filter(|&k| k >= 1).ok_or_else(|| {
                        ConfigError::Invalid(format!("--replica {spec:?}: dp_size {v:?}"))
                    })?
                }
                "dp_rank" => {
                    r.dp_rank = Some(v.parse().map_err(|_| {
                        ConfigError::Invalid(format!("--replica {spec:?}: dp_rank {v:?}"))
                    })?)
                }
                "block_size" => {
                    r.block_size = v.parse().map_err(|_| {
                        ConfigError::Invalid(format!("--replica {spec:?}: block_size {v:?}"))
                    })?
                }
                "passthrough" => {
                    r.passthrough = match v {
                        "kv_transfer_params" => Passthrough::KvTransferParams,
                        "token_prompt" => Passthrough::TokenPrompt,
                        "none" => Passthrough::None,
                        _ => {
                            return Err(ConfigError::Invalid(format!(
                                "--replica {spec:?}: passthrough must be kv_transfer_params, \
                                 token_prompt or none"
                            )))
                        }
                    }
                }
                "priority_scheduling" => {
                    r.priority_scheduling = v.parse().map_err(|_| {
                        ConfigError::Invalid(format!(
                            "--replica {spec:?}: priority_scheduling must be true or false"
                        ))
                    })?
                }
                other => {
                    return Err(ConfigError::Invalid(format!(
                        "--replica {spec:?}: unknown key {other:?} (expected events, replay, \
                         topic, api_key, block_size, passthrough, priority_scheduling, name, \
                         dp_size, dp_rank, pool, role)"
                    )))
                }
            }
        }
        Ok(r)
    }
}
