"""kdtree_ops: tree speculative-decoding verify attention as PyTorch custom ops.

`import kdtree_ops` registers `torch.ops.kdtree.*` when a binary wheel's prebuilt library serves this machine or a
complete build for it is already cached (a dlopen, no compiling, no CUDA initialization), and otherwise stays cheap: the SGLang plugin imports this package
in every process; `torch.ops.kdtree.<op>` then raises an AttributeError that says to call `kdtree_ops.load()`.
`kdtree_ops.load()` builds when needed and registers the ops; `import kdtree_ops.ops` (the typed wrappers and
fakes) calls it, and so does the first use of an op through this module.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from . import build

__version__ = "0.1.0"

_OPS = (
    "tree_verify_attention",
    "tree_verify_attention_out",
    "tree_mask_from_parents",
    "tree_mask_from_dense",
    "record_divergence",
)
__all__ = ["load", *_OPS]


def load(archs: list[str] | None = None) -> Path:
    """Builds the ops library if neither a binary wheel's prebuilt library nor a cached build serves this machine,
    loads it and registers `torch.ops.kdtree.*`.

    archs: CUDA targets to build for (e.g. ["80", "90a", "120"]) instead of KDTREE_OPS_CUDA_ARCHS, PyTorch's
    TORCH_CUDA_ARCH_LIST or the visible GPUs. Returns the library's path; later calls return it at once.
    """
    library = build.load(archs=archs)
    importlib.import_module(".ops", __name__)  # the fakes (register_fake) belong with the schemas
    return library


def __getattr__(name: str):
    if name in _OPS:
        ops = importlib.import_module(".ops", __name__)
        globals().update({op: getattr(ops, op) for op in _OPS})  # later lookups skip this hook
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _hint_unloaded_ops() -> None:
    """`torch.ops.kdtree.<op>` before the library is loaded raises an AttributeError that says how to load it.

    The schemas live in the C++ library (csrc/ops.cpp), so nothing can be registered before it is loaded; the
    namespace object torch creates for `torch.ops.kdtree` gets a subclass whose failed lookups, while no build is
    loaded in this process, name the fix. After `load()` lookups are torch's own.
    """
    import torch
    from torch._ops import _OpNamespace

    class KdtreeOpNamespace(_OpNamespace):
        # torch names each op's module after the namespace class's (`torch._ops.kdtree`), and Inductor imports ops
        # by that name when it writes a compiled graph: keep torch's.
        __module__ = _OpNamespace.__module__

        def __getattr__(self, op_name: str):
            try:
                return super().__getattr__(op_name)
            except AttributeError as exc:
                if op_name.startswith("__") or build._loaded_library is not None:
                    raise
                raise AttributeError(
                    f"torch.ops.kdtree.{op_name}: the kdtree ops library is not loaded in this process. Call "
                    "kdtree_ops.load() first (it compiles csrc/ on first use, about a minute on a few cores, and "
                    "registers torch.ops.kdtree.*), or import kdtree_ops.ops") from exc

    namespace = torch.ops.kdtree  # torch creates it on first access
    if type(namespace) is _OpNamespace:
        namespace.__class__ = KdtreeOpNamespace


_hint_unloaded_ops()

try:
    if build.load_cached() is not None:
        importlib.import_module(".ops", __name__)  # the fakes belong with the schemas (a cheap import now)
except Exception as exc:  # a broken cache entry must not break `import kdtree_ops`; load() rebuilds or says why
    import sys

    print(f"kdtree_ops: the prebuilt or cached build could not be loaded ({type(exc).__name__}: {exc})",
          file=sys.stderr)
