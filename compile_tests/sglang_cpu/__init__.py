"""Helpers of the engine tests on the CPU (TEST ONLY): tiny checkpoints, SGLang's missing CPU kernels in torch, and
a driver that runs one sglang.Engine per configuration in its own process.

- tiny_models.py: float32 Llama, DeepSeek-style MLA and EAGLE3-draft checkpoints built locally;
- spec_kernels.py, attention_kernels.py: sgl-kernel's CPU entry points that SGLang 0.5.23 imports, in torch;
- stand_in/sgl_kernel/: the package SGLang imports them from, first on PYTHONPATH in the engine's processes;
- engine_driver.py: starts an Engine with SGLANG_USE_CPU_ENGINE=1 and answers requests over a pipe.
"""
