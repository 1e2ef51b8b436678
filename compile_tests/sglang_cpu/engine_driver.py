"""Runs sglang.Engine in a process of its own and answers requests over a pipe (TEST ONLY).

Why a process: SGLang decides its platform once per process, when it is imported (`SGLANG_USE_CPU_ENGINE=1` makes
`is_cpu()` true and its CPU paths live), and the pytest process has imported sglang without it for the other
SGLang suites. The driver sets the platform's environment before importing sglang, puts the platform's test-only
`sgl_kernel` stand-in first on PYTHONPATH (so SGLang's spawned scheduler processes import it too), and keeps one
Engine at a time; a test module starts one per configuration. Platforms: `cpu` (the CPU engine, CI) and `gpu` (a
CUDA machine where sglang-kernel cannot load: sglang_gpu/stand_in, its post-import patches switched on).

Protocol: one JSON object per line. The driver's stdout carries only the replies (SGLang's own prints go to
stderr); each reply is {"ok": true, ...} or {"ok": false, "error": "..."}.
  {"cmd": "start", "engine": {Engine kwargs}, "env": {variables set before the Engine is built}}
  {"cmd": "generate", "input_ids": [[...], ...], "sampling_params": {...}, "top_logprobs_num": 0 | k,
   "logprob_start_len": None | n (or one per request)}
      -> {"outputs": [{"output_ids": [...], "meta_info": {...}}, ...]}
  {"cmd": "server_info"} -> {"internal_states": [...]} (the plugin's `kdtree` entry is in each)
  {"cmd": "stop"} / {"cmd": "exit"}
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
REPO = TESTS.parent
STAND_IN = HERE / "stand_in"
GPU_STAND_IN = TESTS / "sglang_gpu" / "stand_in"
PLATFORM_ENV = {
    "cpu": (STAND_IN, {"SGLANG_USE_CPU_ENGINE": "1"}),
    # sglang_gpu/stand_in/sitecustomize.py installs the post-import patches when SGLANG_GPU_STANDIN=1
    "gpu": (GPU_STAND_IN, {"SGLANG_GPU_STANDIN": "1"}),
}


def driver_env(base: dict | None = None, platform: str = "cpu") -> dict:
    """The environment of a driver (and so of SGLang's scheduler processes): the platform's switches, offline,
    its stand-in first on PYTHONPATH."""
    stand_in, switches = PLATFORM_ENV[platform]
    env = dict(os.environ if base is None else base)
    paths = [str(stand_in), str(REPO), str(TESTS)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
               **switches)
    env.setdefault("SGLANG_CACHE_DIR", "/tmp/kdtree_sglang_cache")
    return env


def _plain(value):
    """JSON-able copy (SGLang's meta info holds tuples and numpy scalars)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):
        return value.item()
    return value


class Driver:
    def __init__(self):
        self.engine = None
        self._env = dict(os.environ)  # each engine starts from the driver's own environment

    def start(self, engine: dict, env: dict) -> dict:
        import sglang

        self.stop()
        os.environ.clear()
        os.environ.update(self._env)
        os.environ.update({k: str(v) for k, v in env.items()})  # the scheduler processes inherit it
        self.engine = sglang.Engine(**engine)
        return {}

    def generate(self, input_ids, sampling_params, top_logprobs_num: int = 0, logprob_start_len=None) -> dict:
        kwargs = dict(return_logprob=True, top_logprobs_num=top_logprobs_num) if top_logprobs_num else {}
        if logprob_start_len is not None:  # log-probs of the input's tokens from there on (scoring a given text)
            kwargs.update(return_logprob=True, logprob_start_len=logprob_start_len)
        outs = self.engine.generate(input_ids=input_ids, sampling_params=sampling_params, **kwargs)
        return {"outputs": [{"output_ids": o["output_ids"], "meta_info": _plain(o["meta_info"])} for o in outs]}

    def server_info(self) -> dict:
        return {"internal_states": _plain(self.engine.get_server_info()["internal_states"])}

    def stop(self) -> dict:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        return {}


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # SGLang's prints and progress bars go to stderr
    driver = Driver()
    for line in sys.stdin:
        request = json.loads(line)
        cmd = request.pop("cmd")
        try:
            if cmd == "exit":
                driver.stop()
                replies.write(json.dumps({"ok": True}) + "\n")
                break
            reply = getattr(driver, cmd)(**request)
            replies.write(json.dumps({"ok": True, **reply}) + "\n")
        except Exception as exc:  # the test shows it; the driver stays up for the next request
            traceback.print_exc()
            replies.write(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")


if __name__ == "__main__":
    main()
