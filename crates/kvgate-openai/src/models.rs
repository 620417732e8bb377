//! `GET /v1/models`: the model list, as vLLM serves it.
//!
//! The gateway merges the lists of its replicas, so a card keeps any field
//! an engine adds (vLLM's `permission`, for one) in `extra`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One served model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    /// The name clients put in `model`.
    pub id: String,
    /// Always `"model"`.
    #[serde(default = "model_object")]
    pub object: String,
    /// Unix seconds when the model was loaded.
    #[serde(default)]
    pub created: u64,
    /// The owner, `"vllm"` for vLLM.
    #[serde(default)]
    pub owned_by: String,
    /// The base model a LoRA adapter applies to, or the model's own path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// The parent model of an adapter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The context length (vLLM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u64>,
    /// Anything else the engine reported.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn model_object() -> String {
    "model".to_owned()
}

fn list_object() -> String {
    "list".to_owned()
}

impl ModelCard {
    /// A card for `id`, created at `created` (Unix seconds).
    pub fn new(id: impl Into<String>, owned_by: impl Into<String>, created: u64) -> Self {
        ModelCard {
            id: id.into(),
            object: model_object(),
            created,
            owned_by: owned_by.into(),
            root: None,
            parent: None,
            max_model_len: None,
            extra: Map::new(),
        }
    }
}

/// The `/v1/models` answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    /// Always `"list"`.
    #[serde(default = "list_object")]
    pub object: String,
    /// The models.
    #[serde(default)]
    pub data: Vec<ModelCard>,
}

impl ModelList {
    /// A list of `data`.
    pub fn new(data: Vec<ModelCard>) -> Self {
        ModelList { object: list_object(), data }
    }

    /// The card for model `id`.
    pub fn get(&self, id: &str) -> Option<&ModelCard> {
        self.data.iter().find(|card| card.id == id)
    }
}

impl Default for ModelList {
    fn default() -> Self {
        ModelList::new(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_vllm_model_list() {
        let body = r#"{"object":"list","data":[{"id":"Qwen/Qwen3-8B","object":"model","created":1700000000,"owned_by":"vllm","root":"Qwen/Qwen3-8B","parent":null,"max_model_len":40960,"permission":[{"id":"modelperm-1","object":"model_permission"}]}]}"#;
        let list: ModelList = serde_json::from_str(body).unwrap();
        let card = list.get("Qwen/Qwen3-8B").unwrap();
        assert_eq!(card.max_model_len, Some(40960));
        assert!(card.extra.contains_key("permission"));
        let back: Value = serde_json::to_value(&list).unwrap();
        assert_eq!(back["data"][0]["permission"][0]["id"], "modelperm-1");
    }

    #[test]
    fn builds_a_list() {
        let list = ModelList::new(vec![ModelCard::new("m", "kvgate", 1)]);
        let value = serde_json::to_value(&list).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"object":"list","data":[{"id":"m","object":"model","created":1,"owned_by":"kvgate"}]})
        );
    }
}
