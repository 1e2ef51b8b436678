"""Benchmark of tree_verify_attention on the GPU: DESIGN.md's workloads G1–G5 (GQA) and M1–M5 (MLA), timed
as medians of CUDA-graph replays side by side with SGLang's Triton extend kernel and torch SDPA, against a
floor from copy bandwidth and bf16 matmul rate measured in the same run.

Entry: `python -m kdtree_ops.bench [--only G1,M3] [--out DIR]` (or `cli.main(argv)`). Submodules import
torch only; CUDA, sglang and matplotlib are touched when a benchmark runs, never at import.
"""
