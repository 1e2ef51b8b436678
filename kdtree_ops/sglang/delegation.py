"""How KDTreeAttnBackend hands everything but TARGET_VERIFY to its base backend.

SGLang composes backends by holding them (HybridAttnBackend, TboAttnBackend): the wrapper answers for the
members callers use and forwards each to the backend that does the work. kdtree holds one base and forwards
*every* member it does not define itself, because SGLang's callers read many (runners, workers, model code:
`forward_metadata`, `kv_indptr`, `init_cpu_graph_state`, ...), and the set grows with
each release:

- members declared on `AttentionBackend` (class-level defaults, methods such as `shared_read_ends`) become
  properties reading and writing the base's, since the class default would otherwise answer in the base's place
  (`needs_cpu_seq_lens` among them: kdtree's verify metadata sizes its gather by a host bound that needs no host
  lengths, verify_metadata.host_length_bound, so the base decides);
- everything else the base has (its own attributes and methods) is reached through `__getattr__`.

The names of the backend (`prefill_attention_backend_str`/`decode_attention_backend_str`) answer the base's:
SGLang stamps the wrapper "kdtree" after building it, but model code picks its attention method by these names
(DeepSeek's dispatcher: absorbed MLA for triton, split rope inputs for fa3/flashinfer, ...), and every call but
the op's runs the base's kernels; the op takes either input form.
"""

from __future__ import annotations

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

_STAMPS = ("prefill_attention_backend_str", "decode_attention_backend_str")


def _forwarded(name: str) -> property:
    def get(self):
        return getattr(self.base, name)

    def set_(self, value):
        setattr(self.base, name, value)

    return property(get, set_, doc=f"The base backend's `{name}`.")


def _stamp(name: str) -> property:
    def get(self):
        return getattr(self.base, name)

    def set_(self, value):  # SGLang's stamp of the wrapper ("kdtree"): kept, not answered
        self.__dict__[f"_sglang_{name}"] = value

    return property(get, set_, doc=f"The base backend's `{name}` (see kdtree_ops/sglang/delegation.py).")


def forward_to_base(cls: type) -> type:
    """Class decorator: every `AttentionBackend` member `cls` does not define reads its base's (`self.base`)."""
    for name in vars(AttentionBackend):
        if name.startswith("__") or name == "_abc_impl" or name in vars(cls):
            continue
        setattr(cls, name, _stamp(name) if name in _STAMPS else _forwarded(name))
    return cls


class BaseAttributes:
    """Mixin: attributes the wrapper lacks are the base's (its own attributes and methods)."""

    def __getattr__(self, name: str):
        base = self.__dict__.get("base")
        if base is None:  # during __init__, before the base exists
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(base, name)
