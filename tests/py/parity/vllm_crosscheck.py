#!/usr/bin/env python3
"""Cross-check the parity fixtures against vLLM's own /tokenize code path.

Optional, NOT run by CI: it needs a separate environment with vLLM installed
(`pip install vllm==0.33.0`, several GB, pulls torch; on a machine without a GPU
vLLM still imports and its renderer runs on the CPU):

    python3 -m venv .cache/vllm-venv
    .cache/vllm-venv/bin/pip install vllm==0.33.0
    scripts/fetch-tokenizers.sh
    .cache/vllm-venv/bin/python tests/py/parity/vllm_crosscheck.py

For each tokenizer family it builds a throw-away model directory (the tokenizer
files plus a tiny config.json, so that vLLM's ModelConfig can be constructed;
no weights are needed), then the real serving objects vLLM's API server uses:
ModelConfig -> VllmConfig -> HfRenderer -> OnlineRenderer -> ServingTokenization.
Each corpus request is validated with vLLM's pydantic request types and passed
to ServingTokenization.create_tokenize, exactly like a POST /tokenize. The
resulting token ids (or the fact that an error was returned) are compared with
crates/kvgate-tokenize/tests/parity/expected-<family>.jsonl.

Exit status 0 when every request agrees, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PARITY = ROOT / "crates" / "kvgate-tokenize" / "tests" / "parity"
TOKENIZERS = ROOT / ".cache" / "tokenizers"

# Minimal configs: vLLM only needs a valid architecture and sizes to build its
# ModelConfig; the renderer never touches weights.
CONFIGS = {
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 1,
        "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000, "torch_dtype": "bfloat16", "bos_token_id": 151643,
        "eos_token_id": 151645, "tie_word_embeddings": True,
        # Without transformers_version, transformers 5 suspects a local Mistral
        # tokenizer and warns about its regex (it changes nothing).
        "transformers_version": "5.20.2",
    },
    "llama3_1": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 128256,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000,
        "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128009,
        "transformers_version": "5.20.2",
    },
}


def build_serving(model_dir: str):
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry
    from vllm.entrypoints.serve.tokenize.serving import ServingTokenization
    from vllm.renderers.hf import HfRenderer
    from vllm.renderers.online_renderer import OnlineRenderer
    from vllm.tokenizers import get_tokenizer

    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, dtype="float32")
    # No accelerator is needed (or detected) for rendering: say "cpu" explicitly.
    vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
    renderer = HfRenderer(vllm_config, get_tokenizer(model_dir))
    online = OnlineRenderer(
        model_config,
        renderer,
        request_logger=None,
        chat_template=None,
        chat_template_content_format="auto",
    )
    models = OpenAIModelRegistry(model_config, [BaseModelPath(name="m", model_path=model_dir)])
    return ServingTokenization(
        models,
        online,
        chat_template=None,
        chat_template_content_format="auto",
    )


_ADAPTER = None


async def tokenize_one(serving, body: dict):
    from pydantic import TypeAdapter

    from vllm.entrypoints.serve.engine.protocol import ErrorResponse
    from vllm.entrypoints.serve.tokenize.protocol import TokenizeRequest

    global _ADAPTER
    if _ADAPTER is None:
        # Keep the adapter alive like FastAPI does: validated `tool_calls` are lazy
        # pydantic ValidatorIterators that crash (PanicException) if their
        # TypeAdapter has been garbage-collected before they are consumed.
        _ADAPTER = TypeAdapter(TokenizeRequest)
    try:
        request = _ADAPTER.validate_python(json.loads(json.dumps(body)))
        response = await serving.create_tokenize(request, None)
    except Exception as e:  # validation / template errors surface as exceptions
        return {"error": f"{type(e).__name__}: {e}".split("\n")[0]}
    if isinstance(response, ErrorResponse):
        return {"error": f"ErrorResponse: {response.error.message}"}
    return {"ids": list(response.tokens)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", action="append", choices=sorted(CONFIGS), help="default: all")
    ap.add_argument("--out", help="also write vLLM's results as JSON lines to this directory")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import vllm

    corpus = [json.loads(line) for line in (PARITY / "corpus.jsonl").read_text(encoding="utf-8").split("\n") if line.strip()]
    failures = 0
    for family in args.family or sorted(CONFIGS):
        expected = {}
        exp_path = PARITY / f"expected-{family}.jsonl"
        if exp_path.exists():
            for line in exp_path.read_text(encoding="utf-8").split("\n"):
                if not line.strip():
                    continue
                e = json.loads(line)
                expected[e["id"]] = e
        else:
            print(f"[{family}] warning: {exp_path} does not exist; every request will mismatch")
        tmp = tempfile.mkdtemp(prefix=f"kvgate-vllm-{family}-")
        try:
            for f in (TOKENIZERS / family).iterdir():
                if f.is_file() and not f.name.startswith("."):
                    shutil.copy(f, tmp)
            (Path(tmp) / "config.json").write_text(json.dumps(CONFIGS[family]))
            serving = build_serving(tmp)
            agree = 0
            results = []
            for item in corpus:
                got = asyncio.run(tokenize_one(serving, item["request"]))
                results.append({"id": item["id"], **got})
                exp = expected.get(item["id"])
                if exp is None:
                    ok, why = False, "missing from expected file"
                elif "error" in exp or "error" in got:
                    ok = ("error" in exp) == ("error" in got)
                    why = f"expected {'error' if 'error' in exp else 'ids'}, vLLM gave {got.get('error', 'ids')}"
                else:
                    ok = exp["ids"] == got["ids"]
                    if not ok:
                        n = next((i for i, (a, b) in enumerate(zip(exp["ids"], got["ids"])) if a != b),
                                 min(len(exp["ids"]), len(got["ids"])))
                        why = f"ids differ at index {n} (expected {len(exp['ids'])} ids, vLLM {len(got['ids'])})"
                if ok:
                    agree += 1
                else:
                    failures += 1
                    print(f"[{family}] MISMATCH {item['id']}: {why}")
            print(f"[{family}] vLLM {vllm.__version__}: {agree}/{len(corpus)} agree")
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                with open(Path(args.out) / f"vllm-{family}.jsonl", "w", encoding="utf-8") as fh:
                    for r in results:
                        fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
