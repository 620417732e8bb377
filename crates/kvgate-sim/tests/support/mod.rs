//! What the HTTP test binaries share: the model name, one bundled
//! tokenizer service per binary, and simulated replicas on loopback.
#![allow(clippy::unwrap_used, dead_code)]

use std::sync::{Arc, OnceLock};

use kvgate_sim::server::{start, Replica, ServerConfig};
use kvgate_sim::EngineConfig;
use kvgate_tokenize::service::{Tokenize, TokenizeService};
use kvgate_tokenize::ChatTokenizer;
use tokio::net::TcpListener;

pub(crate) const MODEL: &str = "Qwen/Qwen3-0.6B";

pub(crate) fn tokenizer() -> Arc<TokenizeService> {
    static T: OnceLock<Arc<TokenizeService>> = OnceLock::new();
    Arc::clone(T.get_or_init(|| {
        let t = Tokenize::new(ChatTokenizer::bundled().unwrap(), None);
        Arc::new(TokenizeService::new(t, 1).unwrap())
    }))
}

/// The API tests' replica (Messages, Responses): a fixed hash seed, 512
/// GPU blocks, 50x speed.
pub(crate) async fn api_replica() -> Replica {
    replica(ServerConfig {
        engine: EngineConfig { hash_seed: Some(7), num_gpu_blocks: 512, ..EngineConfig::default() },
        model: MODEL.to_owned(),
        speedup: 50.0,
        ..ServerConfig::default()
    })
    .await
}

/// A simulated replica with `config`, listening on a free loopback port.
pub(crate) async fn replica(config: ServerConfig) -> Replica {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    start(config, listener, tokenizer()).await.unwrap()
}
