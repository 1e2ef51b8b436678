"""The binary wheel's prebuilt library: where it lies, and whether it was built for this torch and these sources.

A binary wheel (`python -m kdtree_ops build --wheel`, wheel.py) carries one build of csrc/ in kdtree_ops/_prebuilt/:
the library and its manifest, build.json, as the JIT cache writes it (CUDA targets, torch, CUDA, sources key). The
loader (build.py, `_load_built`) takes it before any cached build when `mismatch` finds nothing and its targets
serve this machine (the same test as for a cached build); otherwise it names the reason in one line and the JIT
build takes over. A source checkout has no _prebuilt/ folder: it always builds JIT.

The rule: a C++ extension runs only with the torch it was compiled against (its ABI is torch's C++ classes), so the
library serves exactly the torch build it was made with: the same `torch.__version__`, local label included
(2.14.1+cu130 and 2.14.1+cpu are different libraries to link against), and the same `torch.version.cuda`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

PREBUILT_DIR = Path(__file__).resolve().parent / "_prebuilt"
MANIFEST = "build.json"


def shipped() -> tuple[Path, dict] | None:
    """(library, manifest) of the wheel's prebuilt library; None where there is none (a source install).
    An unreadable manifest gives {} (mismatch says so)."""
    manifest = PREBUILT_DIR / MANIFEST
    if not manifest.exists():
        return None
    try:
        meta = json.loads(manifest.read_text())
    except (OSError, ValueError):
        meta = {}
    return PREBUILT_DIR / str(meta.get("library", "")), meta


def torch_build() -> dict:
    """The torch a library built now is for: what a manifest records and what `mismatch` compares."""
    return {"torch": torch.__version__, "cuda": torch.version.cuda}


def mismatch(meta: dict, source_key: str) -> str:
    """Why the prebuilt library may not serve this process ("" when it may): another torch, other sources
    (`source_key`: build.py's digest of this installation's csrc/ and torch), or a missing library file."""
    if not meta.get("library"):
        return f"its manifest {PREBUILT_DIR / MANIFEST} cannot be read"
    built, here = {k: meta.get(k) for k in torch_build()}, torch_build()
    if built != here:
        return (f"it was built against torch {built['torch']} (CUDA {built['cuda'] or 'none'}) and this process "
                f"runs torch {here['torch']} (CUDA {here['cuda'] or 'none'}); a C++ extension runs only with the "
                "torch it was compiled against (install the wheel built for this torch)")
    if meta.get("source_key") != source_key:
        return "it was built from other sources than this installation's kdtree_ops/_csrc"
    if not (PREBUILT_DIR / meta["library"]).is_file():
        return f"its library {PREBUILT_DIR / meta['library']} is missing"
    return ""


def describe(meta: dict) -> str:
    """"sm_80, sm_90a, sm_120; torch 2.14.1+cu130" or "CPU only; torch ...": what a prebuilt library holds."""
    archs = meta.get("archs") or []
    targets = "sm_" + ", sm_".join(sorted(archs, key=lambda t: (int(t.rstrip("af")), t))) if archs else "CPU only"
    return f"{targets}; torch {meta.get('torch', '?')}"
