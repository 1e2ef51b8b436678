"""DDTREE's spec infos: the verify forward's input (the tree as the op's packed mask) and the round's carry.

`DDTreeVerifyInput` is a tree verify input of SGLang's NGRAM type (`SpecInputType` is closed), so SGLang's verify
paths take it as they take NGRAM's; it carries the tree only as the kdtree op's packed mask `[B N, W]` int32
(ddtree_build_tree's), never SGLang's dense mask (budgets reach 1023 tokens over long contexts), so only the op
can verify with it (ddtree_algorithm.check_ddtree_verify_route). It asks for the target's FULL hidden states
(the drafter reads them), at capture and at every replay alike: `for_capture` is what DDTREE's decode graphs are
captured with (plugin.py's hook on `DecodeCudaGraphRunner.get_spec_info`, which knows EAGLE, DFLASH and NGRAM
only, so a plugin algorithm would be captured with no spec info and hidden mode NULL, and every replay would fail
SGLang's hidden-mode check).

`DDTreeCarry` is the running batch's spec info between rounds: each request's bonus token (not yet in any cache).
On SGLang's overlap scheduler (KDTREE_DDTREE_OVERLAP=1) the carry a round returns is SGLang's relay handle: the
scheduler stashes its bonus tokens in the FutureMap (`RelayPayload.from_draft_input`, which reads EAGLE's fields
too, None here), sets `future_indices`, and the next round's `resolve_forward_inputs` gathers the bonus tokens
back into it on the forward stream, as DFLASH's DFlashDraftInputV2 is relayed; the committed lengths travel by
the worker's `on_publish` (FutureMap.publish) and come back as the batch's `seq_lens` (and `seq_lens_cpu` where
a backend needs host lengths).
"""

from __future__ import annotations

import torch

from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.ngram_info import NgramVerifyInput

from .verify_metadata import FULL_MASK, mask_words, packed_tree_mask


class DDTreeVerifyInput(NgramVerifyInput):
    """The verify forward's spec info: B trees of N tokens, their positions and the op's packed mask."""

    def __init__(self, tree_tokens: torch.Tensor, positions: torch.Tensor, packed_tree_mask: torch.Tensor):
        """tree_tokens [B, N] int64 (node 0 the root); positions [B N] int64 (committed length + depth);
        packed_tree_mask [B N, W] int32 (bit j of row i: node i sees node j of its request)."""
        # NgramVerifyInput takes its device from new_seq_lens when it has no custom_mask; a verify input has no new
        # lengths (the round decides them), so the field is cleared once the device is known.
        super().__init__(draft_token=tree_tokens.reshape(-1), custom_mask=None, positions=positions,
                         draft_token_num=tree_tokens.shape[1], new_seq_lens=positions)
        self.new_seq_lens = None
        self.packed_tree_mask = packed_tree_mask
        self.capture_hidden_mode = CaptureHiddenMode.FULL  # the drafter reads the target's captured layers

    @classmethod
    def for_capture(cls, num_tokens: int, tokens_per_req: int, device) -> "DDTreeVerifyInput":
        """The spec info a decode graph of `num_tokens` rows is captured with: chains of `tokens_per_req` tokens
        (any tree would do: the kdtree backend packs each replay's own mask into its static buffer before the
        replay), the mask of the capture's shape [num_tokens, mask_words(tokens_per_req)], hidden mode FULL."""
        bs = num_tokens // tokens_per_req
        qo_indptr = torch.arange(0, (bs + 1) * tokens_per_req, tokens_per_req, dtype=torch.int32, device=device)
        mask = packed_tree_mask(None, FULL_MASK, qo_indptr, torch.zeros(bs, dtype=torch.int32, device=device),
                                num_tokens, mask_words(tokens_per_req))
        return cls(torch.zeros((bs, tokens_per_req), dtype=torch.int64, device=device),
                   torch.zeros(num_tokens, dtype=torch.int64, device=device), mask)

    def generate_attn_arg_prefill(self, **_kwargs):
        """What a backend's own verify metadata asks a tree verify input for (NgramVerifyInput's reads a dense
        custom_mask): DDTREE has none, so it says so instead of an AttributeError on None."""
        raise RuntimeError(
            "DDTreeVerifyInput carries its tree only as the kdtree op's packed mask (no dense custom_mask), so an "
            "attention backend's own verify metadata cannot be built from it: DDTREE verifies on the kdtree backend "
            "(--attention-backend kdtree), which never hands a DDTREE verify batch to its base")


class DDTreeCarry(NgramVerifyInput):
    """What one round hands the next (the running batch's spec info): each request's bonus token."""

    # EAGLE's relay fields, which the overlap scheduler's RelayPayload.from_draft_input reads: DDTREE relays none
    topk_p = topk_index = hidden_states = None

    def __init__(self, bonus_tokens: torch.Tensor, new_seq_lens: torch.Tensor, draft_token_num: int):
        super().__init__(draft_token_num=draft_token_num, new_seq_lens=new_seq_lens)
        self.bonus_tokens = bonus_tokens

    def filter_batch(self, new_indices: torch.Tensor, new_indices_cpu=None):
        if self.future_indices is not None:  # overlap: the FutureMap holds the rows; the tensors are the forward's
            self.future_indices = self.future_indices[new_indices]
            return
        self.bonus_tokens = self.bonus_tokens[new_indices]
        self.new_seq_lens = self.new_seq_lens[new_indices]

    def merge_batch(self, spec_info: "DDTreeCarry"):
        if self.future_indices is not None:
            if spec_info.future_indices is None:
                raise RuntimeError("DDTREE on the overlap scheduler: a running batch's carry merged with one the "
                                   "scheduler did not relay (no future_indices)")
            self.future_indices = torch.cat([self.future_indices, spec_info.future_indices])
            return
        self.bonus_tokens = torch.cat([self.bonus_tokens, spec_info.bonus_tokens])
        self.new_seq_lens = torch.cat([self.new_seq_lens, spec_info.new_seq_lens])
