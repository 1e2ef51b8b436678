"""DDTree speculative decoding on the device: the round's ops and the pieces built on them.

- `ops`: typed wrappers and fakes of ddtree_build_tree, ddtree_accept_greedy, ddtree_commit_kv (schemas in
  csrc/ops.cpp), re-exported here;
- `reference`: their pure-Python references (heap and brute-force tree builds, greedy walk, commit);
- `loop`: one DDTree round end to end on a toy target (draft, build, verify, accept, commit), capturable as
  one CUDA graph;
- the SGLang speculative worker lives with the SGLang integration (kdtree_ops/sglang/).
"""

from .ops import accept_greedy, accepted_slots, build_tree, build_tree_shapes, commit_kv, mask_words

__all__ = ["build_tree", "accept_greedy", "commit_kv", "accepted_slots", "build_tree_shapes", "mask_words"]
