"""Loading the reference vectors in ../shared/vectors (see its README for the encoding)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

VECTORS_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "vectors"
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
           "bool": torch.bool}


def _num(x):
    if isinstance(x, str):
        return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[x]
    if isinstance(x, list):
        return [_num(v) for v in x]
    return x


def decode(value):
    """A `{shape, dtype, data}` dict becomes a tensor; anything else is returned as is."""
    if isinstance(value, dict) and {"shape", "dtype", "data"} <= set(value):
        t = torch.tensor(_num(value["data"]), dtype=_DTYPES.get(value["dtype"], torch.float32))
        return t.reshape(value["shape"])
    return value


def load(name: str) -> dict:
    path = VECTORS_DIR / name
    if not path.exists():
        pytest.fail(f"reference vectors not found at {path}: ../shared must sit beside the repository")
    return json.loads(path.read_text())


def cases(name: str) -> list:
    """pytest parameters (one per case, id = case name) with inputs/outputs decoded to tensors."""
    out = []
    for case in load(name)["cases"]:
        decoded = dict(case)
        decoded["inputs"] = {k: decode(v) for k, v in case.get("inputs", {}).items()}
        decoded["outputs"] = {k: decode(v) for k, v in case.get("outputs", {}).items()}
        decoded["config"] = case.get("config") or {}
        out.append(pytest.param(decoded, id=case["name"]))
    return out


def group_ids(index: list) -> torch.Tensor:
    """verl's per-row uid strings -> int64 group ids in order of first appearance."""
    seen: dict = {}
    return torch.tensor([seen.setdefault(u, len(seen)) for u in index], dtype=torch.int64)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4):
    torch.testing.assert_close(actual.to(expected.dtype), expected, atol=atol, rtol=rtol, equal_nan=True)
