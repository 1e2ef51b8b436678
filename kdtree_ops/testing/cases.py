"""Random inputs of tree_verify_attention: the one generator the tests, the demo and the benchmark share.

`make_verify_case` builds a batch of requests with random best-first trees (`trees.random_tree`), committed
prefixes stored in fragmented cache slots (a random sample of a pool bigger than needed, no slot shared
between requests), and caches in one of three layouts:

- "contiguous": k_cache [S, Hkv, Dqk] and v_cache [S, Hkv, Dv], plain tensors;
- "strided": q, k_cache, v_cache and tree_mask are views into bigger buffers (padding after each head
  and row, holding NaN; v_cache's heads interleaved with unused ones), as real KV pools and graph buffers are;
- "mla": one latent cache (Hkv must be 1): k_cache [S, 1, Dqk] and v_cache = k_cache[..., :Dv], an alias.

Values are standard normal, drawn in float32 and then cast, so the reference sees exactly the kernel's
inputs; with sm_scale = 1/sqrt(Dqk) the scores have unit variance and the softmax is neither flat nor one-hot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from .. import shapes
from .trees import ancestor_mask, random_tree

__all__ = ["VerifyCase", "make_verify_case"]


@dataclass
class VerifyCase:
    """One call's inputs of tree_verify_attention (argument shapes as in `kdtree_ops.ops`)."""

    q: torch.Tensor  # [N, Hq, Dqk]
    k_cache: torch.Tensor  # [S, Hkv, Dqk]
    v_cache: torch.Tensor  # [S, Hkv, Dv] (an alias of k_cache for layout="mla")
    qo_indptr: torch.Tensor  # [B+1] int32
    kv_indptr: torch.Tensor  # [B+1] int32
    kv_indices: torch.Tensor  # [>= kv_indptr[B]] int32 | int64
    tree_mask: torch.Tensor  # [N, W] int32
    sm_scale: float
    logit_cap: float
    k_draft: torch.Tensor | None  # [N, Hkv, Dqk] for draft_mode="separate"
    v_draft: torch.Tensor | None  # [N, Hkv, Dv]
    parents: torch.Tensor  # [N] int32, within-request parent index, -1 root (padding rows: -1)
    tree_sizes: list[int]
    prefix_lens: list[int]
    k_scale: float = 1.0  # an fp8 k_cache's key = stored value x k_scale
    v_scale: float = 1.0

    def args(self) -> tuple:
        """Positional arguments of tree_verify_attention in schema order, up to v_draft (the scales keep their
        defaults: use `scaled_args` for a case with scales)."""
        return (self.q, self.k_cache, self.v_cache, self.qo_indptr, self.kv_indptr, self.kv_indices,
                self.tree_mask, self.sm_scale, self.logit_cap, self.k_draft, self.v_draft)

    def scaled_args(self) -> tuple:
        """`args()` followed by k_scale and v_scale: every positional argument of tree_verify_attention."""
        return self.args() + (self.k_scale, self.v_scale)

    def to(self, device) -> "VerifyCase":
        """The same case on `device`, keeping every view's strides and every alias (k_cache/v_cache)."""
        moved: dict[int, torch.Tensor] = {}

        def move(t):
            if not isinstance(t, torch.Tensor):
                return t
            base = t if t._base is None else t._base
            key = id(base)
            if key not in moved:
                moved[key] = base.to(device)
            new_base = moved[key]
            return new_base.as_strided(t.shape, t.stride(), t.storage_offset() - base.storage_offset()
                                       + new_base.storage_offset())

        return VerifyCase(**{f.name: move(getattr(self, f.name)) for f in fields(self)})


def _poison(dtype: torch.dtype):
    """What unused buffer entries hold: NaN (floats) or all bits set (ints), so a stray read shows."""
    return float("nan") if dtype.is_floating_point else -1


def _padded(values: torch.Tensor, pad: int) -> torch.Tensor:
    """`values` ([..., D]) as a view into a buffer with `pad` poisoned entries after every last-dim row."""
    buf = torch.full((*values.shape[:-1], values.shape[-1] + pad), _poison(values.dtype), dtype=values.dtype)
    buf[..., : values.shape[-1]] = values
    return buf[..., : values.shape[-1]]


def make_verify_case(
    *,
    tree_sizes: list[int],
    prefix_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim_qk: int,
    head_dim_v: int,
    dtype: torch.dtype = torch.float32,
    kv_dtype: torch.dtype | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    device="cpu",
    draft_mode: str = "cache",
    layout: str = "contiguous",
    index_dtype: torch.dtype = torch.int32,
    logit_cap: float = 0.0,
    pad_rows: int = 0,
    extra_slots: int = 0,
    mask_words: int | None = None,
    max_depth: int | None = None,
    generator: torch.Generator | None = None,
) -> VerifyCase:
    """A random batch of tree-verify inputs.

    Args:
        tree_sizes: T_b per request (0 allowed; <= 1024).
        prefix_lens: L_b per request (committed prefix length; 0 allowed).
        num_q_heads, num_kv_heads: Hq, Hkv (Hq % Hkv == 0).
        head_dim_qk, head_dim_v: Dqk, Dv (Dv <= Dqk for layout="mla").
        dtype: of q and draft K/V, and of the caches unless kv_dtype is given.
        kv_dtype: of k_cache/v_cache (default: dtype); float8_e4m3fn or float8_e5m2 for an fp8 KV cache.
        k_scale, v_scale: the caches hold the random keys/values divided by these scales (clamped to kv_dtype's
            range, then cast): the key/value is stored value x scale. layout="mla" stores the latent with k_scale.
        device: where the case lives (built on the CPU, then moved with `VerifyCase.to`).
        draft_mode: "cache" — the draft tokens' K/V are the last T_b slots of each request;
            "separate" — they are rows of k_draft/v_draft and the slots hold the prefix only.
        layout: "contiguous" | "strided" | "mla" (see the module docstring).
        index_dtype: dtype of kv_indices (int32 or int64).
        logit_cap: passed through (0 disables).
        pad_rows: query rows after qo_indptr[B] (graph padding; random q, junk mask bits, parent -1).
        extra_slots: junk (in-range) entries of kv_indices after kv_indptr[B].
        mask_words: W (default ceil(max T_b / 32), at least 1; must hold the largest tree).
        max_depth: depth limit of the random trees (None: unlimited).
        generator: torch RNG (default: seeded with 0).
    """
    if len(tree_sizes) != len(prefix_lens):
        raise ValueError("make_verify_case: tree_sizes and prefix_lens need one entry per request")
    if draft_mode not in ("cache", "separate"):
        raise ValueError(f"make_verify_case: draft_mode must be 'cache' or 'separate', got {draft_mode!r}")
    if layout not in ("contiguous", "strided", "mla"):
        raise ValueError(f"make_verify_case: layout must be 'contiguous', 'strided' or 'mla', got {layout!r}")
    if layout == "mla" and (num_kv_heads != 1 or head_dim_v > head_dim_qk):
        raise ValueError("make_verify_case: layout='mla' needs num_kv_heads == 1 and head_dim_v <= head_dim_qk")
    if num_q_heads % num_kv_heads:
        raise ValueError("make_verify_case: num_q_heads must be a multiple of num_kv_heads")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    max_tree = max(tree_sizes, default=0)
    words = shapes.mask_words(max_tree) if mask_words is None else mask_words
    if 32 * words < max_tree:
        raise ValueError(f"make_verify_case: mask_words={words} cannot hold a tree of {max_tree} tokens")

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)

    cache_dtype = dtype if kv_dtype is None else kv_dtype
    cache_max = torch.finfo(cache_dtype).max

    def cache_randn(*shape, scale):
        # The same draws as randn; stored = value / scale (x / 1.0 is x: unscaled caches are as before).
        values = torch.randn(*shape, generator=gen, dtype=torch.float32) / scale
        return values.clamp(-cache_max, cache_max).to(cache_dtype)

    batch = len(tree_sizes)
    num_real = sum(tree_sizes)
    n = num_real + pad_rows
    qo_indptr = torch.tensor([0] + list(_cumsum(tree_sizes)), dtype=torch.int32)

    # Trees, their packed masks and parents; padding rows carry junk mask bits the op must ignore.
    parents = torch.full((n,), -1, dtype=torch.int32)
    tree_mask = torch.zeros(n, words, dtype=torch.int32)
    for b, t in enumerate(tree_sizes):
        tree = random_tree(t, max_depth=max_depth, generator=gen)
        lo = int(qo_indptr[b])
        parents[lo : lo + t] = torch.tensor(tree, dtype=torch.int32)
        if t:
            tree_mask[lo : lo + t] = ancestor_mask(tree, words)
    if pad_rows:
        tree_mask[num_real:] = torch.randint(-(2**31), 2**31 - 1, (pad_rows, words), generator=gen,
                                             dtype=torch.int64).to(torch.int32)

    # Fragmented slots: a random sample of a pool ~1.5x the need, split between requests.
    slots_per_request = [lp + (t if draft_mode == "cache" else 0) for t, lp in zip(tree_sizes, prefix_lens)]
    needed = sum(slots_per_request)
    pool = needed + max(4, needed // 2)
    chosen = torch.randperm(pool, generator=gen)[:needed]
    junk = torch.randint(0, pool, (extra_slots,), generator=gen)
    kv_indices = torch.cat([chosen, junk]).to(index_dtype)
    kv_indptr = torch.tensor([0] + list(_cumsum(slots_per_request)), dtype=torch.int32)

    q = randn(n, num_q_heads, head_dim_qk)
    k_values = cache_randn(pool, num_kv_heads, head_dim_qk, scale=k_scale)
    if layout == "mla":
        k_cache = k_values
        v_cache = k_cache[..., :head_dim_v]
    elif layout == "strided":
        q = _padded(q, 8)
        k_cache = _padded(k_values, 8)  # head stride Dqk + 8
        # Heads interleaved with unused ones, as a pool holding two caches head by head: head stride 2 (Dv + 4).
        v_buf = torch.full((pool, 2 * num_kv_heads, head_dim_v + 4), _poison(cache_dtype), dtype=cache_dtype)
        v_cache = v_buf[:, ::2, :head_dim_v]
        v_cache.copy_(cache_randn(pool, num_kv_heads, head_dim_v, scale=v_scale))
        tree_mask = _padded(tree_mask, 3)
    else:
        k_cache = k_values
        v_cache = cache_randn(pool, num_kv_heads, head_dim_v, scale=v_scale)

    k_draft = v_draft = None
    if draft_mode == "separate":
        k_draft = randn(n, num_kv_heads, head_dim_qk)
        v_draft = k_draft[..., :head_dim_v] if layout == "mla" else randn(n, num_kv_heads, head_dim_v)

    case = VerifyCase(
        q=q, k_cache=k_cache, v_cache=v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
        tree_mask=tree_mask, sm_scale=1.0 / math.sqrt(head_dim_qk), logit_cap=float(logit_cap),
        k_draft=k_draft, v_draft=v_draft, parents=parents, tree_sizes=list(tree_sizes),
        prefix_lens=list(prefix_lens), k_scale=float(k_scale), v_scale=float(v_scale),
    )
    return case if torch.device(device).type == "cpu" else case.to(device)


def _cumsum(values):
    total = 0
    for v in values:
        total += v
        yield total
