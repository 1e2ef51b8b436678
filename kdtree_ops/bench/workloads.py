"""The benchmark workloads of DESIGN.md (H200, bf16): G1–G5 GQA/MHA, M1–M5 absorbed MLA.

Every request of a workload has the same tree size T and prefix length L; trees are random best-first
(DDTree-like, `kdtree_ops.testing.trees.random_tree`) and prefix slots are a random sample of a larger pool
(fragmented), both from `kdtree_ops.testing.cases.make_verify_case`. The draft tokens' K/V are passed separately
(`draft_mode="separate"`), as SGLang's Triton backend passes them in TARGET_VERIFY.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Workload", "WORKLOADS", "select", "FP8_SCALE"]

# The fp8 column's cache scale: unit-variance values stored at up to ~20 (e4m3 holds 448), not a power of two, so
# that the kernels' multiply by it rounds as a checkpoint's scale would.
FP8_SCALE = 0.23


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # "GQA" | "MLA"
    num_q_heads: int  # Hq
    num_kv_heads: int  # Hkv
    head_dim_qk: int  # Dqk
    head_dim_v: int  # Dv
    batch: int  # B
    tree: int  # T: draft tokens per request
    prefix: int  # L: committed prefix per request

    @property
    def shape(self) -> str:
        return (f"{self.kind} {self.num_q_heads}/{self.num_kv_heads} {self.head_dim_qk}/{self.head_dim_v} "
                f"B={self.batch} T={self.tree} L={self.prefix}")

    def case(self, *, device="cuda", dtype=torch.bfloat16, seed: int = 0, kv_dtype=None):
        """The workload's inputs as a `kdtree_ops.testing.cases.VerifyCase` (built on the CPU, moved to `device`).

        kv_dtype: an fp8 dtype for the fp8 column (the caches hold the values over FP8_SCALE, times it when
        read; one scale for K and V, as SGLang's MLA pools have); None: caches in `dtype`."""
        from ..testing.cases import make_verify_case

        scale = FP8_SCALE if kv_dtype is not None else 1.0

        return make_verify_case(
            tree_sizes=[self.tree] * self.batch,
            prefix_lens=[self.prefix] * self.batch,
            num_q_heads=self.num_q_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim_qk=self.head_dim_qk,
            head_dim_v=self.head_dim_v,
            dtype=dtype,
            device=device,
            draft_mode="separate",
            layout="mla" if self.kind == "MLA" else "contiguous",
            generator=torch.Generator().manual_seed(seed),
            kv_dtype=kv_dtype,
            k_scale=scale,
            v_scale=scale,
        )


def _gqa(name, batch, tree, prefix):
    return Workload(name, "GQA", 32, 8, 128, 128, batch, tree, prefix)


def _mla(name, heads, batch, tree, prefix):
    return Workload(name, "MLA", heads, 1, 576, 512, batch, tree, prefix)


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    _gqa("G1", 1, 64, 4096),
    _gqa("G2", 1, 64, 32768),
    _gqa("G3", 8, 32, 8192),
    _gqa("G4", 32, 16, 2048),
    _gqa("G5", 1, 256, 8192),
    _mla("M1", 16, 1, 64, 4096),
    _mla("M2", 16, 1, 64, 32768),
    _mla("M3", 16, 8, 32, 8192),
    _mla("M4", 8, 32, 16, 2048),
    _mla("M5", 128, 1, 64, 8192),
)}


def select(only: str | None) -> list[Workload]:
    """Workloads named in a comma-separated list (all when None/empty), in table order."""
    if not only:
        return list(WORKLOADS.values())
    names = [n.strip().upper() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")
    return [w for w in WORKLOADS.values() if w.name in names]
