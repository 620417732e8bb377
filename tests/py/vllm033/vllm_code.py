"""Loads named definitions from vLLM's own source files, without vLLM.

vLLM's modules import torch, CUDA kernels and most of the package at import
time. kvgate's interop tests need a handful of pure-Python definitions from
them: the KV event classes, the block-hash extra keys, the offloading
connector's event tracker. This loader parses a file from the release wheel
(fetched by scripts/fetch-vllm-code.sh into .cache/vllm-0.33.0), picks the
top-level definitions it is asked for by name, and executes exactly those,
unchanged, in a namespace that supplies the few names they use (small
stand-ins for vLLM's logger and environment flags). Nothing is copied: the
code runs from the wheel's files.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Any


def _names_of(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def load(root: pathlib.Path, rel: str, names: list[str], ns: dict[str, Any]) -> None:
    """Executes the top-level definitions `names` of `root/rel` into `ns`, in
    file order. Raises if any name is missing, so that a renamed function in
    a new release fails loudly instead of testing nothing."""
    path = root / rel
    tree = ast.parse(path.read_text(), filename=str(path))
    wanted = set(names)
    found: set[str] = set()
    for node in tree.body:
        hit = wanted.intersection(_names_of(node))
        if not hit:
            continue
        found |= hit
        module = ast.Module(body=[node], type_ignores=[])
        exec(compile(module, str(path), "exec"), ns)  # noqa: S102 - vLLM's own code
    missing = wanted - found
    if missing:
        raise LookupError(f"{rel}: no top-level {sorted(missing)}")
