"""Preloaded by fresh_process.py's case server (a multiprocessing forkserver) before it forks a process per case.

Imports torch and the kdtree library once, and never initializes CUDA (a process forked after CUDA initialization
cannot use CUDA): `import kdtree_ops` loads a cached build through NVML, without a CUDA context; only then are the
typed wrappers imported, which would otherwise build (and ask the CUDA runtime for the GPUs).
"""

import torch

import kdtree_ops
from kdtree_ops import build

if build._loaded_library is not None:
    import kdtree_ops.ddtree  # noqa: F401  (no build, no CUDA: the library is loaded)
    import kdtree_ops.ops  # noqa: F401

assert not torch.cuda.is_initialized(), "the case server must not initialize CUDA"
