#!/usr/bin/env bash
# GQA target (Qwen3-8B) with a DFLASH block draft, verified by the kdtree backend.
#
# - DFLASH (sglang 0.5.23) verifies its block in causal order and picks whether to build a dense custom mask
#   by the attention backend's *class name* (speculative/dflash_utils.py). The kdtree plugin registers a
#   HookRegistry hook so KDTreeAttnBackend gets its base backend's policy (the op reads the block either way):
#   nothing to pass. The base: SGLang's default, or KDTREE_BASE_BACKEND.
#   The server log shows "Applied 1 hook(s) to ...resolve_dflash_verify_mask_policy (from: plugin=kdtree ...)".
# - The draft worker needs a backend it knows: --speculative-draft-attention-backend triton (or flashinfer).
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen3-8B}
DRAFT=${DRAFT:-z-lab/Qwen3-8B-DFlash-b16}

KDTREE_VERIFY=${KDTREE_VERIFY:-on} python -m sglang.launch_server \
  --model-path "$MODEL" \
  --attention-backend kdtree \
  --speculative-algorithm DFLASH \
  --speculative-draft-model-path "$DRAFT" \
  --speculative-dflash-block-size 16 \
  --speculative-draft-attention-backend triton \
  --mem-fraction-static 0.8 \
  --host 0.0.0.0 --port "${PORT:-30000}" \
  "$@"
