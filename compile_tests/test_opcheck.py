"""`torch.library.opcheck` on every kdtree op: schema (mutation/alias annotations), fake impl against the real
kernel (shapes, strides, dtypes), autograd registration and AOT dispatch with dynamic shapes.

Samples are small (opcheck runs each op several times, some under fake/AOT tracing) but cover the layouts
the op promises: strided caches, v_cache aliasing k_cache (MLA), int64 slot indices, draft K/V passed
separately, logit_cap, graph padding rows and slots, empty requests and an empty batch.
"""

from __future__ import annotations

import pytest
import torch

import kdtree_ops.ops as ops
from kdtree_ops.testing.cases import make_verify_case
from kdtree_ops.shapes import mask_words
from kdtree_ops.testing.trees import ancestor_matrix, random_tree

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DEVICE_PARAMS = [pytest.param(d, marks=pytest.mark.cuda) if d == "cuda" else d for d in DEVICES]

# Head dims and dtype per device: small on the CPU; on CUDA what its kernels serve (bf16/fp16; (64, 64) and
# MLA's (576, 512)).
HEAD_DIMS = {"cpu": {"gqa": (16, 16), "small": (8, 8), "mla": (24, 16)},
             "cuda": {"gqa": (64, 64), "small": (64, 64), "mla": (576, 512)}}
DTYPE = {"cpu": torch.float32, "cuda": torch.bfloat16}

# (name, make_verify_case keyword arguments, head dims): one sample per promise of the contract.
ATTENTION_SAMPLES = [
    ("gqa", dict(tree_sizes=[5, 9], prefix_lens=[7, 3], num_q_heads=4, num_kv_heads=2), "gqa"),
    ("strided", dict(tree_sizes=[6, 3], prefix_lens=[4, 11], num_q_heads=4, num_kv_heads=1, layout="strided"),
     "gqa"),
    ("mla_alias", dict(tree_sizes=[4, 7], prefix_lens=[9, 2], num_q_heads=4, num_kv_heads=1, layout="mla"), "mla"),
    ("int64_indices", dict(tree_sizes=[3, 5], prefix_lens=[6, 6], num_q_heads=2, num_kv_heads=2,
                           index_dtype=torch.int64, extra_slots=5), "small"),
    ("separate_draft", dict(tree_sizes=[5, 4], prefix_lens=[3, 8], num_q_heads=4, num_kv_heads=2,
                            draft_mode="separate"), "gqa"),
    ("mla_separate", dict(tree_sizes=[6], prefix_lens=[5], num_q_heads=2, num_kv_heads=1, layout="mla",
                          draft_mode="separate"), "mla"),
    ("logit_cap", dict(tree_sizes=[8, 2], prefix_lens=[5, 0], num_q_heads=2, num_kv_heads=1, logit_cap=5.0), "gqa"),
    ("float16", dict(tree_sizes=[7, 3], prefix_lens=[2, 9], num_q_heads=4, num_kv_heads=2, dtype=torch.float16),
     "small"),
    ("padding_and_empty_request", dict(tree_sizes=[4, 0, 6], prefix_lens=[3, 5, 0], num_q_heads=2, num_kv_heads=1,
                                       pad_rows=3, extra_slots=4), "small"),
    ("two_mask_words", dict(tree_sizes=[40], prefix_lens=[6], num_q_heads=2, num_kv_heads=1), "small"),
    ("empty_batch", dict(tree_sizes=[], prefix_lens=[], num_q_heads=2, num_kv_heads=1), "small"),
]
SAMPLE_IDS = [name for name, _, _ in ATTENTION_SAMPLES]
SAMPLES = [(kwargs, dims) for _, kwargs, dims in ATTENTION_SAMPLES]


def _case(sample, device):
    kwargs, dims = sample
    head_dim_qk, head_dim_v = HEAD_DIMS[device][dims]
    return make_verify_case(**{"dtype": DTYPE[device], **kwargs}, head_dim_qk=head_dim_qk, head_dim_v=head_dim_v,
                            device=device, generator=torch.Generator().manual_seed(1234))


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_opcheck_tree_verify_attention(sample, device):
    case = _case(sample, device)
    torch.library.opcheck(torch.ops.kdtree.tree_verify_attention.default, case.args())


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_opcheck_tree_verify_attention_out(sample, device):
    case = _case(sample, device)
    out = torch.empty(ops.attention_output_shape(case.q, case.v_cache), dtype=case.q.dtype, device=case.q.device)
    torch.library.opcheck(torch.ops.kdtree.tree_verify_attention_out.default, case.args(), {"out": out})


def _trees(sizes, seed):
    gen = torch.Generator().manual_seed(seed)
    return [random_tree(t, generator=gen) for t in sizes]


def _indptr(sizes, device):
    return torch.tensor([0] + torch.tensor(sizes, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32,
                        device=device)


# (tree sizes, padding rows, extra words): several words, empty requests, graph padding, an empty batch.
MASK_SAMPLES = [([5, 9], 0, 0), ([40, 3], 2, 0), ([0, 7, 0], 1, 1), ([33], 0, 1), ([], 0, 0), ([], 3, 0)]
MASK_IDS = ["small", "two_words_padded", "empty_requests", "spare_word", "empty_batch", "padding_only"]


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("sizes, pad, extra_words", MASK_SAMPLES, ids=MASK_IDS)
def test_opcheck_tree_mask_from_parents(sizes, pad, extra_words, device):
    parents = [p for tree in _trees(sizes, 7) for p in tree] + [-1] * pad
    words = mask_words(max(sizes, default=0)) + extra_words
    args = (torch.tensor(parents, dtype=torch.int32, device=device), _indptr(sizes, device), words)
    torch.library.opcheck(torch.ops.kdtree.tree_mask_from_parents.default, args)


def _dense_mask_args(sizes, prefix_lens, pad, extra_words, mask_dtype, device):
    """SGLang's FULL_MASK layout: request b's rows [T_b, L_b + T_b] (prefix visible, then its ancestor matrix)."""
    chunks, starts = [], [0]
    for tree, prefix in zip(_trees(sizes, 11), prefix_lens):
        rows = torch.cat([torch.ones(len(tree), prefix, dtype=torch.bool), ancestor_matrix(tree)], dim=1)
        chunks.append(rows.flatten())
        starts.append(starts[-1] + rows.numel())
    flat = torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.bool)
    return (flat.to(mask_dtype).to(device), torch.tensor(starts[:-1] or [0], dtype=torch.int32, device=device),
            _indptr(sizes, device), torch.tensor(prefix_lens, dtype=torch.int32, device=device), sum(sizes) + pad,
            mask_words(max(sizes, default=0)) + extra_words)


DENSE_SAMPLES = [([5, 9], [3, 0], 0, 0, torch.bool), ([40, 2], [4, 6], 2, 0, torch.uint8),
                 ([0, 6], [5, 2], 1, 1, torch.uint8), ([], [], 2, 0, torch.bool)]
DENSE_IDS = ["bool", "uint8_two_words_padded", "empty_request", "empty_batch"]


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("sizes, prefix_lens, pad, extra_words, mask_dtype", DENSE_SAMPLES, ids=DENSE_IDS)
def test_opcheck_tree_mask_from_dense(sizes, prefix_lens, pad, extra_words, mask_dtype, device):
    args = _dense_mask_args(sizes, prefix_lens, pad, extra_words, mask_dtype, device)
    torch.library.opcheck(torch.ops.kdtree.tree_mask_from_dense.default, args)


def _divergence_samples(device):
    gen = torch.Generator().manual_seed(3)
    ref = torch.randn(6, 4, 8, generator=gen)
    out = ref + 1e-3 * torch.randn(6, 4, 8, generator=gen)
    with_nan = out.clone()
    with_nan[2, 1, :3] = float("nan")
    with_nan[4, 0, 0] = float("inf")
    wide = torch.randn(6, 4, 16, generator=gen)
    return {
        "close": (out, ref),
        "non_finite": (with_nan, ref),
        "non_contiguous": (wide[..., :8], ref),
        "empty": (torch.empty(0, 4, 8), torch.empty(0, 4, 8)),
    } if device == "cpu" else {k: (o.to(device), r.to(device)) for k, (o, r) in _divergence_samples("cpu").items()}


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("sample", ["close", "non_finite", "non_contiguous", "empty"])
def test_opcheck_record_divergence(sample, device):
    out, ref = _divergence_samples(device)[sample]
    stats = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float32, device=device)  # earlier calls' running stats
    torch.library.opcheck(torch.ops.kdtree.record_divergence.default, (out, ref, stats))
