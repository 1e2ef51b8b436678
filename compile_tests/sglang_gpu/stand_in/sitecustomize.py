"""Installs the GPU stand-in's post-import patches (sglang_gpu_patches.py) in every Python process started with this
folder on PYTHONPATH and SGLANG_GPU_STANDIN=1: the driver and the scheduler / detokenizer processes SGLang spawns.
Then hands over to any sitecustomize further down sys.path (e.g. the distribution's own)."""
import os
import sys

if os.environ.get("SGLANG_GPU_STANDIN", "0") == "1":
    import sglang_gpu_patches

    sglang_gpu_patches.install()

_here = os.path.dirname(os.path.abspath(__file__))
for _p in sys.path:
    if _p and os.path.abspath(_p) != _here and os.path.isfile(os.path.join(_p, "sitecustomize.py")):
        import importlib.util as _u

        _spec = _u.spec_from_file_location("_next_sitecustomize", os.path.join(_p, "sitecustomize.py"))
        _mod = _u.module_from_spec(_spec)
        try:
            _spec.loader.exec_module(_mod)
        except Exception:
            pass
        break
