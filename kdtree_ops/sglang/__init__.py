"""SGLang integration: the `kdtree` attention backend and the plugin entry point that registers it.

`plugin.register` is what SGLang's `load_plugins()` runs (entry point group `sglang.srt.plugins`); it
imports nothing heavy. `backend.KDTreeAttnBackend` is imported only when SGLang builds the backend.
"""
