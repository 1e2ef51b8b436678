"""The SGLang plugin against the real sglang 0.5.23, on the CPU.

Needs the package installed (`pip install -e .`: the entry point lives in its metadata). Set
SGLANG_CACHE_DIR (e.g. a temporary folder): importing sglang redirects caches there.

What is checked: the entry point is declared and loads `register`; in a freshly *spawned* process
`load_plugins()` registers `kdtree` (CLI choice, backend factory, DFLASH policy hook) without importing the
backend or the ops and without touching TritonAttnBackend; `launch_server --help` lists it; ServerArgs parsing
accepts it for --attention-backend and the prefill/decode variants; SGLANG_PLUGINS filters it; a failing
registration says so on stderr; the backend's module and its packed-mask metadata (CPU ops) behave.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

ENTRY_POINT_GROUP = "sglang.srt.plugins"
SUBPROCESS_TIMEOUT_S = 600


def _child_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.setdefault("SGLANG_CACHE_DIR", os.environ.get("SGLANG_CACHE_DIR") or "/tmp/kdtree_sglang_cache")
    env.pop("SGLANG_PLUGINS", None)
    env.update(extra)
    return env


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=_child_env(**env), timeout=SUBPROCESS_TIMEOUT_S)


# ---- entry point ---------------------------------------------------------------------------------------


def test_entry_point_is_declared_and_loads_register():
    eps = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == "kdtree"]
    assert eps, f"no 'kdtree' entry point in group {ENTRY_POINT_GROUP!r}: is the package installed (pip install -e .)?"
    assert eps[0].value == "kdtree_ops.sglang.plugin:register"
    from kdtree_ops.sglang import plugin

    assert eps[0].load() is plugin.register


# ---- a freshly spawned process ---------------------------------------------------------------------------


def _spawned_load_plugins(queue) -> None:
    """Runs in a spawned interpreter: what SGLang's scheduler/TP processes do at start."""
    try:
        import inspect

        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        before = {name: member for name, member in vars(TritonAttnBackend).items()}
        from sglang.srt.plugins import load_plugins

        load_plugins()
        from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
        from sglang.srt.speculative import dflash_utils

        after = {name: member for name, member in vars(TritonAttnBackend).items()}
        changed = sorted(n for n in set(before) | set(after) if before.get(n) is not after.get(n))
        named = {name: type(name, (), {})() for name in ("KDTreeAttnBackend", "TritonAttnBackend", "OtherBackend")}
        named["KDTreeAttnBackend"].base = named["TritonAttnBackend"]  # kdtree over triton
        over_other = type("KDTreeAttnBackend", (), {})()
        over_other.base = named["OtherBackend"]
        named["KDTreeAttnBackend over OtherBackend"] = over_other
        factory = ATTENTION_BACKENDS.get("kdtree")
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        ddtree = SpeculativeAlgorithm.from_string("ddtree")
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

        queue.put({
            "graph_spec_info_hooked": getattr(DecodeCudaGraphRunner.get_spec_info, "__wrapped__", None) is not None,
            "ddtree": [type(ddtree).__name__, ddtree.name, ddtree.is_speculative(), ddtree.is_dflash()],
            "registered": factory is not None,
            "factory": f"{factory.__module__}.{factory.__qualname__}" if factory else None,
            "choice": ATTENTION_BACKEND_CHOICES.count("kdtree"),
            "triton_changed": changed,
            "hooked": hasattr(dflash_utils.resolve_dflash_verify_mask_policy, "__wrapped__"),
            "policy": {n: list(dflash_utils.resolve_dflash_verify_mask_policy(o)) for n, o in named.items()},
            "lazy": {m: m in sys.modules for m in ("kdtree_ops.sglang.backend", "kdtree_ops.ops",
                                                   "kdtree_ops.sglang.ddtree_worker",
                                                   "kdtree_ops.sglang.ddtree_spec_info")},
            "cached_build": bool(getattr(sys.modules.get("kdtree_ops.build"), "_loaded_library", None)),
            "register_src": inspect.getsourcefile(factory) if factory else None,
        })
    except BaseException as exc:  # report, never hang the parent
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def test_spawned_process_load_plugins_registers_kdtree():
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    os.environ.setdefault("SGLANG_CACHE_DIR", _child_env()["SGLANG_CACHE_DIR"])
    saved = os.environ.pop("SGLANG_PLUGINS", None)
    try:
        proc = ctx.Process(target=_spawned_load_plugins, args=(queue,))
        proc.start()
        result = queue.get(timeout=SUBPROCESS_TIMEOUT_S)
        proc.join(timeout=60)
    finally:
        if saved is not None:
            os.environ["SGLANG_PLUGINS"] = saved
    assert "error" not in result, result.get("error")
    assert result["registered"] and result["factory"] == "kdtree_ops.sglang.plugin.create_kdtree_backend"
    assert result["choice"] == 1
    assert result["triton_changed"] == [], "load_plugins() must leave TritonAttnBackend's members untouched"
    # DFLASH picks its verify mask policy by class name: a kdtree backend gets its base's (triton: no custom mask).
    assert result["hooked"]
    assert result["policy"]["KDTreeAttnBackend"] == ["KDTreeAttnBackend", False]
    assert result["policy"]["KDTreeAttnBackend over OtherBackend"] == ["KDTreeAttnBackend", True]
    assert result["policy"]["TritonAttnBackend"] == ["TritonAttnBackend", False]
    assert result["policy"]["OtherBackend"] == ["OtherBackend", True]
    # register() is cheap: the backend module is not imported, and the ops library is loaded only where a finished
    # build for this machine was cached (import kdtree_ops: a dlopen, no compiling).
    assert result["lazy"] == {"kdtree_ops.sglang.backend": False, "kdtree_ops.ops": result["cached_build"],
                              "kdtree_ops.sglang.ddtree_worker": False, "kdtree_ops.sglang.ddtree_spec_info": False}
    # --speculative-algorithm DDTREE comes from the same entry point (its worker imported only when built), and its
    # decode graphs are captured with its spec info (the AFTER hook on DecodeCudaGraphRunner.get_spec_info).
    assert result["ddtree"] == ["DDTreeAlgorithm", "DDTREE", True, False]
    assert result["graph_spec_info_hooked"]


def test_launch_server_help_lists_kdtree():
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--help"], capture_output=True,
                          text=True, env=_child_env(), timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    help_text = " ".join(proc.stdout.split())  # argparse wraps the choice lists
    assert "--attention-backend" in help_text
    assert "kdtree" in help_text, "launch_server --help does not list the kdtree backend"


def test_failing_registration_is_visible():
    # Simulates a broken SGLang registry in a child process (the package itself patches nothing).
    proc = _run_python(
        """
        import sglang.srt.layers.attention.attention_registry as registry
        def broken(name):
            raise RuntimeError("registry unavailable (simulated)")
        registry.register_attention_backend = broken
        from sglang.srt.plugins import load_plugins
        load_plugins()
        from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
        print("STATE", "kdtree" in registry.ATTENTION_BACKENDS, "kdtree" in ATTENTION_BACKEND_CHOICES)
        """,
        SGLANG_PLUGINS="kdtree",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "kdtree_ops: FAILED to register" in line]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "registry unavailable (simulated)" in lines[0]
    assert "STATE False False" in proc.stdout  # rolled back: no CLI choice without its factory


def test_status_line_shows_in_a_default_launch_server_log():
    """What `python -m sglang.launch_server` runs before the model: load_plugins() (logging not configured yet),
    the arguments, then the engine's configure_logger. The success line comes once, after it, formatted."""
    proc = _run_python(
        """
        import sys
        from sglang.srt.plugins import load_plugins
        load_plugins()
        print("MARK plugins loaded", file=sys.stderr, flush=True)
        from sglang.srt.server_args import prepare_server_args
        args = prepare_server_args(["--model-path", "dummy/model"])
        from sglang.srt.entrypoints.engine import configure_logger  # the binding Engine calls
        configure_logger(args)
        configure_logger(args)
        """,
        HF_HUB_OFFLINE="1",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, _, after = proc.stderr.partition("MARK plugins loaded")
    assert after, proc.stderr[-3000:]
    line = "kdtree_ops: registered SGLang attention backend 'kdtree'"
    assert line not in before
    matches = re.findall(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] (kdtree_ops: registered .*)$", after, re.M)
    assert len(matches) == 1 and matches[0].startswith(line), proc.stderr[-3000:]


def test_register_logs_one_line_on_success():
    proc = _run_python(
        """
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        from kdtree_ops.sglang import plugin
        plugin.register(); plugin.register()
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("kdtree_ops: registered SGLang attention backend 'kdtree'") == 1, proc.stderr[-3000:]


# ---- in this process ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registered():
    from kdtree_ops.sglang import plugin

    plugin.register()
    return plugin


def test_register_is_idempotent(registered):
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.plugins.hook_registry import HookRegistry

    registered.register()
    registered.register()
    assert ATTENTION_BACKEND_CHOICES.count("kdtree") == 1
    assert ATTENTION_BACKENDS["kdtree"] is registered.create_kdtree_backend
    ours = [h for _, h, _ in HookRegistry._hooks[registered.DFLASH_POLICY_TARGET]
            if h is registered.dflash_verify_mask_policy_hook]
    assert len(ours) == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["--attention-backend", "kdtree"],
        ["--prefill-attention-backend", "kdtree"],
        ["--decode-attention-backend", "kdtree"],
        ["--attention-backend", "kdtree", "--prefill-attention-backend", "kdtree",
         "--decode-attention-backend", "triton", "--speculative-draft-attention-backend", "triton"],
    ],
    ids=["attention", "prefill", "decode", "mixed"],
)
def test_server_args_accept_kdtree(registered, argv):
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", "dummy/model", *argv])
    given = dict(zip(argv[::2], argv[1::2]))
    for flag, value in given.items():
        assert getattr(args, flag.lstrip("-").replace("-", "_")) == value


def test_sglang_plugins_allow_list(monkeypatch):
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

    monkeypatch.setenv("SGLANG_PLUGINS", "kdtree")
    allowed = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    assert "kdtree" in allowed and set(allowed) == {"kdtree"}
    monkeypatch.setenv("SGLANG_PLUGINS", "some-other-plugin")
    assert "kdtree" not in load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    monkeypatch.delenv("SGLANG_PLUGINS")
    assert "kdtree" in load_plugins_by_group(GENERAL_PLUGINS_GROUP)


def test_dflash_policy_hook_answers_the_base_s_policy(registered):
    from types import SimpleNamespace

    from kdtree_ops.sglang.plugin import dflash_verify_mask_policy_hook

    kdtree = type("KDTreeAttnBackend", (), {})()
    kdtree.base = type("TritonAttnBackend", (), {})()
    assert dflash_verify_mask_policy_hook(("KDTreeAttnBackend", True), kdtree) == ("KDTreeAttnBackend", False)
    kdtree.base = type("IntelAMXAttnBackend", (), {})()  # not in SGLang's skip list: DFLASH builds the mask
    assert dflash_verify_mask_policy_hook(("KDTreeAttnBackend", True), kdtree) == ("KDTreeAttnBackend", True)
    wrapped = SimpleNamespace(full_attn_backend=kdtree)  # under a linear-attention wrapper, as SGLang resolves it
    assert dflash_verify_mask_policy_hook(("KDTreeAttnBackend", True), wrapped) == ("KDTreeAttnBackend", True)
    assert dflash_verify_mask_policy_hook(("FlashInferAttnBackend", False), object()) is None
    assert dflash_verify_mask_policy_hook(("TorchNativeAttnBackend", True), object()) is None


def test_internal_state_hook_reports_live_backends(registered):
    """The scheduler's get_internal_state answer gains the process's kdtree backends' status (plain values), and
    the same per TP rank (the engine at tp_size=2 gathers two: test_sglang_tp_engine.py)."""
    import sys
    from types import SimpleNamespace

    from kdtree_ops.sglang.plugin import RANKS_STATE_KEY, STATE_KEY, internal_state_hook

    result = SimpleNamespace(internal_state={"other": 1})
    if "kdtree_ops.sglang.backend" not in sys.modules:  # no backend module: nothing to report, nothing imported
        assert internal_state_hook(result, object()) is None and result.internal_state == {"other": 1}
        assert "kdtree_ops.sglang.backend" not in sys.modules
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from sglang_rig import Rig

    rig = Rig()
    rig.backend.op_calls[1] = 3
    assert internal_state_hook(result, object()) is None
    (status,) = [s for s in result.internal_state[STATE_KEY] if s["op_calls"] == {"1": 3}]
    assert status["base"] == "triton" and status["verify_mode"] == "on" and "everything else by triton" in status["status"]
    (rank,) = result.internal_state[RANKS_STATE_KEY]  # one process, no TP group: this rank alone, as rank 0
    assert rank["tp_rank"] == 0 and rank[STATE_KEY] == result.internal_state[STATE_KEY]
    json.dumps(result.internal_state)  # what SGLang ships across the process boundary


# ---- the backend module on the CPU ---------------------------------------------------------------------------


@pytest.mark.parametrize("value, mode", [(None, "on"), ("on", "on"), ("OFF", "off"), ("validate", "validate"),
                                         ("", "on")])
def test_verify_mode_from_env(monkeypatch, value, mode):
    from kdtree_ops.sglang.backend import verify_mode_from_env

    if value is None:
        monkeypatch.delenv("KDTREE_VERIFY", raising=False)
    else:
        monkeypatch.setenv("KDTREE_VERIFY", value)
    assert verify_mode_from_env() == mode


def test_verify_mode_rejects_unknown(monkeypatch):
    from kdtree_ops.sglang.backend import verify_mode_from_env

    monkeypatch.setenv("KDTREE_VERIFY", "fast")
    with pytest.raises(ValueError, match="KDTREE_VERIFY must be one of off|validate|on"):
        verify_mode_from_env()


# ---- validate statistics ------------------------------------------------------------------------------------


def test_divergence_stats_layout_matches_validate_summary():
    """validate mode reads stats[3] = (max |out - ref| over finite out, non-finite count, calls)."""
    import torch

    from kdtree_ops import ops

    stats = torch.zeros(3, dtype=torch.float32)
    ref = torch.zeros(4, 8)
    out = ref.clone()
    out[0, 0] = 0.25
    out[1, 1] = float("nan")
    ops.record_divergence(out, ref, stats)
    ops.record_divergence(ref, ref, stats)
    max_abs, non_finite, calls = stats.tolist()
    assert max_abs == pytest.approx(0.25) and non_finite == 1 and calls == 2
