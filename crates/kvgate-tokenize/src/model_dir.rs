//! Loading a Hugging Face model directory: the raw files, before any parsing
//! beyond what is needed to find them.
//!
//! A [`ModelDir`] holds `tokenizer.json` (plain, or zstd-compressed as
//! `tokenizer.json.zst`), the parsed `tokenizer_config.json` and the chat
//! template(s). The chat template is resolved with the precedence of
//! transformers' `PreTrainedTokenizerBase.from_pretrained`:
//!
//! 1. `chat_template.jinja` (named "default") plus any
//!    `additional_chat_templates/*.jinja` (named by file stem) replace the
//!    config's templates entirely;
//! 2. otherwise the `chat_template` entry of `tokenizer_config.json`, a string
//!    or a list of `{name, template}`;
//! 3. otherwise `chat_template.json` (`{"chat_template": ...}`), the legacy
//!    processor file. transformers' tokenizer ignores it, and vLLM only reads
//!    it through a multimodal processor, so it is used only as a last resort.
//!
//! [`ModelDir::bundled_qwen3`] gives the vendored Qwen3 tokenizer compiled
//! into the binary, so that kvgate works on a machine without downloads.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::config::TokenizerConfig;
use crate::error::{Result, TokenizeError};

/// The vendored Qwen3 tokenizer (Apache-2.0), see `assets/tokenizers/qwen3/`.
const QWEN3_TOKENIZER_ZST: &[u8] =
    include_bytes!("../../../assets/tokenizers/qwen3/tokenizer.json.zst");
const QWEN3_CONFIG: &[u8] =
    include_bytes!("../../../assets/tokenizers/qwen3/tokenizer_config.json");

/// The files of a model directory that tokenization depends on.
#[derive(Debug, Clone)]
pub struct ModelDir {
    /// Where the files came from, for messages.
    pub(crate) origin: String,
    /// The decompressed `tokenizer.json`.
    pub(crate) tokenizer_json: Vec<u8>,
    /// The parsed `tokenizer_config.json` (defaults if absent).
    pub(crate) config: TokenizerConfig,
    /// The chat templates after file precedence.
    pub(crate) templates: ChatTemplates,
    /// These are the files compiled into the binary (`bundled_qwen3`).
    pub(crate) bundled: bool,
}

/// The chat templates of a model: none, one, or several named ones.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ChatTemplates {
    /// The model defines no chat template; chats need a request template.
    #[default]
    None,
    /// One template.
    Single(String),
    /// Named templates, in file order (`default`, `tool_use`, ...).
    Named(Vec<(String, String)>),
}

impl ChatTemplates {
    /// Picks the template source for a request, as transformers'
    /// `get_chat_template` does: a requested name selects a named template,
    /// any other requested string is a template itself; without a request,
    /// `tool_use` is chosen when tools are given and exists, else `default`.
    pub fn select<'a>(&'a self, requested: Option<&'a str>, has_tools: bool) -> Result<&'a str> {
        match self {
            ChatTemplates::Named(named) => {
                let find =
                    |name: &str| named.iter().find(|(n, _)| n == name).map(|(_, t)| t.as_str());
                match requested {
                    Some(name) => Ok(find(name).unwrap_or(name)),
                    None => {
                        let tool_use = if has_tools { find("tool_use") } else { None };
                        tool_use.or_else(|| find("default")).ok_or_else(|| {
                            let mut names: Vec<&str> =
                                named.iter().map(|(n, _)| n.as_str()).collect();
                            names.sort_unstable();
                            TokenizeError::InvalidRequest(format!(
                                "this model has multiple chat templates with no default \
                                 specified; pass a chat template or one of the names {names:?}"
                            ))
                        })
                    }
                }
            }
            ChatTemplates::Single(template) => Ok(requested.unwrap_or(template)),
            ChatTemplates::None => requested.ok_or_else(|| {
                TokenizeError::InvalidRequest(
                    "the tokenizer defines no chat template and the request passed none".into(),
                )
            }),
        }
    }

    /// Parses the `chat_template` value of a config file: a string, or a
    /// list of `{"name": ..., "template": ...}`.
    pub(crate) fn from_json(value: &serde_json::Value) -> Result<ChatTemplates> {
        match value {
            serde_json::Value::Null => Ok(ChatTemplates::None),
            serde_json::Value::String(s) => Ok(ChatTemplates::Single(s.clone())),
            serde_json::Value::Array(items) => {
                let mut named = Vec::with_capacity(items.len());
                for item in items {
                    let name = item.get("name").and_then(|v| v.as_str());
                    let template = item.get("template").and_then(|v| v.as_str());
                    match (name, template) {
                        (Some(n), Some(t)) => named.push((n.to_owned(), t.to_owned())),
                        _ => {
                            return Err(TokenizeError::InvalidModelDir(
                                "chat_template list entries need a string name and template".into(),
                            ))
                        }
                    }
                }
                Ok(ChatTemplates::Named(named))
            }
            _ => Err(TokenizeError::InvalidModelDir(
                "chat_template must be a string or a list of {name, template}".into(),
            )),
        }
    }
}

impl ModelDir {
    /// Reads a model directory from disk.
    pub fn open(dir: impl AsRef<Path>) -> Result<ModelDir> {
        let dir = dir.as_ref();
        let origin = dir.display().to_string();
        let tokenizer_json = read_tokenizer_json(dir)?;
        let config = match read_optional(&dir.join("tokenizer_config.json"))? {
            Some(bytes) => TokenizerConfig::from_slice(&bytes)?,
            None => TokenizerConfig::default(),
        };
        let templates = resolve_templates(dir, &config)?;
        Ok(ModelDir { origin, tokenizer_json, config, templates, bundled: false })
    }

    /// Builds a model directory from in-memory files, e.g. ones compiled into
    /// the binary. `tokenizer_json` may be zstd-compressed.
    pub fn from_bytes(
        origin: impl Into<String>,
        tokenizer_json: &[u8],
        tokenizer_config: Option<&[u8]>,
    ) -> Result<ModelDir> {
        let tokenizer_json = if is_zstd(tokenizer_json) {
            decompress_zstd(tokenizer_json)?
        } else {
            tokenizer_json.to_vec()
        };
        let config = match tokenizer_config {
            Some(bytes) => TokenizerConfig::from_slice(bytes)?,
            None => TokenizerConfig::default(),
        };
        let templates = ChatTemplates::from_json(&config.chat_template)?;
        Ok(ModelDir { origin: origin.into(), tokenizer_json, config, templates, bundled: false })
    }

    /// The vendored Qwen3 tokenizer and chat template, compiled into the
    /// binary (`assets/tokenizers/qwen3/`).
    pub fn bundled_qwen3() -> Result<ModelDir> {
        let dir = ModelDir::from_bytes("bundled qwen3", QWEN3_TOKENIZER_ZST, Some(QWEN3_CONFIG))?;
        Ok(ModelDir { bundled: true, ..dir })
    }

    /// The chat templates after file precedence.
    pub fn chat_templates(&self) -> &ChatTemplates {
        &self.templates
    }

    /// Where the files came from (a path, or "bundled qwen3").
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The `tokenizer.json` bytes (decompressed).
    pub fn tokenizer_json(&self) -> &[u8] {
        &self.tokenizer_json
    }
}

/// The zstd frame magic number, little-endian.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

fn is_zstd(bytes: &[u8]) -> bool {
    bytes.starts_with(&ZSTD_MAGIC)
}

fn decompress_zstd(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut decoder = ruzstd::decoding::StreamingDecoder::new(bytes)
        .map_err(|e| TokenizeError::InvalidModelDir(format!("bad zstd tokenizer.json: {e}")))?;
    let mut out = Vec::new();
    decoder
        .read_to_end(&mut out)
        .map_err(|e| TokenizeError::InvalidModelDir(format!("bad zstd tokenizer.json: {e}")))?;
    Ok(out)
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TokenizeError::Io { path: path.to_path_buf(), source }),
    }
}

fn read_tokenizer_json(dir: &Path) -> Result<Vec<u8>> {
    if let Some(bytes) = read_optional(&dir.join("tokenizer.json"))? {
        return Ok(bytes);
    }
    if let Some(bytes) = read_optional(&dir.join("tokenizer.json.zst"))? {
        return decompress_zstd(&bytes);
    }
    Err(TokenizeError::InvalidModelDir(format!(
        "{}: neither tokenizer.json nor tokenizer.json.zst exists",
        dir.display()
    )))
}

fn read_text(path: &Path) -> Result<Option<String>> {
    match read_optional(path)? {
        None => Ok(None),
        Some(bytes) => String::from_utf8(bytes).map(Some).map_err(|_| {
            TokenizeError::InvalidModelDir(format!("{} is not UTF-8", path.display()))
        }),
    }
}

fn resolve_templates(dir: &Path, config: &TokenizerConfig) -> Result<ChatTemplates> {
    let mut named: Vec<(String, String)> = Vec::new();
    if let Some(default) = read_text(&dir.join("chat_template.jinja"))? {
        named.push(("default".to_owned(), default));
    }
    let extra_dir = dir.join("additional_chat_templates");
    if extra_dir.is_dir() {
        let entries = std::fs::read_dir(&extra_dir)
            .map_err(|source| TokenizeError::Io { path: extra_dir.clone(), source })?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "jinja"))
            .collect();
        paths.sort();
        for path in paths {
            let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            if let Some(text) = read_text(&path)? {
                named.push((name.to_owned(), text));
            }
        }
    }
    match named.len() {
        0 => {}
        1 if named[0].0 == "default" => {
            return Ok(ChatTemplates::Single(named.remove(0).1));
        }
        _ => return Ok(ChatTemplates::Named(named)),
    }
    let from_config = ChatTemplates::from_json(&config.chat_template)?;
    if from_config != ChatTemplates::None {
        return Ok(from_config);
    }
    if let Some(bytes) = read_optional(&dir.join("chat_template.json"))? {
        let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            TokenizeError::InvalidModelDir(format!("chat_template.json is not JSON: {e}"))
        })?;
        let template = value.get("chat_template").unwrap_or(&serde_json::Value::Null);
        return ChatTemplates::from_json(template);
    }
    Ok(ChatTemplates::None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_follows_transformers() {
        let named = ChatTemplates::Named(vec![
            ("default".into(), "D".into()),
            ("tool_use".into(), "T".into()),
        ]);
        assert_eq!(named.select(None, false).unwrap(), "D");
        assert_eq!(named.select(None, true).unwrap(), "T");
        assert_eq!(named.select(Some("tool_use"), false).unwrap(), "T");
        assert_eq!(named.select(Some("{{ x }}"), false).unwrap(), "{{ x }}");
        let single = ChatTemplates::Single("S".into());
        assert_eq!(single.select(None, true).unwrap(), "S");
        assert!(ChatTemplates::None.select(None, false).is_err());
        let no_default = ChatTemplates::Named(vec![("rag".into(), "R".into())]);
        assert!(no_default.select(None, false).is_err());
    }

    #[test]
    fn template_list_parses() {
        let v = serde_json::json!([{"name": "default", "template": "a"}, {"name": "rag", "template": "b"}]);
        let t = ChatTemplates::from_json(&v).unwrap();
        assert_eq!(
            t,
            ChatTemplates::Named(vec![("default".into(), "a".into()), ("rag".into(), "b".into())])
        );
        assert!(ChatTemplates::from_json(&serde_json::json!(3)).is_err());
    }

    #[test]
    fn directory_precedence() {
        let dir = std::env::temp_dir().join(format!("kvgate-md-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), b"{}").unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), br#"{"chat_template": "from config"}"#)
            .unwrap();
        let md = ModelDir::open(&dir).unwrap();
        assert_eq!(md.templates, ChatTemplates::Single("from config".into()));
        std::fs::write(dir.join("chat_template.jinja"), b"from jinja").unwrap();
        let md = ModelDir::open(&dir).unwrap();
        assert_eq!(md.templates, ChatTemplates::Single("from jinja".into()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_tokenizer_is_an_error() {
        let dir = std::env::temp_dir().join(format!("kvgate-md-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(matches!(ModelDir::open(&dir), Err(TokenizeError::InvalidModelDir(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
