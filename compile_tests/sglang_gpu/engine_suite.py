"""Real sglang.Engines on a GPU, CUDA graphs on, through kdtree: every speculative algorithm against no speculation.

    cd compile_tests && python -m sglang_gpu.engine_suite --out DIR [--models tiny,mla,llama8b] [--only REGEX]
        [--tp2 auto|on|off]

Run on the GPU machine after `. gpu-engine/setup.sh compile_tests/sglang_gpu/stand_in --no-jit` (examples/gpu_suite.sh,
part `engine`). For each model (sglang_gpu/engine_models.py: targets built so that their drafters agree with them part
of the time) it starts one Engine per configuration in the driver process of sglang_cpu/engine_driver.py (platform
`gpu`), generates the same greedy requests, and records per configuration: the output ids, tokens per verify step,
tokens/s, the kdtree backend's and the DDTREE worker's status (op calls at capture, and the device-side count of op
calls, which replayed graphs advance), and the error with the log's tail when it fails.

Lossless, checked two ways against the model's non-speculative engine (same server settings, graphs on):
- `equal`: the output ids equal the non-speculative engine's; where they differ, the position of the first
  difference and the reference's top-2 log-prob margin there;
- `greedy check`: the non-speculative engine scores every speculative output (prefill of prompt + output, the top-2
  log-probs at each output position): each emitted token must be the target's greedy token given the emitted prefix,
  or within NEAR_TIE nats of it. In bf16 two kernels (decode vs verify) legitimately split a near-tie either way, so
  exact equality alone would fail at the first such position; every token is checked, and the near-ties taken are
  counted.

Tensor parallelism (`--tp2`, by default on where two GPUs are visible): the same model at tp_size=2, one process a
GPU over NCCL with NVLink multicast off (TP2_ENV), configurations `*-tp2`: no speculation, NGRAM, EAGLE topk 4 and
DDTREE at budgets 16 and 64, compared with the tp_size=1 reference like the others (so equal to tp_size=1 and to no
speculation), their tokens/s beside tp_size=1's, and the plugin's status from each rank (`kdtree_ranks`: op calls and
the device-side count of each rank's replays). `--platform cpu --tp2 on` runs them on the CPU engine over gloo.

A call that stopped before its scoring leaves its greedy runs unscored: `--score-only` scores them afterwards with the
reference engine of `--platform` (on the CPU: the float32 target judges the GPU's bf16 tokens, a stricter judge; the
check line says `scored_on`).

Writes DIR/results.jsonl (a line per configuration as it finishes, so a stopped run keeps what ran; a line per scored
configuration) and DIR/summary.md; exits 1 when a configuration failed or a token failed the greedy check.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from sglang_cpu.engine_host import EngineHost  # noqa: E402
from sglang_cpu.tiny_models import plain_rope_as_yarn  # noqa: E402
from sglang_gpu import engine_models  # noqa: E402

NEAR_TIE = 0.1  # nats: a bf16 greedy choice this close to the runner-up may go either way (module docstring)
NEW_TOKENS = 64
PROMPT_LENS = (5, 17, 40, 23)
KDTREE = dict(attention_backend="kdtree")
# Per platform: the reference engine's backend and kdtree's base. The suite is for the GPU; `--platform cpu` runs the
# same harness on the CPU engine (graphs off, float32), a check of the harness itself.
PLATFORMS = {"gpu": ("triton", {"KDTREE_BASE_BACKEND": "triton", "KDTREE_VERIFY_COUNT": "1"}),
             "cpu": ("torch_native", {"KDTREE_VERIFY_COUNT": "1"})}
DDTREE_BUDGETS = (16, 64, 256, 1023)
SAMPLED = {"temperature": 0.7, "top_p": 0.9}
# tp_size=2 on GPUs: NVLink multicast stays off in NCCL, PyTorch's symmetric memory and NVSHMEM (the lent machines'
# rule: a program using it can take the host's shared GPUs out of service); the engines inherit these variables.
TP2_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TP2_DDTREE_BUDGETS = (16, 64)


def prompts(vocab_words: range) -> list:
    rng = random.Random(0)
    return [[rng.choice(vocab_words) for _ in range(n)] for n in PROMPT_LENS]


def visible_gpus() -> int:
    """GPUs the engines can use: CUDA_VISIBLE_DEVICES' entries where set, else `nvidia-smi -L`'s; 0 without either."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def configurations(models: dict, platform: str = "gpu", tp2: bool = False) -> list:
    """(name, engine kwargs, env, sampled) of one model, the reference first; with tp2, the `*-tp2` ones last."""
    plain, base = PLATFORMS[platform]
    draft_backend = {"speculative_draft_attention_backend": "triton" if platform == "gpu" else "intel_amx"}
    eagle = dict(speculative_algorithm="EAGLE", speculative_draft_model_path=models["eagle"],
                 speculative_num_steps=3, speculative_eagle_topk=4, speculative_num_draft_tokens=8, **draft_backend)
    dflash = dict(speculative_algorithm="DFLASH", speculative_draft_model_path=models["dflash"], **draft_backend)
    ngram = dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=8)

    def ddtree(budget: int) -> dict:
        return dict(speculative_algorithm="DDTREE", speculative_draft_model_path=models["dflash"],
                    speculative_num_draft_tokens=budget)

    # torch.compile costs ~25 s a captured batch size at start-up (tiny model, H100): KDTREE_ENGINE_COMPILE_BS lowers
    # the largest compiled size where a call's time is short (sizes above it replay uncompiled graphs)
    compiled = dict(enable_torch_compile=True, torch_compile_max_bs=int(os.environ.get("KDTREE_ENGINE_COMPILE_BS", 4)))
    configs = [("none", dict(attention_backend=plain), {}, False),
               ("ngram", dict(KDTREE, **ngram), base, False),
               ("eagle", dict(KDTREE, **eagle), base, False),
               ("dflash", dict(KDTREE, **dflash), base, False)]
    configs += [(f"ddtree{n}", dict(KDTREE, **ddtree(n)), base, False) for n in DDTREE_BUDGETS]
    # the suite's 4-request batch under a budget policy: trees of 16 from the draft step's graphs (DDTREE's default)
    # and the verify's graphs of width 16 (-graphs); plain decode through the verify's graphs of width 1 (-plain);
    # the draft step run eagerly (-eager: KDTREE_DDTREE_DRAFT_GRAPHS=0)
    configs += [("ddtree64-graphs", dict(KDTREE, **ddtree(64)), {**base, "KDTREE_DDTREE_BUDGETS": "1:64,4:16"}, False),
                ("ddtree64-eager", dict(KDTREE, **ddtree(64)), {**base, "KDTREE_DDTREE_DRAFT_GRAPHS": "0"}, False),
                ("ddtree64-plain", dict(KDTREE, **ddtree(64)), {**base, "KDTREE_DDTREE_BUDGETS": "1:64,4:1"}, False)]
    configs += [("ddtree64-overlap", dict(KDTREE, **ddtree(64)), {**base, "KDTREE_DDTREE_OVERLAP": "1"}, False),
                ("eagle-compile", dict(KDTREE, **eagle, **compiled), base, False),
                ("ddtree64-compile", dict(KDTREE, **ddtree(64), **compiled), base, False),
                ("ddtree64-sampled", dict(KDTREE, **ddtree(64)), base, True),
                ("none-sampled", dict(attention_backend=plain), {}, True)]
    if tp2:
        two = dict(tp_size=2)
        configs += [("none-tp2", dict(attention_backend=plain, **two), TP2_ENV, False),
                    ("ngram-tp2", dict(KDTREE, **ngram, **two), {**base, **TP2_ENV}, False),
                    ("eagle-tp2", dict(KDTREE, **eagle, **two), {**base, **TP2_ENV}, False)]
        configs += [(f"ddtree{n}-tp2", dict(KDTREE, **ddtree(n), **two), {**base, **TP2_ENV}, False)
                    for n in TP2_DDTREE_BUDGETS]
    return configs


def first_differences(ids: list, ref_ids: list, ref_margins: list) -> dict:
    """Whether the ids equal the reference's; per differing request, the first position and the reference's margin."""
    diffs = []
    for r, (got, want, margin) in enumerate(zip(ids, ref_ids, ref_margins)):
        pos = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
        if pos is not None:
            diffs.append({"request": r, "position": pos, "ref_margin": round(margin[pos], 4)})
    return {"equal": not diffs, "differences": diffs}


def margins(outputs: list) -> list:
    """Per request, the top-2 log-prob margin of every output token (output_top_logprobs)."""
    return [[top[0][0] - top[1][0] for top in o["meta_info"]["output_top_logprobs"]] for o in outputs]


def greedy_check(batch: list, ids: list, scored: list) -> dict:
    """Each emitted token against the reference's top-2 at its position (scored: the reference's replies to
    prompt + output with logprob_start_len = len(prompt) - 1: entry j + 1 is the distribution of output token j;
    SGLang leaves the first entry, the start token's own, empty)."""
    checked = near_ties = 0
    violations = []
    for r, (prompt, out, reply) in enumerate(zip(batch, ids, scored)):
        tops = reply["meta_info"]["input_top_logprobs"][1:]
        for i, token in enumerate(out[: len(tops)]):
            (lp1, id1, *_), (lp2, id2, *_) = tops[i][0], tops[i][1]
            checked += 1
            if token == id1:
                continue
            if token == id2 and lp1 - lp2 < NEAR_TIE:
                near_ties += 1
                continue
            violations.append({"request": r, "position": i, "token": token, "greedy": id1,
                               "margin": round(lp1 - lp2, 4)})
    return {"checked": checked, "near_ties_taken": near_ties, "violations": violations[:20],
            "num_violations": len(violations)}


def score(host: EngineHost, model_path: str, engine: dict, batch: list, records: list, env: dict | None = None) -> list:
    """The reference engine scores every greedy speculative output (greedy_check); one result line per record."""
    lines = []
    host.start(model_path, env=env, **engine)
    try:
        for record in records:
            ids = record["ids"]
            inputs = [p + o for p, o in zip(batch, ids)]
            reply = host.request("generate", input_ids=inputs, top_logprobs_num=2,
                                 logprob_start_len=[len(p) - 1 for p in batch],
                                 sampling_params={"max_new_tokens": 1, "temperature": 0.0})
            lines.append({"model": record["model"], "config": record["config"],
                          "greedy_check": greedy_check(batch, ids, reply["outputs"])})
    finally:
        host.stop()
    return lines


def accept_stats(outputs: list) -> dict:
    verify = sum(o["meta_info"].get("spec_verify_ct", 0) or 0 for o in outputs)
    tokens = sum(o["meta_info"].get("completion_tokens", 0) or 0 for o in outputs)
    return {"verify_steps": verify, "tokens": tokens,
            "tokens_per_verify": round(tokens / verify, 3) if verify else None}


def run_config(host: EngineHost, model_path: str, name: str, engine: dict, env: dict, sampled: bool,
               batch: list, reference: dict | None) -> dict:
    record = {"config": name, "engine": engine, "env": env}
    t0 = time.monotonic()
    try:
        host.start(model_path, env=env, **engine)
        record["startup_s"] = round(time.monotonic() - t0, 1)
        params = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}
        if sampled:
            params = [dict(params, **SAMPLED, sampling_seed=1000 + i) for i in range(len(batch))]
        host.request("generate", input_ids=batch[:1],
                     sampling_params={"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True})
        t1 = time.monotonic()
        reply = host.request("generate", input_ids=batch, sampling_params=params,
                             **({"top_logprobs_num": 2} if reference is None and not sampled else {}))
        seconds = time.monotonic() - t1
        outputs = reply["outputs"]
        record.update(ok=True, seconds=round(seconds, 3), ids=[o["output_ids"] for o in outputs],
                      **accept_stats(outputs))
        record["tokens_per_s"] = round(record["tokens"] / seconds, 1) if seconds else None
        if reference is None and not sampled:
            record["margins"] = margins(outputs)
        states = host.request("server_info")["internal_states"]
        record["kdtree"] = states[0].get("kdtree", []) if states else []
        record["ddtree"] = states[0].get("ddtree", []) if states else []
        record["kdtree_ranks"] = states[0].get("kdtree_ranks", []) if states else []
        if reference is not None and not sampled:
            record["compare"] = first_differences(record["ids"], reference["ids"], reference["margins"])
    except Exception as exc:  # noqa: BLE001 - a failing configuration is a result; the next one still runs
        record.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:4000], traceback=traceback.format_exc()[-3000:])
    finally:
        try:
            host.stop()
        except Exception as exc:  # noqa: BLE001
            record.setdefault("stop_error", str(exc)[:1000])
        record["log_tail"] = host.new_log()[-6000:]
    record["wall_s"] = round(time.monotonic() - t0, 1)
    return record


def _write(path: Path, line: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(line) + "\n")


def write_checks(results: Path, model: str, lines: list, platform: str) -> None:
    """Appends score()'s check lines, each naming the platform whose reference scored it, and prints them."""
    for line in lines:
        g = line["greedy_check"]
        g["scored_on"] = platform
        _write(results, line)
        print(f"--- {model}/{line['config']}: greedy check {g['checked']} tokens, {g['near_ties_taken']} "
              f"near-ties taken, {g['num_violations']} violations", flush=True)


def unscored(results: Path) -> tuple[dict | None, list]:
    """The reference record and the greedy records of a results.jsonl that no greedy check line scores yet."""
    reference, last = None, {}  # a check line scores the last run of its configuration before it (engine_report)
    for line in (json.loads(x) for x in results.read_text().splitlines() if x.strip()):
        if "greedy_check" in line:
            last.pop(line["config"], None)
        elif line.get("config") == "none" and line.get("ok"):
            reference = line
        elif line.get("ok") and line.get("ids") and line.get("compare") is not None:
            last[line["config"]] = line
        else:
            last.pop(line.get("config"), None)
    return reference, list(last.values())


def cpu_loadable(target: Path) -> str:
    """The target as the CPU engine can load it: an MLA model without rope scaling gets a copy whose config names
    the identity YaRN (tiny_models.plain_rope_as_yarn; the same function), its weights linked, not copied."""
    config = json.loads((target / "config.json").read_text())
    if "kv_lora_rank" not in config or config.get("rope_scaling"):
        return str(target)
    copy = target.with_name(target.name + "-cpu")
    copy.mkdir(exist_ok=True)
    for item in target.iterdir():
        if item.name != "config.json" and not (copy / item.name).exists():
            (copy / item.name).symlink_to(item.resolve())
    config["rope_scaling"] = plain_rope_as_yarn(int(config["max_position_embeddings"]))
    (copy / "config.json").write_text(json.dumps(config, indent=1))
    return str(copy)


def score_earlier(model: str, paths: dict, args, out: Path, batch: list, new_host) -> None:
    """--score-only: this platform's reference engine scores the greedy records an earlier run left unscored in this
    folder (on the CPU: the float32 target judges a GPU run's bf16 tokens; each check line names its platform)."""
    results = out / "results.jsonl"
    reference, greedy = unscored(results)
    if reference is None or not greedy:
        print(f"--- {model}: nothing to score in {results}", flush=True)
        return
    engine, env = configurations(paths, args.platform)[0][1], {}
    target = paths["target"]
    if args.platform == "gpu":
        engine = dict(engine, **paths.get("engine", {}))
    else:
        target = cpu_loadable(Path(target))
        if target != paths["target"]:
            # MLA: torch_native cannot prefill DeepSeek attention on the CPU (test_sglang_engine.py, e.); kdtree
            # without speculation over intel_amx can
            engine, env = dict(KDTREE), {"KDTREE_BASE_BACKEND": "intel_amx"}
    host = new_host()
    try:
        write_checks(results, model, score(host, target, engine, batch, greedy, env), args.platform)
    finally:
        host.close()


def run_model(model: str, args, out: Path, start: float) -> None:
    """Every configuration of one model, then the scoring of their greedy outputs by the reference engine."""
    t0 = time.monotonic()
    paths = engine_models.build(model, Path("/tmp/kdtree_engine_models"))
    batch = prompts(paths["words"])
    print(f"=== {model}: checkpoints in {time.monotonic() - t0:.1f} s", flush=True)
    only = re.compile(args.only) if args.only else None
    results = out / "results.jsonl"

    def new_host() -> EngineHost:
        return EngineHost(platform=args.platform, log_path=out / f"{model}-{time.monotonic():.0f}.log",
                          reply_timeout_s=480)

    if args.score_only:
        score_earlier(model, paths, args, out, batch, new_host)
        return
    host = new_host()
    reference, greedy_records, ref_engine = None, [], None
    try:
        for name, engine, env, sampled in configurations(paths, args.platform, tp2=args.tp2):
            if reference is not None and only is not None and not only.search(f"{model}/{name}"):
                continue
            if time.monotonic() - start > args.budget_s:
                print(f"--- {model}/{name}: not started (budget)", flush=True)
                continue
            if args.platform == "gpu":
                engine = dict(engine, **paths.get("engine", {}))
            record = run_config(host, paths["target"], name, engine, env, sampled, batch, reference)
            record["model"] = model
            if not record.get("ok"):  # a crashed engine can take its driver down (SGLang kills its parent)
                host.close()
                host = new_host()
            _write(results, record)
            if name == "none":
                if not record.get("ok"):
                    print(f"--- {model}/none FAILED, the model's other configurations skipped: "
                          f"{record.get('error', '')[:600]}", flush=True)
                    return
                reference, ref_engine = record, engine
            elif record.get("ok") and not sampled:
                greedy_records.append(record)
            cmp = record.get("compare") or {}
            print(f"--- {model}/{name}: {'ok' if record.get('ok') else 'FAILED'} startup {record.get('startup_s')} s, "
                  f"{record.get('tokens_per_s')} tok/s, {record.get('tokens_per_verify')} tokens/verify, equal "
                  f"{cmp.get('equal')} {record.get('error', '')[:400]}", flush=True)
        if greedy_records and time.monotonic() - start <= args.budget_s + 60:
            host.close()  # a fresh driver: the last engine may have taken this one down with it
            host = new_host()
            write_checks(results, model, score(host, paths["target"], ref_engine, batch, greedy_records),
                         args.platform)
    finally:
        host.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="tiny,mla,llama8b")
    ap.add_argument("--only", default="", help="regex over 'model/config' names to run (the reference always runs)")
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no configuration after this many seconds")
    ap.add_argument("--score-only", action="store_true",
                    help="run no configuration: score the greedy records an earlier run (stopped before its scoring) "
                         "left in --out")
    ap.add_argument("--platform", choices=sorted(PLATFORMS), default="gpu")
    ap.add_argument("--tp2", choices=("auto", "on", "off"), default="auto",
                    help="the tp_size=2 configurations; auto: on the GPU where two GPUs are visible")
    args = ap.parse_args()
    gpus = visible_gpus() if args.platform == "gpu" else 0
    args.tp2 = args.tp2 == "on" or (args.tp2 == "auto" and gpus >= 2)
    print(f"=== tp_size=2 configurations: {'on' if args.tp2 else 'off'} ({gpus} GPUs visible)", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    for model in args.models.split(","):
        try:
            run_model(model, args, out, start)
        except Exception:  # noqa: BLE001 - a model that cannot be built or run must not stop the others
            traceback.print_exc()
            _write(out / "results.jsonl", {"model": model, "config": "(model)", "ok": False,
                                           "error": traceback.format_exc()[-3000:]})
    from sglang_gpu.engine_report import write_summary

    print(write_summary(out), flush=True)
    from sglang_gpu.engine_report import failures

    return 1 if failures(out) else 0


if __name__ == "__main__":
    sys.exit(main())
