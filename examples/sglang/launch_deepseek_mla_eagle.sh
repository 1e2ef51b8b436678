#!/usr/bin/env bash
# MLA target (DeepSeek-V3 / Kimi-K2 architecture) with EAGLE (MTP / NextN) draft trees, verified by the kdtree
# backend (q [N, H, 576] against the latent cache [S, 1, 576] with its value view [..., :512]).
#
# - kdtree composes with a base backend: SGLang's own default for the model (fa3 on Hopper), or the one named
#   by KDTREE_BASE_BACKEND. fa3 has not run under kdtree yet (it cannot load on the lent H200); triton is the
#   base the GPU suite verifies, so this recipe names it. DeepSeek's dispatcher sees the base's name; the op
#   takes MLA's queries whole (triton) or with the rope part apart (fa3/flashinfer).
# - --speculative-draft-attention-backend triton: the draft worker does not know `kdtree`.
# - Keep --page-size 1 with topk > 1 (sglang restricts paged trees to flashinfer/fa3/triton).
# - fp8 KV caches (--kv-cache-dtype fp8_e4m3) go to the base layer by layer until the op's CUDA fp8 kernels are
#   verified (one WARNING line says so).
set -euo pipefail
MODEL=${MODEL:-deepseek-ai/DeepSeek-V3}   # or moonshotai/Kimi-K2-Instruct (add --trust-remote-code)
TP=${TP:-8}

KDTREE_BASE_BACKEND=${KDTREE_BASE_BACKEND:-triton} KDTREE_VERIFY=${KDTREE_VERIFY:-on} python -m sglang.launch_server \
  --model-path "$MODEL" \
  --tp-size "$TP" \
  --trust-remote-code \
  --attention-backend kdtree \
  --speculative-algorithm EAGLE \
  --speculative-num-steps 3 \
  --speculative-eagle-topk 4 \
  --speculative-num-draft-tokens 16 \
  --speculative-draft-attention-backend triton \
  --page-size 1 \
  --mem-fraction-static 0.85 \
  --host 0.0.0.0 --port "${PORT:-30000}" \
  "$@"
