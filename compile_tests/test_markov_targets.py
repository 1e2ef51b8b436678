"""The real-sized markov targets' writer (sglang_gpu/markov_targets.py, llama8b.py, mla_lite.py) on the CPU at small
sizes: the checkpoint loads into transformers' model of its architecture with no missing or unexpected tensors; with
attn_std 0 the greedy next token is f(last token) at every position (the markov structure), with a large one it is
not everywhere; the logits of the ids past the embedded ones are exactly 0; the drafts are written for the shape."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_cpu import ddtree_models
from sglang_gpu import llama8b, markov_targets, mla_lite

SMALL = dict(layers=2, hidden=512, mlp=64, vocab=700, embedded=203, draft_heads=2)
SPECS = {"llama8b": lambda: llama8b.spec(heads=4, kv_heads=2, **SMALL),
         "mla_lite": lambda: mla_lite.spec(heads=2, **SMALL)}


def _load(folder):
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    return model.eval(), info


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_small_target_loads_and_follows_its_successor(name, tmp_path):
    spec = SPECS[name]()
    f = ddtree_models.successor(0, spec.shape)
    prompt = torch.tensor([list(spec.shape.words)[i * 37 % 200] for i in range(24)])[None]
    follows = {}
    for std in (0.0, 0.5):
        folder = markov_targets.write_target(spec, tmp_path / f"target-{std}", attn_std=std)
        model, info = _load(folder)
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        with torch.no_grad():
            logits = model(prompt).logits[0]
        assert torch.count_nonzero(logits[:, spec.shape.embedded:]) == 0  # the ids past the words: exactly 0
        greedy = logits.argmax(-1).tolist()
        follows[std] = sum(g == f[t] for g, t in zip(greedy, prompt[0].tolist())) / len(greedy)
    assert follows[0.0] == 1.0 and follows[0.5] < 1.0, follows
    assert json.loads((folder / "config.json").read_text())["architectures"] == spec.config["architectures"]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_drafts_are_written_for_the_shape(name, tmp_path):
    spec = SPECS[name]()
    paths = markov_targets.build(spec, tmp_path, attn_std=0.01)
    for draft in ("eagle", "dflash"):
        config = json.loads((tmp_path / draft / "config.json").read_text())
        assert config["hidden_size"] == spec.shape.hidden and config["vocab_size"] == spec.shape.vocab, draft
    assert paths["words"] == range(ddtree_models.FIRST_WORD, spec.shape.embedded)
    assert paths["engine"]["skip_tokenizer_init"] and (tmp_path / "target-0.01" / "done").exists()
