//! Conversation affinity without shared state: the response ids kvgate
//! hands to Responses API clients carry the replica that owns them.
//!
//! vLLM keeps a stored response in the memory of the engine process that
//! made it, so `previous_response_id`, `GET /v1/responses/{id}` and its
//! cancellation work only on that engine. Rather than share a table
//! between kvgate instances, every id returned to a client is rewritten
//! to `resp_` + base64url(version, owner's name, engine's id, tag), where
//! the tag is HMAC-SHA256 over the rest under a key the instances share
//! (`auth.affinity_key`), truncated to 16 bytes. Any instance, including
//! one started later, reads the owner back from the id, checks the tag and
//! sends the engine its own id. A client can neither point an id at a
//! replica of its choosing nor make one up: without the key the tag does
//! not verify.
//!
//! [`Rewriter`] does the rewriting on the way out, for whole bodies and
//! for a stream line by line (an id may be cut across chunks).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The prefix every response id has (vLLM's, kept so that clients that
/// look at it see a response id).
pub(crate) const PREFIX: &str = "resp_";

/// The layout of the id's payload; a new layout gets a new number.
const VERSION: u8 = 1;

/// Bytes of the HMAC kept in an id: 128 bits are beyond guessing.
const TAG_LEN: usize = 16;

/// Longest engine id or replica name carried (the name's length is one
/// byte; vLLM's ids are 37 bytes).
const MAX_PART: usize = 255;

/// The key ids are authenticated with.
#[derive(Clone)]
pub(crate) struct AffinityKey {
    key: [u8; 32],
    /// Whether it came from the configuration (shared by the instances
    /// configured alike) or was drawn at start (this instance only).
    pub(crate) shared: bool,
}

impl std::fmt::Debug for AffinityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AffinityKey").field("shared", &self.shared).finish_non_exhaustive()
    }
}

/// Why an id from a client does not name a response kvgate issued.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum IdError {
    /// Not an id in kvgate's form (an engine's own id, or garbage).
    #[error("it is not a response id issued by kvgate")]
    Foreign,
    /// In kvgate's form, but its tag does not verify: forged, altered, or
    /// issued under another affinity key.
    #[error(
        "its authentication tag does not verify (forged, or issued under another affinity key)"
    )]
    Forged,
}

/// Where an issued id points: the owning replica and the engine's own id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Owned {
    pub(crate) owner: String,
    pub(crate) engine_id: String,
}

impl AffinityKey {
    /// The configured key, or, without one, a key drawn for this process:
    /// ids then verify only on the instance that issued them.
    pub(crate) fn new(configured: Option<&str>) -> AffinityKey {
        match configured {
            // Hashed so that a key of any length becomes the 32 bytes HMAC
            // uses best, and the same text gives the same key everywhere.
            Some(k) => AffinityKey { key: Sha256::digest(k.as_bytes()).into(), shared: true },
            None => {
                let mut key = [0u8; 32];
                if getrandom::fill(&mut key).is_err() {
                    // No OS randomness: a key unique to this process and
                    // moment still keeps ids from verifying elsewhere.
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos());
                    let seed = format!("{now}:{}", std::process::id());
                    key = Sha256::digest(seed.as_bytes()).into();
                }
                AffinityKey { key, shared: false }
            }
        }
    }

    /// HMAC-SHA256 (RFC 2104) of `message` under the key.
    fn mac(&self, message: &[u8]) -> [u8; 32] {
        const BLOCK: usize = 64;
        let mut ipad = [0x36u8; BLOCK];
        let mut opad = [0x5cu8; BLOCK];
        for (i, b) in self.key.iter().enumerate() {
            ipad[i] ^= b;
            opad[i] ^= b;
        }
        let inner = Sha256::new().chain_update(ipad).chain_update(message).finalize();
        Sha256::new().chain_update(opad).chain_update(inner).finalize().into()
    }

    /// The client's id for `engine_id` made by `owner`; `None` when either
    /// is too long to carry (the engine's id is then passed on as it is).
    pub(crate) fn issue(&self, owner: &str, engine_id: &str) -> Option<String> {
        if owner.len() > MAX_PART || engine_id.len() > MAX_PART {
            return None;
        }
        let mut payload = Vec::with_capacity(2 + owner.len() + engine_id.len() + TAG_LEN);
        payload.push(VERSION);
        payload.push(owner.len() as u8);
        payload.extend_from_slice(owner.as_bytes());
        payload.extend_from_slice(engine_id.as_bytes());
        let tag = self.mac(&payload);
        payload.extend_from_slice(&tag[..TAG_LEN]);
        Some(format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(payload)))
    }

    /// The owner and engine id an id from a client names, verified.
    pub(crate) fn resolve(&self, id: &str) -> Result<Owned, IdError> {
        let encoded = id.strip_prefix(PREFIX).ok_or(IdError::Foreign)?;
        let payload = URL_SAFE_NO_PAD.decode(encoded).map_err(|_| IdError::Foreign)?;
        let (&version, rest) = payload.split_first().ok_or(IdError::Foreign)?;
        let (&name_len, rest) = rest.split_first().ok_or(IdError::Foreign)?;
        if version != VERSION || rest.len() < usize::from(name_len) + TAG_LEN {
            return Err(IdError::Foreign);
        }
        let (signed, tag) = payload.split_at(payload.len() - TAG_LEN);
        if !bool::from(self.mac(signed)[..TAG_LEN].ct_eq(tag)) {
            return Err(IdError::Forged);
        }
        let (name, engine) = rest[..rest.len() - TAG_LEN].split_at(usize::from(name_len));
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| IdError::Forged);
        Ok(Owned { owner: text(name)?, engine_id: text(engine)? })
    }
}

/// Rewrites the engine's response ids to the client's in what the engine
/// answers: the id of the response being made (learned from the first
/// `"id"` that is a response id, in a whole body or in the stream's first
/// event) and the previous response's id it echoes.
#[derive(Debug)]
pub(crate) struct Rewriter {
    key: AffinityKey,
    owner: String,
    /// (engine's id, client's id) pairs found so far.
    pairs: Vec<(String, String)>,
    /// Whether the response's own id has been learned.
    learned: bool,
    /// The stream's current line, until its end arrives.
    carry: BytesMut,
}

impl Rewriter {
    /// A rewriter for an answer of `owner`; `known` is the previous
    /// response's (engine id, client id), when the request continued one.
    pub(crate) fn new(key: AffinityKey, owner: &str, known: Option<(String, String)>) -> Rewriter {
        Rewriter {
            key,
            owner: owner.to_owned(),
            pairs: known.into_iter().collect(),
            learned: false,
            carry: BytesMut::new(),
        }
    }

    /// Learns the response's ids from a JSON text (a whole body or one
    /// event's data; the response object is the body itself or its
    /// `response`): its `id`, and the `previous_response_id` it echoes,
    /// which the same owner made (a continued turn goes to the owner).
    fn learn(&mut self, json: &[u8]) {
        if self.learned {
            return;
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(json) else { return };
        let response = v.get("response").filter(|r| r.is_object()).unwrap_or(&v);
        let id_of = |key: &str| {
            response.get(key).and_then(|i| i.as_str()).filter(|i| i.starts_with(PREFIX))
        };
        let Some(id) = id_of("id") else { return };
        self.learned = true;
        for engine in std::iter::once(id).chain(id_of("previous_response_id")) {
            if self.pairs.iter().any(|(e, _)| e == engine) {
                continue;
            }
            if let Some(client) = self.key.issue(&self.owner, engine) {
                self.pairs.push((engine.to_owned(), client));
            }
        }
    }

    fn replace(&self, text: &[u8]) -> Bytes {
        let mut out: Vec<u8> = text.to_vec();
        for (engine, client) in &self.pairs {
            out = replace_all(&out, engine.as_bytes(), client.as_bytes());
        }
        Bytes::from(out)
    }

    /// A whole body, rewritten.
    pub(crate) fn body(&mut self, body: &[u8]) -> Bytes {
        self.learn(body);
        self.replace(body)
    }

    /// The next chunk of a stream: the complete lines it ends, rewritten;
    /// a line still open waits for the next chunk (or [`Rewriter::flush`]).
    pub(crate) fn chunk(&mut self, chunk: &[u8]) -> Bytes {
        let Some(last_nl) = chunk.iter().rposition(|&b| b == b'\n' || b == b'\r') else {
            self.carry.extend_from_slice(chunk);
            return Bytes::new();
        };
        self.carry.extend_from_slice(&chunk[..=last_nl]);
        let lines = self.carry.split().freeze();
        self.carry.extend_from_slice(&chunk[last_nl + 1..]);
        if !self.learned {
            for line in lines.split(|&b| b == b'\n' || b == b'\r') {
                if let Some(data) = line.strip_prefix(b"data:") {
                    self.learn(data);
                }
            }
        }
        self.replace(&lines)
    }

    /// What is left of a stream that ended without a final line end.
    pub(crate) fn flush(&mut self) -> Bytes {
        let rest = self.carry.split().freeze();
        if rest.is_empty() {
            rest
        } else {
            self.replace(&rest)
        }
    }
}

/// `haystack` with every `needle` replaced by `with`.
fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return haystack.to_vec();
    }
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
#[path = "affinity/tests.rs"]
mod tests;
