"""The DFlash block drafter of DDTREE: SGLang's own DFlash draft model, its attention served by the verify op.

A DFlash checkpoint (`architectures: ["DFlashDraftModel"]`, `block_size`, `dflash_config: {mask_token_id,
target_layer_ids}`) is a few decoder layers with `fc` and `hidden_norm` that project the target's hidden states
at `target_layer_ids` into the draft's KV cache, and no embedding or head of its own (the target's are used).
One draft forward turns a block `[bonus, mask, ..., mask]` at positions `L .. L + block_size - 1` into the
drafter's distribution of the tokens at positions `L + 1 ..`: the K = block_size - 1 positions the DDTree is built
over. The block attends to the request's committed context (draft K/V in the cache) and to itself in both
directions.

What is SGLang's and what is ours: the model class (`sglang.srt.models.dflash.DFlashDraftModel`) with its weight
loading, projections, norms, rotary embedding and MLPs is SGLang's, so the numbers are DFLASH's; the model runs
outside a ModelRunner, and its attention is `tree_verify_attention` (context slots from req_to_token, the block as
the draft rows, an all-ones mask over the block). The draft cache is indexed by the target's token slots (as
DFLASH shares the target's req_to_token): a committed token's draft K/V live in the slot its target K/V live in,
so the radix cache's shared prefixes carry both. Everything is device work with shapes from (B, block_size):
no host sync.

Under tensor parallelism the draft layers are SGLang's parallel layers (each rank its heads), the target's
embedding all-reduces its shards' rows, and the target's lm_head holds one shard of the vocabulary per rank: the
top-k is taken over the whole vocabulary by exchanging each rank's candidates (vocab_topk.py), so every rank
drafts the same tokens, builds the same tree and accepts the same path.

Refused at load, naming the field: DFlash variants this drafter does not run (grouped convolutions, attention
sinks, value scales, sliding-window layers, Domino/selector heads, causal draft layers).
"""

from __future__ import annotations

import glob
import logging
import os

import torch

from ..shapes import mask_words
from .verify_metadata import QLEN_ONLY, packed_tree_mask
from .vocab_topk import global_topk_logprobs, vocab_shard

logger = logging.getLogger(__name__)


def _load_config(path: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def _refuse_variants(config, draft_cfg) -> None:
    """Raises for a DFlash variant the drafter does not run (see the module docstring)."""
    unsupported = {
        "dflash_config.conv_kernel_size (grouped convolutions)": bool(draft_cfg.conv_kernel_size),
        "attention_sink_bias": bool(draft_cfg.attention_sink_bias),
        "attention_value_scale": draft_cfg.attention_value_scale is not None,
        "projector_type (Domino / selector heads)": draft_cfg.projector_type not in (None, "", "linear"),
        "layer_types other than full_attention": any(
            t != "full_attention" for t in (getattr(config, "layer_types", None) or [])),
        "is_causal (causal draft layers)": bool(getattr(config, "is_causal", False)),
        "use_gemma_norm": bool(getattr(config, "use_gemma_norm", False)),
    }
    found = [name for name, present in unsupported.items() if present]
    if found:
        raise ValueError(f"DDTREE's DFlash drafter does not run this draft checkpoint: {', '.join(found)}")
    if draft_cfg.mask_token_id is None:
        raise ValueError("DDTREE needs dflash_config.mask_token_id in the draft checkpoint's config.json (the token "
                         "a block's undrafted positions carry)")


def _block_size(draft_cfg) -> int:
    """The block a DFlash config drafts (SGLang's default 16), which needs the bonus token and a drafted position."""
    block_size = int(draft_cfg.resolve_block_size(default=16))
    if block_size < 2:
        raise ValueError(f"DDTREE needs a DFlash block_size >= 2 (the bonus token and at least one drafted position), "
                         f"the checkpoint has {block_size}")
    return block_size


def draft_block_size(path: str) -> int:
    """The block size of the draft checkpoint at `path` (its config alone: read at launch, before any weights)."""
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

    return _block_size(parse_dflash_draft_config(draft_hf_config=_load_config(path)))


def draft_cache_bytes_per_slot(path: str, tp_size: int, dtype: torch.dtype) -> int:
    """Bytes per slot of the draft cache of the checkpoint at `path` on one of `tp_size` ranks, in `dtype` (the
    target's): K and V of every draft layer, with the heads per rank and head size of SGLang's DFlashAttention
    (models/dflash.py). Known from the config alone, so SGLang's pool sizing can charge it before the drafter exists;
    `DFlashDrafter.allocate_cache` checks the cache it builds against it."""
    config = _load_config(path)
    heads = int(config.num_attention_heads)
    kv_heads = max(1, int(getattr(config, "num_key_value_heads", heads)) // int(tp_size))
    head_dim = int(getattr(config, "head_dim", int(config.hidden_size) // heads))
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * int(config.num_hidden_layers) * kv_heads * head_dim * element


class DFlashDrafter:
    """The draft model, its K/V cache over the target's slots, and one block forward (`propose`)."""

    def __init__(self, path: str, target_model, target_num_layers: int, device, dtype):
        """path: the draft checkpoint folder; target_model: the target's nn.Module (its embedding and lm_head are
        used). Loads the weights only: built before SGLang sizes its pools, so they are resident when it measures
        the memory left (as DFLASH's draft worker's are); `allocate_cache` follows once the target's pool exists."""
        from safetensors.torch import load_file
        from sglang.srt.models.dflash import DFlashDraftModel
        from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

        from .. import ops

        self.ops = ops
        config = _load_config(path)
        draft_cfg = parse_dflash_draft_config(draft_hf_config=config)
        _refuse_variants(config, draft_cfg)
        self.block_size = _block_size(draft_cfg)
        self.mask_token_id = int(draft_cfg.mask_token_id)
        self.target_layer_ids = list(draft_cfg.resolve_target_layer_ids(
            target_num_layers=target_num_layers, draft_num_layers=int(config.num_hidden_layers)))
        with torch.device(device):
            model = DFlashDraftModel(config)
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"DDTREE: no *.safetensors weights in the draft checkpoint {path}")
        model.load_weights((name, w) for f in files for name, w in load_file(f).items())
        self.model = model.to(device=device, dtype=dtype).eval()
        self.cache_dtype, self.device = dtype, torch.device(device)
        self.embed = target_model.get_input_embeddings() if hasattr(target_model, "get_input_embeddings") \
            else target_model.model.embed_tokens
        self.embed_scale = float(target_model.get_dflash_noise_embedding_scale()) \
            if hasattr(target_model, "get_dflash_noise_embedding_scale") else 1.0
        self.vocab_size = int(target_model.config.vocab_size)
        # materialize's input: the captured target layers' hidden states, concatenated
        self.target_hidden_width = len(self.target_layer_ids) * int(target_model.config.hidden_size)
        self.lm_head_weight = target_model.lm_head.weight  # this rank's rows under TP (vocab_topk.py)
        self.vocab = vocab_shard(target_model.lm_head, self.vocab_size)
        attn = self.model.layers[0].self_attn
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self._block_masks: dict[int, torch.Tensor] = {}
        logger.info("DDTREE DFlash drafter: %d layers, block size %d (%d drafted positions), mask token %d, target "
                    "layers %s", len(self.model.layers), self.block_size, self.block_size - 1, self.mask_token_id,
                    self.target_layer_ids)

    @property
    def cache_bytes_per_slot(self) -> int:
        """Bytes of one slot of the draft cache as this drafter allocates it: K and V of every draft layer."""
        element = torch.empty((), dtype=self.cache_dtype).element_size()
        return 2 * len(self.model.layers) * self.num_kv_heads * self.head_dim * element

    def allocate_cache(self, num_slots: int, budgeted_bytes_per_slot: int | None) -> None:
        """The draft K/V of every target slot, plus one scratch slot after them (rows to drop are written there).

        num_slots: the target KV pool's slot count; budgeted_bytes_per_slot: what SGLang's pool sizing charged for
        a slot of this cache (ddtree_memory.py), None where no DDTREE sizing ran. A cache larger than its budget
        would take the activations' headroom, so it is refused, naming both."""
        per_slot = self.cache_bytes_per_slot
        if budgeted_bytes_per_slot is not None and per_slot > budgeted_bytes_per_slot:
            raise RuntimeError(f"DDTREE: the draft cache takes {per_slot} bytes per slot but SGLang's pool sizing "
                               f"charged {budgeted_bytes_per_slot} (dflash_drafter.draft_cache_bytes_per_slot)")
        shape = (num_slots + 1, self.num_kv_heads, self.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=self.cache_dtype, device=self.device) for _ in self.model.layers]
        self.v_cache = [torch.zeros(shape, dtype=self.cache_dtype, device=self.device) for _ in self.model.layers]
        self.scratch_slot = num_slots
        logger.info("DDTREE draft cache: %d slots + 1 scratch, %d bytes per slot (budgeted %s), %.3f GiB, inside "
                    "--mem-fraction-static's KV budget", num_slots, per_slot, budgeted_bytes_per_slot,
                    (num_slots + 1) * per_slot / 2**30)

    # ---- the draft cache ---------------------------------------------------------------------------------

    @torch.no_grad()
    def materialize(self, target_hidden: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        """Writes the draft K/V of tokens whose target hidden states are `target_hidden` [N, F * hidden] (the
        captured layers, concatenated), at `positions` [N] into `slots` [N] (the scratch slot for rows to drop)."""
        if target_hidden.shape[0] == 0:
            return
        context = self.model.project_target_hidden(target_hidden.to(self.lm_head_weight.dtype))
        for layer, k_cache, v_cache in zip(self.model.layers, self.k_cache, self.v_cache):
            attn = layer.self_attn
            k, v = attn.kv_proj_only(self.model.prepare_context_hidden_for_kv(layer, context))
            k = attn.apply_k_rope(positions, attn.apply_k_norm(k))
            k_cache[slots] = k.view(-1, self.num_kv_heads, self.head_dim)
            v_cache[slots] = v.view(-1, self.num_kv_heads, self.head_dim)

    # ---- one block forward -------------------------------------------------------------------------------

    def _block_mask(self, qo_indptr: torch.Tensor) -> torch.Tensor:
        """[B * block_size, W] int32 for B blocks at qo_indptr [B+1]: every block row sees every block token (a
        bidirectional block: SGLang's QLEN_ONLY mask with every entry set, packed), made once per batch size."""
        batch, n = qo_indptr.shape[0] - 1, self.block_size
        mask = self._block_masks.get(batch)
        if mask is None:
            device = qo_indptr.device
            mask = packed_tree_mask(torch.ones(batch * n * n, dtype=torch.bool, device=device), QLEN_ONLY, qo_indptr,
                                    torch.zeros(batch, dtype=torch.int64, device=device), batch * n, mask_words(n))
            self._block_masks[batch] = mask
        return mask

    @torch.no_grad()
    def propose(self, bonus: torch.Tensor, prefix_lens: torch.Tensor, kv_indptr: torch.Tensor,
                kv_indices: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafter's top-k at each of the K = block_size - 1 positions after the bonus token.

        Args:
            bonus: [B] int64, each request's last token (not yet in either cache), at position prefix_lens[b].
            prefix_lens: [B] committed lengths (their draft K/V are in the cache).
            kv_indptr, kv_indices: the committed slots of each request (verify_metadata.prefix_kv).
            topk: candidates per position (<= vocabulary).
        Returns:
            logprobs [B, K, topk] float32 sorted descending, tokens [B, K, topk] int64 (ddtree.build_tree's input):
            over the whole vocabulary and the same on every TP rank (vocab_topk.py), equal scores to the lowest id.
        """
        b, n = bonus.shape[0], self.block_size
        device = bonus.device
        block = torch.full((b, n), self.mask_token_id, dtype=torch.int64, device=device)
        block[:, 0] = bonus
        positions = (prefix_lens.to(torch.int64)[:, None] + torch.arange(n, device=device)).reshape(-1)
        hidden = self.embed(block.reshape(-1))
        if self.embed_scale != 1.0:
            hidden = hidden * self.embed_scale
        qo_indptr = torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device=device)
        mask = self._block_mask(qo_indptr)
        residual = None
        for layer, k_cache, v_cache in zip(self.model.layers, self.k_cache, self.v_cache):
            if residual is None:
                residual, hidden = hidden, layer.input_layernorm(hidden)
            else:
                hidden, residual = layer.input_layernorm(hidden, residual)
            hidden = self._attention(layer.self_attn, positions, hidden, k_cache, v_cache, qo_indptr, kv_indptr,
                                     kv_indices, mask)
            hidden, residual = layer.post_attention_layernorm(hidden, residual)
            hidden = layer.mlp(hidden)
        hidden, _ = self.model.norm(hidden, residual)
        drafted = hidden.view(b, n, -1)[:, 1:]                                       # positions L+1 .. L+K
        logprobs, tokens = global_topk_logprobs(drafted, self.lm_head_weight, self.vocab, topk)
        return logprobs.contiguous(), tokens.contiguous()

    def _attention(self, attn, positions, hidden, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, mask):
        from sglang.srt.models.utils import apply_qk_norm

        qkv, _ = attn.qkv_proj(hidden)
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q, k = apply_qk_norm(q, k, attn.q_norm, attn.k_norm, attn.head_dim, allow_inplace=False)
        q, k = attn.rotary_emb(positions, q, k)
        rows = q.shape[0]
        out = self.ops.tree_verify_attention(
            q.reshape(rows, attn.num_heads, attn.head_dim).contiguous(), k_cache, v_cache, qo_indptr, kv_indptr,
            kv_indices, mask, attn.scaling, 0.0, k.reshape(rows, attn.num_kv_heads, attn.head_dim).contiguous(),
            v.reshape(rows, attn.num_kv_heads, attn.head_dim).contiguous())
        output, _ = attn.o_proj(out.reshape(rows, -1))
        return output
