"""DDTree speculative decoding on the device: the round's ops and the pieces built on them.

- `ops`: typed wrappers and fakes of ddtree_build_tree, ddtree_accept_greedy, ddtree_commit_kv (schemas in
  csrc/ops.cpp), and the round's pieces every caller shares (commit_kv_layers: the commit over a cache's layers;
  accepted_slots; emitted_tokens: the accepted drafts then the bonus token), re-exported here;
- `sampling`: sample_targets (ddtree_sample_targets) and SamplingParams: the target's token after every node at
  temperature > 0 with SGLang's filters and position-keyed noise, which accept_greedy then walks (lossless);
  target_tokens: that draw or the argmax, the one choice the loop and the SGLang worker share;
- `reference`: their pure-Python references (heap and brute-force tree builds, greedy walk, commit);
  `sampling_reference`: the sampled draw's, op for op;
- `loop`: one DDTree round end to end on a toy target (draft, build, verify, accept, commit), capturable as
  one CUDA graph;
- the SGLang speculative worker (`--speculative-algorithm DDTREE`) lives with the SGLang integration:
  kdtree_ops/sglang/ddtree_worker.py (its DFlash drafter: dflash_drafter.py).
"""

from .ops import (accept_greedy, accepted_slots, build_tree, build_tree_shapes, commit_kv, commit_kv_layers,
                  emitted_tokens, mask_words, values_view_keys)
from .sampling import SamplingParams, sample_targets, target_tokens

__all__ = ["build_tree", "accept_greedy", "commit_kv", "commit_kv_layers", "values_view_keys", "accepted_slots",
           "emitted_tokens", "build_tree_shapes", "mask_words", "sample_targets", "target_tokens", "SamplingParams"]
