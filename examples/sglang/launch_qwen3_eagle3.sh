#!/usr/bin/env bash
# GQA target (Qwen3-8B) with an EAGLE3 draft tree (topk > 1), tree verification through the kdtree backend.
#
# - `--attention-backend kdtree` exists once the package is installed: SGLang's load_plugins() runs the
#   `kdtree` entry point in every process (server, schedulers, TP ranks).
# - The draft worker does not know `kdtree` (sglang 0.5.23's DRAFT_ATTENTION_BACKEND_CHOICES): name its
#   backend explicitly, or it falls back to flashinfer with a warning.
# - EAGLE with topk > 1 and page_size > 1 is limited by sglang to flashinfer/fa3/triton: keep --page-size 1.
# - KDTREE_VERIFY=off|validate|on (default on); see README.md next to this file.
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen3-8B}
DRAFT=${DRAFT:-Tengyunw/qwen3_8b_eagle3}

KDTREE_VERIFY=${KDTREE_VERIFY:-on} python -m sglang.launch_server \
  --model-path "$MODEL" \
  --attention-backend kdtree \
  --speculative-algorithm EAGLE3 \
  --speculative-draft-model-path "$DRAFT" \
  --speculative-num-steps 6 \
  --speculative-eagle-topk 8 \
  --speculative-num-draft-tokens 64 \
  --speculative-draft-attention-backend triton \
  --page-size 1 \
  --mem-fraction-static 0.8 \
  --host 0.0.0.0 --port "${PORT:-30000}" \
  "$@"
