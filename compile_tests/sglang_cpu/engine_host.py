"""The test side of engine_driver.py: starts the driver process and sends it requests (TEST ONLY)."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
from pathlib import Path

from .engine_driver import driver_env

REPLY_TIMEOUT_S = 600


class EngineError(RuntimeError):
    pass


# Engine settings per platform: the CPU engine's tests run float32 without graphs; the GPU's what users run.
PLATFORM_SETTINGS = {
    "cpu": dict(device="cpu", dtype="float32", mem_fraction_static=0.5, max_total_tokens=4096,
                disable_cuda_graph=True),
    "gpu": dict(device="cuda", dtype="bfloat16", mem_fraction_static=0.5, disable_cuda_graph=False),
}


def cpu_tp_env(tp_size: int) -> dict:
    """The environment SGLang 0.5.23's CPU engine needs for tp_size > 1 (its ranks talk over gloo):

    - SGLANG_CPU_OMP_THREADS_BIND: without it SGLang asserts a NUMA node per rank (utils/numa_utils.py:463,
      init_threads_binding; this machine has one); the machine's cores are split among the ranks (shared when
      there are fewer cores than ranks);
    - SGLANG_NCCL_SO_PATH naming no library: with a CUDA build of torch SGLang finds libnccl and builds a pynccl
      communicator for the CPU group too (distributed/parallel_state.py:2180-2185 opts out NPU/XPU only), which
      fails in `torch.cuda.device(cpu)` (device_communicators/pynccl.py:116: "Expected a cuda device, but got:
      cpu"); a library that does not load disables it (pynccl.py:73-79) and every collective runs on gloo.
    """
    if tp_size <= 1:
        return {}
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // tp_size)
    groups = [cores[(r * share) % len(cores): (r * share) % len(cores) + share] for r in range(tp_size)]
    return {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups),
            "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so.2"}


class EngineHost:
    """One driver process; `start(...)` replaces its Engine. SGLang's log goes to `log_path`."""

    def __init__(self, platform: str = "cpu", log_path: Path | None = None, reply_timeout_s: int = REPLY_TIMEOUT_S):
        self.platform = platform
        self.reply_timeout_s = reply_timeout_s
        if log_path is None:
            log_path = Path(tempfile.mkstemp(prefix="kdtree_engine_", suffix=".log")[1])
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "sglang_cpu.engine_driver"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env=driver_env(platform=platform), cwd=str(Path(__file__).resolve().parents[1]))
        self._log_offset = 0

    def log_tail(self, chars: int = 6000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def new_log(self) -> str:
        """The log written since the last call (one engine's lines, for the tests that read them)."""
        self._log.flush()
        text = self.log_path.read_text(errors="replace")
        new, self._log_offset = text[self._log_offset:], len(text)
        return new

    def request(self, cmd: str, **args) -> dict:
        if self.proc.poll() is not None:
            raise EngineError(f"the engine driver exited ({self.proc.returncode}); its log:\n{self.log_tail()}")
        self.proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self.proc.stdin.flush()
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(self.reply_timeout_s):
                raise EngineError(f"no reply to {cmd!r} in {self.reply_timeout_s} s; the log:\n{self.log_tail()}")
        line = self.proc.stdout.readline()
        if not line:
            raise EngineError(f"the engine driver died during {cmd!r}; its log:\n{self.log_tail()}")
        reply = json.loads(line)
        if not reply.pop("ok"):
            raise EngineError(f"{cmd} failed: {reply['error']}\nthe log:\n{self.log_tail()}")
        return reply

    def start(self, model_path: str, env: dict | None = None, **engine) -> None:
        settings = dict(model_path=model_path, log_level="info", random_seed=0, **PLATFORM_SETTINGS[self.platform])
        settings.update(engine)
        if self.platform == "cpu":  # the GPU's ranks need nothing of the kind (NCCL, one process a GPU)
            env = {**cpu_tp_env(int(settings.get("tp_size", 1))), **(env or {})}
        self.request("start", engine=settings, env=env or {})

    def generate(self, input_ids, max_new_tokens: int, top_logprobs_num: int = 0) -> list:
        params = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}
        return self.request("generate", input_ids=input_ids, sampling_params=params,
                            top_logprobs_num=top_logprobs_num)["outputs"]

    def kdtree_status(self) -> list:
        """The status of every kdtree backend of the engine's scheduler (plugin's internal-state hook)."""
        states = self.request("server_info")["internal_states"]
        return states[0].get("kdtree", [])

    def kdtree_ranks(self) -> list:
        """[{"tp_rank": r, "kdtree": [...], "ddtree": [...]}] for every TP rank of the engine (the plugin's hook)."""
        states = self.request("server_info")["internal_states"]
        return states[0].get("kdtree_ranks", [])

    def stop(self) -> None:
        self.request("stop")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.request("exit")
                self.proc.wait(timeout=120)
            except Exception:
                self.proc.kill()
        self._log.close()
