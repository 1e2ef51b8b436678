"""Checks of the GPU stand-ins (sglang_gpu/stand_in) against their kernels' semantics on literal cases (TEST ONLY).

They import the stand-in `sgl_kernel`, which would shadow the installed sglang-kernel package in the process that
imports it, so compile_tests/test_sglang_gpu_standin.py runs this file in a process of its own with the stand-in
first on PYTHONPATH (`python -m sglang_gpu.standin_checks` from compile_tests/: every check, a line each, exit 1
on a failure).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import sgl_kernel  # the stand-in: first on PYTHONPATH
import sglang_gpu_patches

torch.manual_seed(0)


def _close(a, b, tol=1e-5):
    assert torch.allclose(a.float(), b.float(), atol=tol, rtol=tol), (a - b).abs().max()


def check_rmsnorm_and_fused_add():
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    r = torch.randn(5, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    ref = lambda t: (t.float() / torch.sqrt(t.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float())
    _close(sgl_kernel.rmsnorm(x, w, 1e-6), ref(x).to(torch.bfloat16))
    out = torch.empty_like(x)
    assert sgl_kernel.rmsnorm(x, w, 1e-6, out=out) is out
    x2, r2 = x.clone(), r.clone()
    sgl_kernel.fused_add_rmsnorm(x2, r2, w, 1e-6)
    s = x.float() + r.float()
    _close(r2, s.to(torch.bfloat16))
    _close(x2, ref(s).to(torch.bfloat16), tol=2e-2)
    g = sgl_kernel.gemma_rmsnorm(x, w, 1e-6)
    _close(g, (x.float() / torch.sqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
               * (w.float() + 1)).to(torch.bfloat16))


def check_gated_activations():
    x = torch.randn(3, 2, 32)
    _close(sgl_kernel.silu_and_mul(x), F.silu(x[..., :16]) * x[..., 16:])
    _close(sgl_kernel.gelu_and_mul(x), F.gelu(x[..., :16]) * x[..., 16:])
    out = torch.empty(3, 2, 16)
    sgl_kernel.gelu_tanh_and_mul(x, out)
    _close(out, F.gelu(x[..., :16], approximate="tanh") * x[..., 16:])


def check_merge_state_matches_full_attention():
    n, h, d, l = 4, 3, 8, 10
    q, k, v = torch.randn(n, h, d), torch.randn(l, h, d), torch.randn(l, h, d)

    def part(ks, vs):
        s = torch.einsum("nhd,lhd->nhl", q, ks)
        return torch.einsum("nhl,lhd->nhd", torch.softmax(s, -1), vs), torch.logsumexp(s, -1)

    va, sa = part(k[:6], v[:6])
    vb, sb = part(k[6:], v[6:])
    vf, sf = part(k, v)
    vm, sm = sgl_kernel.merge_state_v2(va, sa, vb, sb)
    _close(vm, vf, 1e-5)
    _close(sm, sf, 1e-5)
    # an empty side (+inf LSE, as the kernels write) contributes nothing
    vm2, _ = sgl_kernel.merge_state_v2(va, sa, vb, torch.full_like(sb, float("inf")))
    _close(vm2, va)


def check_renorm():
    p = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]])
    k = sgl_kernel.top_k_renorm_prob(p, torch.tensor([2, 0]))
    _close(k[0], torch.tensor([0, 0.4 / 0.7, 0, 0.3 / 0.7]))
    _close(k[1], p[1])
    t = sgl_kernel.top_p_renorm_prob(p, torch.tensor([0.5, 1.0]))
    _close(t[0], torch.tensor([0, 0.4 / 0.7, 0, 0.3 / 0.7]))  # 0.4 < 0.5 so 0.3 joins; then mass 0.7 >= 0.5
    _close(t[1], p[1])


def check_weak_ref_tensor_aliases():
    t = torch.arange(12.0).reshape(3, 4)[:, 1:]
    a = sgl_kernel.weak_ref_tensor(t)
    assert a.data_ptr() == t.data_ptr() and a.shape == t.shape and a.stride() == t.stride()
    t.add_(1)
    _close(a, t)
    assert sgl_kernel.weak_ref_tensor(5) == 5


def check_concat_mla_k_and_rope():
    kn, kr = torch.randn(2, 4, 16), torch.randn(2, 1, 8)
    k = torch.empty(2, 4, 24)
    sgl_kernel.concat_mla_k(k, kn, kr)
    _close(k[..., :16], kn)
    _close(k[..., 16:], kr.expand(2, 4, 8))
    # rotary_embedding (neox) against the rotate-half formula
    pos = torch.tensor([0, 3])
    rot = 8
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    fr = torch.outer(torch.arange(16).float(), inv)
    cache = torch.cat([fr.cos(), fr.sin()], -1)
    q = torch.randn(2, 2 * 8)
    q0 = q.clone().view(2, 2, 8)
    sgl_kernel.rotary_embedding(pos, q, None, 8, cache, True)
    c, s = cache[pos, :4][:, None], cache[pos, 4:][:, None]
    ref = torch.cat([q0[..., :4] * c - q0[..., 4:] * s, q0[..., 4:] * c + q0[..., :4] * s], -1)
    _close(q.view(2, 2, 8), ref, 1e-5)


def check_moe_helpers_and_bitmask():
    x = torch.randn(3, 2, 5)
    out = torch.empty(3, 5)
    sgl_kernel.moe_sum_reduce(x, out, 2.0)
    _close(out, x.sum(1) * 2)
    w, ids = torch.empty(3, 2), torch.empty(3, 2, dtype=torch.int32)
    g = torch.randn(3, 6)
    sgl_kernel.topk_softmax(w, ids, g, renormalize=True)
    ref = torch.softmax(g, -1).topk(2, -1)
    _close(w, ref.values / ref.values.sum(-1, keepdim=True))
    assert torch.equal(ids.long(), ref.indices)
    logits = torch.zeros(2, 40)
    mask = torch.zeros(2, 2, dtype=torch.int32)
    mask[0, 0] = 0b101
    mask[1, 1] = 1  # token 32
    sgl_kernel.apply_token_bitmask_inplace_cuda(logits, mask)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0, 2]
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [32]


def check_stubs_raise():
    from sgl_kernel.flash_attn import flash_attn_with_kvcache  # any submodule resolves
    from sgl_kernel.utils import is_arch_support_pdl

    assert is_arch_support_pdl() is False
    for fn in (flash_attn_with_kvcache, sgl_kernel.fp8_scaled_mm):
        try:
            fn()
        except RuntimeError as e:
            assert "stand-in" in str(e)
        else:
            raise AssertionError("stub did not raise")
    import flash_mla
    from flash_mla.flash_mla_interface import FlashMLASchedMeta

    class _Sub(FlashMLASchedMeta):  # usable as a base class, as sglang's annotations/subclasses need
        pass


def _chain_tree(bs, n):
    """A chain: node 0 -> 1 -> 2 ... (retrive_next_token), no siblings."""
    idx = torch.arange(bs * n).view(bs, n)
    nxt = torch.full((bs, n), -1, dtype=torch.int64)
    nxt[:, :-1] = torch.arange(1, n)
    return idx, nxt, torch.full((bs, n), -1, dtype=torch.int64)


def check_tree_speculative_sampling_accepts_and_samples():
    bs, n, vocab = 1, 4, 6
    cand = torch.tensor([[0, 2, 3, 4]])
    idx, nxt, sib = _chain_tree(bs, n)
    tp = torch.zeros(bs, n, vocab)
    tp[0, 0, 2] = 1.0       # after node 0 the target is sure of token 2 (= draft 1): accept
    tp[0, 1, 3] = 1.0       # after node 1: token 3 (= draft 2): accept
    tp[0, 2, 5] = 1.0       # after node 2: token 5, draft 3 says 4: reject, bonus = 5
    predicts = torch.full((bs * n,), -7, dtype=torch.int32)
    accept_index = torch.full((bs, n), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    sglang_gpu_patches.tree_speculative_sampling_target_only(
        predicts, accept_index, accept_num, cand, idx, nxt, sib, torch.full((bs, n), 0.5), torch.full((bs,), 0.5),
        tp, torch.zeros_like(tp), threshold_single=1.0, threshold_acc=1.0)
    assert accept_num.tolist() == [2]
    assert accept_index.tolist() == [[0, 1, 2, -1]]
    assert predicts[:3].tolist() == [2, 3, 5]


def check_patches_table_targets_exist():
    import importlib.util

    missing = [m for m in sglang_gpu_patches.PATCHES if importlib.util.find_spec(m) is None]
    assert not missing, missing


def main() -> int:
    if not getattr(sgl_kernel, "IS_TEST_STAND_IN", False):
        print("FAIL: the stand-in is not first on PYTHONPATH:", sgl_kernel.__file__)
        return 1
    checks = [(n, f) for n, f in sorted(globals().items()) if n.startswith("check_") and callable(f)]
    failed = 0
    for name, fn in checks:
        try:
            fn()
            print("PASS", name)
        except Exception as e:  # noqa: BLE001 - each check's failure is reported, the rest still run
            failed += 1
            print("FAIL", name, type(e).__name__, e)
    print(f"{len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
