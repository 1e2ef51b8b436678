"""kdtree_ops: tree speculative-decoding verify attention as PyTorch custom ops.

`import kdtree_ops` is cheap (the SGLang plugin imports it in every process); the ops library is built and
loaded on first use of an op through this module, or by `import kdtree_ops.ops`.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_OPS = (
    "tree_verify_attention",
    "tree_verify_attention_out",
    "tree_mask_from_parents",
    "tree_mask_from_dense",
    "record_divergence",
)
__all__ = list(_OPS)


def __getattr__(name: str):
    if name in _OPS:
        ops = importlib.import_module(".ops", __name__)
        globals().update({op: getattr(ops, op) for op in _OPS})  # later lookups skip this hook
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
