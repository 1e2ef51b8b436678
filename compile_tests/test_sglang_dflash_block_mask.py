"""The DFlash drafter's block mask: every row of a request's block sees every token of that block (the block
attends to itself in both directions), packed by the project's mask helper as a QLEN_ONLY mask with every entry
set; literal words for blocks within one word, filling it, and past it, and the one-word-per-32-bits layout the
verify op reads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from kdtree_ops.sglang.dflash_drafter import DFlashDrafter  # noqa: E402
from kdtree_ops.testing.trees import pack_mask_bits  # noqa: E402

# (block_size, one row's int32 words)
BLOCKS = [(2, [0b11]), (5, [0b11111]), (16, [0xFFFF]), (32, [-1]), (33, [-1, 1]), (40, [-1, 0xFF])]


@pytest.mark.parametrize("block_size, words", BLOCKS, ids=[str(b) for b, _ in BLOCKS])
@pytest.mark.parametrize("batch", [0, 1, 3])
def test_every_block_row_sees_the_whole_block(block_size, words, batch):
    drafter = SimpleNamespace(block_size=block_size, _block_masks={})
    qo_indptr = torch.arange(0, (batch + 1) * block_size, block_size, dtype=torch.int32)
    mask = DFlashDrafter._block_mask(drafter, qo_indptr)
    assert mask.dtype == torch.int32 and mask.shape == (batch * block_size, len(words))
    assert mask.tolist() == [words] * (batch * block_size)
    assert torch.equal(mask, pack_mask_bits(torch.ones(batch * block_size, block_size, dtype=torch.bool), len(words)))
    assert DFlashDrafter._block_mask(drafter, qo_indptr) is mask  # made once per batch size
