"""Which files of examples/ are model files (`cgc compile FILE` takes them as they are): a
top-level ``build_dag()`` callable without arguments. The others are helper modules the
model files import (tinygpt.py, ...) or Ray programs run as scripts (ray_llm_decode.py)."""

from __future__ import annotations

import ast
from pathlib import Path


def model_files(folder: Path) -> list[Path]:
    """The model files in ``folder``, sorted by name."""
    out = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name == "build_dag":
                a = node.args
                if len(a.defaults) == len(a.posonlyargs) + len(a.args) and \
                        all(d is not None for d in a.kw_defaults):
                    out.append(path)
    return out
