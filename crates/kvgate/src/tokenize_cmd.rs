//! `kvgate tokenize`: one vLLM-style `/tokenize` body on stdin, the token ids
//! on stdout, computed exactly as the engine would (template, preprocessing,
//! special tokens). Operators use it to check what kvgate will route on;
//! tests use it as a black box.

use std::io::{Read, Write};

use anyhow::{bail, Context};
use kvgate_tokenize::{ChatRequest, ChatTokenizer};
use serde_json::{json, Value};

use crate::cli::TokenizeArgs;

pub(crate) fn run(args: &TokenizeArgs) -> anyhow::Result<()> {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).context("reading the request from stdin")?;
    let body: Value = serde_json::from_str(&input).context("stdin is not valid JSON")?;
    let tokenizer = match &args.model_dir {
        Some(dir) => ChatTokenizer::from_dir_with(dir, args.encoder)
            .with_context(|| format!("loading the model directory {}", dir.display()))?,
        None => ChatTokenizer::bundled_with(args.encoder)
            .context("loading the bundled Qwen3 tokenizer")?,
    };
    let tokens = tokenize(&tokenizer, body)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", json!({"tokens": tokens, "count": tokens.len()}))?;
    Ok(())
}

/// Chat bodies have `messages`; completion bodies have `prompt` (a string).
fn tokenize(tokenizer: &ChatTokenizer, body: Value) -> anyhow::Result<Vec<u32>> {
    let Value::Object(map) = &body else { bail!("the request must be a JSON object") };
    if map.contains_key("messages") {
        let request: ChatRequest = serde_json::from_value(body).context("invalid chat request")?;
        return Ok(tokenizer.encode_chat(&request)?);
    }
    match map.get("prompt") {
        Some(Value::String(prompt)) => {
            // vLLM's completion default: the tokenizer adds its special tokens.
            let add_special =
                map.get("add_special_tokens").and_then(Value::as_bool).unwrap_or(true);
            if add_special {
                Ok(tokenizer.encode_prompt(prompt)?)
            } else {
                Ok(tokenizer.encode_text_no_special(prompt)?)
            }
        }
        Some(_) => bail!("`prompt` must be a string"),
        None => bail!("the request needs `messages` (chat) or `prompt` (completion)"),
    }
}
