"""Which attention backend kdtree composes with (its *base*), and how it is built.

kdtree serves TARGET_VERIFY; every other call goes to the base. The base is the one the user names with
`KDTREE_BASE_BACKEND` (any name in SGLang's backend registry: triton, flashinfer, fa3, intel_amx, torch_native,
...), else the one SGLang itself would pick for this model and platform had no backend been named.

SGLang's own pick is asked of SGLang: its resolution pipeline runs once more on a scratch copy of the launch
arguments with the three attention-backend fields unset, and the base is what it resolves `attention_backend`
to. `get_default_attn_backend` (arg_groups/model_override_base.py, called by `_attention_backend_default`) alone
is not that answer: before it runs, the platform hooks choose for the CPU (`handle_cpu_backends`: intel_amx, or
torch_native on arm64), HPU, NPU, MPS and XPU, model overrides choose for some architectures (gpt-oss, DeepSeek on
SM100, ...), and afterwards `_attention_backend_platform_fallbacks` turns intel_amx into torch_native on a CPU
without SGLang's AMX kernels. Re-running the pipeline keeps every one of those decisions SGLang's (measured: 3.5 ms
for the tiny CPU model, once per backend).

A named base is built as named, without SGLang's platform fallbacks: naming intel_amx on a CPU that SGLang would
hand torch_native gets intel_amx.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os

logger = logging.getLogger(__name__)

# True while SGLang's resolution pipeline runs on the scratch copy below: launch checks that judge the backends the
# user named (DDTREE's verify route) have nothing to judge there, the backend fields being unset on purpose.
_SCRATCH_RESOLUTION = contextvars.ContextVar("kdtree_scratch_resolution", default=False)


def in_scratch_resolution() -> bool:
    """Whether the arguments being resolved are kdtree's scratch copy (sglang_default_backend), not a launch's."""
    return _SCRATCH_RESOLUTION.get()


@contextlib.contextmanager
def _scratch_resolution():
    token = _SCRATCH_RESOLUTION.set(True)
    try:
        yield
    finally:
        _SCRATCH_RESOLUTION.reset(token)

BASE_ENV = "KDTREE_BASE_BACKEND"

# Registered backends whose forward_extend has no TARGET_VERIFY path in sglang 0.5.23: torch_native reads
# forward_batch.extend_prefix_lens, which a verify batch does not set (torch_native_backend.py:101), and
# flex_attention builds its masks from extend lengths the same way (torch_flex_backend.py:30-50).
BASES_WITHOUT_TARGET_VERIFY = frozenset({"torch_native", "flex_attention"})

_BACKEND_FIELDS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")
_OWN_NAMES = frozenset({"kdtree"})


def sglang_default_backend(server_args) -> str:
    """The attention backend SGLang resolves for these launch arguments when none is named.

    Raises when the arguments carry no raw input to re-resolve (a record never resolved), or when SGLang's
    default splits prefill and decode between two backends (a composition of its own; name one instead).
    """
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.server_args import ServerArgs

    raw = getattr(server_args, "_raw_input", None)
    if not raw:
        raise RuntimeError(
            f"kdtree attention backend: cannot ask SGLang for its default attention backend (the server arguments "
            f"carry no resolved launch input); set {BASE_ENV} to the backend kdtree should compose with")
    with _scratch_resolution():
        scratch = ServerArgs(**{**raw, **dict.fromkeys(_BACKEND_FIELDS)})
        scratch.resolve_once()
    backend, prefill, decode = (resolution_result(scratch, f) for f in _BACKEND_FIELDS)
    prefill, decode = prefill or backend, decode or backend
    if prefill != decode:
        raise RuntimeError(
            f"kdtree attention backend: SGLang's default for this model splits prefill ({prefill}) and decode "
            f"({decode}); set {BASE_ENV} to the one backend kdtree should compose with")
    return prefill


def base_backend_name(server_args) -> tuple[str, str]:
    """(name, where it came from): KDTREE_BASE_BACKEND when set, else SGLang's default for these arguments."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    named = os.environ.get(BASE_ENV, "").strip()
    name, source = (named, BASE_ENV) if named else (sglang_default_backend(server_args), "SGLang's default")
    if name in _OWN_NAMES:
        raise ValueError(f"{BASE_ENV}={name!r}: kdtree cannot be its own base backend (name triton, flashinfer, fa3, "
                         "intel_amx, torch_native, ...)")
    if name not in ATTENTION_BACKENDS:
        known = ", ".join(sorted(n for n in ATTENTION_BACKENDS if n not in _OWN_NAMES))
        raise ValueError(f"{source} base backend {name!r} is not a registered SGLang attention backend (known: {known})")
    return name, source


def build_base(model_runner, name: str):
    """Builds the base from SGLang's registry, stamped with its own name (model code dispatches on it)."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    base = ATTENTION_BACKENDS[name](model_runner)
    base.prefill_attention_backend_str = base.decode_attention_backend_str = name
    return base
