"""KDTREE_DDTREE_BUDGETS: DDTREE's tree size per batch size (kdtree_ops/sglang/ddtree_budgets.py).

The width each batch size gets, the server log's line, and every malformed value refused naming the variable, the
entry and the rule (at SGLang's server-args resolution, in the launching process). The engine test
(test_sglang_ddtree_engine.py, b') shows rounds changing width as a batch shrinks, lossless.
"""

from __future__ import annotations

import pytest
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from kdtree_ops.sglang.ddtree_budgets import BUDGETS_ENV, budget_policy, parse_budgets  # noqa: E402

LAUNCH, TOPK, BLOCK = 64, 8, 16


def test_each_batch_size_takes_the_largest_step_at_or_below_it():
    policy = parse_budgets("4:64, 8:16,24:1", LAUNCH, TOPK, BLOCK)
    widths = {b: policy.width(b) for b in (1, 3, 4, 7, 8, 23, 24, 500)}
    assert widths == {1: 64, 3: 64, 4: 64, 7: 64, 8: 16, 23: 16, 24: 1, 500: 1}  # below the first step: launch


def test_the_log_line_names_each_range_and_its_width():
    assert parse_budgets("1:64,8:16,24:1", LAUNCH, TOPK, BLOCK).describe() == (
        "1-7: 64; 8-23: 16; 24+: 1 (plain decode, no draft)")
    assert parse_budgets("5:1", LAUNCH, TOPK, BLOCK).describe() == "1-4: 64; 5+: 1 (plain decode, no draft)"


def test_unset_or_empty_is_no_policy(monkeypatch):
    monkeypatch.delenv(BUDGETS_ENV, raising=False)
    assert budget_policy(LAUNCH, TOPK, BLOCK) is None
    monkeypatch.setenv(BUDGETS_ENV, " ")
    assert budget_policy(LAUNCH, TOPK, BLOCK) is None
    monkeypatch.setenv(BUDGETS_ENV, "2:1")
    assert budget_policy(LAUNCH, TOPK, BLOCK).width(2) == 1


@pytest.mark.parametrize("raw, rule", [
    ("16", r"entry '16' is not BATCH:TOKENS"),
    ("1:x", r"entry '1:x' is not BATCH:TOKENS"),
    ("0:16", r"entry '0:16': BATCH must be a positive integer"),
    ("8:16,4:1", r"entry '4:1': batch sizes must ascend"),
    ("8:16,8:1", r"entry '8:1': batch sizes must ascend"),
    ("1:128", r"entry '1:128': TOKENS must be in \[1, 64\]"),
    ("1:0", r"entry '1:0': TOKENS must be in \[1, 64\]"),
])
def test_malformed_values_are_refused_naming_the_entry(raw, rule):
    with pytest.raises(ValueError, match=rf"^{BUDGETS_ENV}=.*{rule}.*format: comma-separated BATCH:TOKENS"):
        parse_budgets(raw, LAUNCH, TOPK, BLOCK)


def test_a_width_the_drafter_cannot_fill_is_refused():
    # top-1 over 7 drafted positions: a chain of 7 drafts, so at most 8 tokens
    parse_budgets("1:8,4:1", 16, 1, 8)
    with pytest.raises(ValueError, match=r"entry '1:12': DDTREE cannot fill its trees.*only 7 paths"):
        parse_budgets("1:12,4:1", 16, 1, 8)


def test_sglang_s_resolution_refuses_a_bad_policy(tmp_path, monkeypatch):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from sglang.srt.server_args import ServerArgs
    from sglang_cpu import ddtree_models

    from kdtree_ops.sglang import plugin

    plugin.register()
    monkeypatch.delenv("KDTREE_VERIFY", raising=False)
    monkeypatch.delenv("KDTREE_DDTREE_TOPK", raising=False)
    target = str(ddtree_models.markov_llama(tmp_path / "target"))
    draft = str(ddtree_models.dflash_draft(tmp_path / "draft"))

    def launch() -> ServerArgs:
        return ServerArgs(model_path=target, device="cpu", dtype="float32", attention_backend="kdtree",
                          speculative_algorithm="DDTREE", speculative_draft_model_path=draft,
                          speculative_num_draft_tokens=16)

    monkeypatch.setenv(BUDGETS_ENV, "1:16,4:32")
    with pytest.raises(ValueError, match=r"entry '4:32': TOKENS must be in \[1, 16\]"):
        launch().resolve_once()
    monkeypatch.setenv(BUDGETS_ENV, "1:16,4:1")
    launch().resolve_once()
