"""DDTREE's node budget against what its drafter can fill, checked at launch.

A tree's N - 1 draft nodes (N = --speculative-num-draft-tokens) are distinct paths over the drafter's K = block_size
- 1 positions with k = KDTREE_DDTREE_TOPK candidates each: at most sum_{d=1..K} k^d exist, and ddtree_build_tree
refuses a larger budget. Before the launch check, such a launch (KDTREE_DDTREE_TOPK=1, N = 16, block 8) started and
the engine died in its first round; now SGLang's server-args resolution refuses it in the launching process, before
any model loads (ddtree_algorithm.resolve_ddtree_server_args; the engine test: test_sglang_ddtree_engine.py,
`unfillable-budget`). Here: the bound (`build_tree_path_count`, the Python twin of the op's saturating count) against
a brute-force sum and against the op's own check, and the refusal's numbers (its fixes fill; one step short does not).
"""

from __future__ import annotations

import re

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from kdtree_ops.shapes import INT64_MAX, build_tree_path_count  # noqa: E402
from kdtree_ops.sglang.ddtree_algorithm import check_node_budget  # noqa: E402


@pytest.mark.parametrize("positions", range(0, 7))
@pytest.mark.parametrize("top_k", range(0, 6))
def test_path_count_is_the_sum_of_powers(positions, top_k):
    assert build_tree_path_count(positions, top_k) == sum(top_k**d for d in range(1, positions + 1))


@pytest.mark.parametrize("positions, top_k", [(15, 2**20), (1023, 128256), (64, 2), (10**6, 10**6)])
def test_path_count_saturates_at_int64_max(positions, top_k):
    exact = None if positions > 100 else sum(top_k**d for d in range(1, positions + 1))
    got = build_tree_path_count(positions, top_k)
    assert got == (INT64_MAX if exact is None or exact > INT64_MAX else exact) == INT64_MAX


def test_path_count_just_below_saturation_is_exact():
    exact = sum(2**d for d in range(1, 62))  # 2^62 - 2 < 2^63 - 1
    assert build_tree_path_count(61, 2) == exact


@pytest.mark.parametrize("positions, top_k", [(1, 1), (3, 1), (2, 3), (3, 2), (4, 2)])
def test_path_count_is_the_op_s_bound(ops, positions, top_k):
    """The largest budget ddtree_build_tree takes for [B, K, k] candidates is build_tree_path_count(K, k)."""
    from kdtree_ops import ddtree

    logprobs = torch.log_softmax(torch.randn(2, positions, top_k + 3), -1).topk(top_k, -1).values.contiguous()
    tokens = torch.randint(0, 50, (2, positions, top_k))
    roots = torch.randint(0, 50, (2,))
    paths = build_tree_path_count(positions, top_k)
    tree_tokens = ddtree.build_tree(logprobs, tokens, roots, paths)[0]
    assert tree_tokens.shape == (2, paths + 1)
    with pytest.raises(RuntimeError, match=re.escape(f"sum_{{d=1..K}} k^d = {paths}]")):
        ddtree.build_tree(logprobs, tokens, roots, paths + 1)


def fills(num_draft_tokens: int, topk: int, block_size: int) -> bool:
    try:
        check_node_budget(num_draft_tokens, topk, block_size)
    except ValueError:
        return False
    return True


GRID = [(n, k, block) for n in (2, 3, 8, 9, 16, 64, 255, 256, 1024) for k in (1, 2, 3, 8) for block in (2, 3, 8, 16)]


@pytest.mark.parametrize("num_draft_tokens, topk, block_size", GRID)
def test_the_budget_is_refused_exactly_when_the_drafter_cannot_fill_it(num_draft_tokens, topk, block_size):
    paths = sum(topk**d for d in range(1, block_size))
    assert fills(num_draft_tokens, topk, block_size) == (num_draft_tokens - 1 <= paths)


@pytest.mark.parametrize("num_draft_tokens, topk, block_size", [c for c in GRID if not fills(*c)])
def test_the_refusal_names_both_settings_and_fixes_that_fill(num_draft_tokens, topk, block_size):
    with pytest.raises(ValueError) as info:
        check_node_budget(num_draft_tokens, topk, block_size)
    message = str(info.value)
    assert f"--speculative-num-draft-tokens {num_draft_tokens} " in message
    assert f"KDTREE_DDTREE_TOPK={topk} " in message and f"block_size {block_size}" in message
    fix = re.search(r"fix: --speculative-num-draft-tokens <= (\d+), or KDTREE_DDTREE_TOPK >= (\d+)$", message)
    assert fix, message
    largest_n, smallest_k = map(int, fix.groups())
    assert fills(largest_n, topk, block_size) and not fills(largest_n + 1, topk, block_size)
    assert fills(num_draft_tokens, smallest_k, block_size) and not fills(num_draft_tokens, smallest_k - 1, block_size)


def test_the_issue_s_case():
    """KDTREE_DDTREE_TOPK=1, N = 16, block 8: a chain of 7 drafts cannot hold 15 nodes."""
    with pytest.raises(ValueError, match=r"only 7 paths .*fix: --speculative-num-draft-tokens <= 8, or "
                                         r"KDTREE_DDTREE_TOPK >= 2"):
        check_node_budget(16, 1, 8)


def test_sglang_s_resolution_refuses_the_launch(tmp_path, monkeypatch):
    """The algorithm's handle_server_args (SGLang's resolution, in the launching process, before any model loads)
    reads the draft config's block_size and refuses; the CPU engine test shows an Engine's launch failing with it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from sglang.srt.server_args import ServerArgs
    from sglang_cpu import ddtree_models

    from kdtree_ops.sglang import plugin

    plugin.register()  # DDTREE is a plugin algorithm: SGLang resolves its name only once registered
    monkeypatch.setenv("KDTREE_DDTREE_TOPK", "1")
    monkeypatch.delenv("KDTREE_VERIFY", raising=False)
    target = str(ddtree_models.markov_llama(tmp_path / "target"))
    draft = str(ddtree_models.dflash_draft(tmp_path / "draft"))

    def launch(tokens: int) -> ServerArgs:
        return ServerArgs(model_path=target, device="cpu", dtype="float32", attention_backend="kdtree",
                          speculative_algorithm="DDTREE", speculative_draft_model_path=draft,
                          speculative_num_draft_tokens=tokens)

    with pytest.raises(ValueError, match=r"only 7 paths .*fix: --speculative-num-draft-tokens <= 8"):
        launch(16).resolve_once()
    launch(8).resolve_once()  # the chain of 7 drafts fills 8 tokens
