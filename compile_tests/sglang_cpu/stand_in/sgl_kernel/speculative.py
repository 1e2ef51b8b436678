"""TEST-ONLY: `sgl_kernel.speculative`, the module SGLang's NGRAM path imports its tree rebuild from (torch code)."""

from sglang_cpu.spec_kernels import reconstruct_indices_from_tree_mask

__all__ = ["reconstruct_indices_from_tree_mask"]
