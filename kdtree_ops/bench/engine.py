"""`python -m kdtree_ops bench --engine`: end-to-end tokens/s of SGLang engines, per speculative algorithm and batch.

    python -m kdtree_ops bench --engine --model-path TARGET --draft-model-path DFLASH_DRAFT \
        [--eagle-draft-model-path EAGLE_DRAFT] [--configs none,dflash,dflash-kdtree,ddtree16,ddtree64,...] \
        [--batch-sizes 1,4,16,32] [--new-tokens 128] [--prompts-file PROMPTS] [--base-backend triton] \
        [--engine-args JSON] [--out DIR]

Each configuration runs in a fresh process (SGLang keeps one Engine a process, and a crashed engine must not take
the others down) with CUDA graphs on (SGLang's default) unless --engine-args says otherwise. Per batch size B: the
timed batch run once untimed as its warm-up, then B greedy requests (the same prompts for every configuration: the
first B of --prompts-file, else random ids from --vocab-range) generating --new-tokens each with ignore_eos; a
drafter's agreement, and so the speculative rows, depend on the prompts: give yours. tokens/s = the batch's
completion tokens over its wall time, and tokens per verify step from SGLang's `spec_verify_ct`. Configurations:
- `none`: no speculation; `ngram`, `eagle`, `dflash`: SGLang's algorithm with its own verify (the base backend);
- `ngram-kdtree`, `eagle-kdtree`, `dflash-kdtree`: the same with `--attention-backend kdtree` (verify by the op);
- `ddtreeN`: DDTREE through kdtree with N tree tokens (the root and N - 1 drafts); `ddtreeN-overlap`: the same on
  SGLang's overlap scheduler (KDTREE_DDTREE_OVERLAP=1); `ddtreeN-graphs`: its drafter and tree build replay CUDA
  graphs (KDTREE_DDTREE_DRAFT_GRAPHS=1, DDTREE's default), and a row without -graphs runs them eagerly (=0);
  `ddtreeN[-graphs][-overlap]-budgets`: with the tree size per batch size of --ddtree-budgets (KDTREE_DDTREE_BUDGETS).
The table ends with DDTREE's tree size per batch size that it suggests (KDTREE_DDTREE_BUDGETS, ddtree_budgets.py;
a -budgets row counts at the width its policy gave each batch size).
With --profile, each DDTREE configuration runs again with KDTREE_DDTREE_PROFILE=1 (it synchronizes at each phase
boundary, so its tokens/s are not reported) for the round's time split: draft, tree build, verify, accept, commit,
host (the scheduler's work between two decode rounds, also given in us a round) and other (the batch's prefill and
the requests' way through the engine).
Writes DIR/engine_bench.json (a line per configuration), DIR/engine_bench.md and DIR/engine_bench.svg (tokens/s over
no speculation's per batch size: engine_plot.py, which also redraws it from a committed JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..sglang.ddtree_budgets import BudgetPolicy, parse_steps
from .engine_plot import svg_chart

PHASES = ("draft", "build", "verify", "accept", "commit")
DEFAULT_CONFIGS = "none,dflash,dflash-kdtree,ddtree16,ddtree64,ddtree256,ddtree1023"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kdtree_ops bench --engine", description=__doc__.splitlines()[0])
    p.add_argument("--engine", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model-path", required=True, help="the target model")
    p.add_argument("--draft-model-path", default=None, help="DFlash draft checkpoint (dflash*, ddtree*)")
    p.add_argument("--eagle-draft-model-path", default=None, help="EAGLE draft checkpoint (eagle*)")
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"comma-separated (default {DEFAULT_CONFIGS})")
    p.add_argument("--batch-sizes", default="1,4,16,32")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=64, help="tokens a random prompt (without --prompts-file)")
    p.add_argument("--vocab-range", default=None, help="LOW,HIGH: prompt ids (default 100 .. the model's vocab)")
    p.add_argument("--prompts-file", default=None,
                   help="text prompts, one a line, or a .jsonl file of {\"prompt\": TEXT} lines (the engine "
                        "tokenizes them; reused in turn when fewer than the largest batch size); default: random ids")
    p.add_argument("--base-backend", default=None,
                   help="the attention backend of the non-kdtree configurations and kdtree's base (default: SGLang's)")
    p.add_argument("--engine-args", default="{}", help="JSON of extra sglang.Engine arguments for every configuration")
    p.add_argument("--eagle-topk", type=int, default=4)
    p.add_argument("--ddtree-budgets", default=None,
                   help="KDTREE_DDTREE_BUDGETS of the ddtreeN-budgets configurations (e.g. 1:64,16:1)")
    p.add_argument("--profile", action="store_true", help="DDTREE's round time split (an extra, synchronizing run)")
    p.add_argument("--timeout-s", type=float, default=1800, help="per configuration")
    p.add_argument("--out", default="bench_results")
    return p


def engine_config(name: str, args) -> tuple[dict, dict]:
    """(sglang.Engine kwargs, environment) of a configuration name (module docstring)."""
    engine, env, given = dict(model_path=args.model_path), {}, name
    # DDTREE's suffixes, outermost first: ddtreeN[-graphs][-overlap][-budgets]
    for suffix, variable in (("-budgets", "KDTREE_DDTREE_BUDGETS"), ("-overlap", "KDTREE_DDTREE_OVERLAP"),
                             ("-graphs", "KDTREE_DDTREE_DRAFT_GRAPHS")):
        if name.startswith("ddtree") and name.endswith(suffix):
            env[variable] = _need(args.ddtree_budgets, "--ddtree-budgets") if suffix == "-budgets" else "1"
            name = name.removesuffix(suffix)
    if name.startswith("ddtree"):  # the draft graphs are DDTREE's default: a row without -graphs turns them off
        env.setdefault("KDTREE_DDTREE_DRAFT_GRAPHS", "0")
    kdtree = name.endswith("-kdtree") or name.startswith("ddtree")
    algorithm = name.removesuffix("-kdtree")
    if kdtree:
        engine["attention_backend"] = "kdtree"
        if args.base_backend:
            env["KDTREE_BASE_BACKEND"] = args.base_backend
    elif args.base_backend:
        engine["attention_backend"] = args.base_backend
    draft_backend = {"speculative_draft_attention_backend": args.base_backend} if args.base_backend else {}
    if algorithm == "none":
        pass
    elif algorithm == "ngram":
        engine.update(speculative_algorithm="NGRAM", speculative_num_draft_tokens=8)
    elif algorithm == "eagle":
        engine.update(speculative_algorithm="EAGLE", speculative_draft_model_path=_need(args.eagle_draft_model_path,
                                                                                        "--eagle-draft-model-path"),
                      speculative_num_steps=3, speculative_eagle_topk=args.eagle_topk,
                      speculative_num_draft_tokens=8, **draft_backend)
    elif algorithm == "dflash":
        engine.update(speculative_algorithm="DFLASH",
                      speculative_draft_model_path=_need(args.draft_model_path, "--draft-model-path"), **draft_backend)
    elif algorithm.startswith("ddtree") and algorithm[6:].isdigit():
        engine.update(speculative_algorithm="DDTREE", speculative_num_draft_tokens=int(algorithm[6:]),
                      speculative_draft_model_path=_need(args.draft_model_path, "--draft-model-path"))
    else:
        raise ValueError(f"--configs: unknown configuration {given!r} (none, ngram, eagle, dflash, each optionally "
                         f"with -kdtree, or ddtreeN, optionally with -graphs, -overlap, -budgets in that order)")
    engine.update(json.loads(args.engine_args))
    return engine, env


def _need(value, flag: str):
    if not value:
        raise ValueError(f"{flag} is needed by the configurations selected")
    return value


def batch_sizes(args) -> list[int]:
    return [int(b) for b in args.batch_sizes.split(",")]


def prompts(args, count: int) -> list:
    """The first `count` prompts of every configuration: --prompts-file's texts (in turn), else random token ids."""
    if args.prompts_file:
        texts = read_prompts(Path(args.prompts_file))
        return [texts[i % len(texts)] for i in range(count)]
    if args.vocab_range:
        low, high = (int(x) for x in args.vocab_range.split(","))
    else:
        config = json.loads((Path(args.model_path) / "config.json").read_text())
        low, high = 100, int(config["vocab_size"])
    rng = random.Random(0)
    return [[rng.randrange(low, high) for _ in range(args.prompt_len)] for _ in range(count)]


def read_prompts(path: Path) -> list[str]:
    """--prompts-file: one prompt a non-empty line, or in a .jsonl file a {"prompt": TEXT} object a line."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ValueError(f"--prompts-file: cannot read {path}: {e.strerror}") from None
    texts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if path.suffix != ".jsonl":
            texts.append(line)
            continue
        try:
            text = json.loads(line)["prompt"]
        except (ValueError, TypeError, KeyError):
            text = None
        if not isinstance(text, str):
            raise ValueError(f"--prompts-file: {path}:{number} is not a {{\"prompt\": TEXT}} line")
        texts.append(text)
    if not texts:
        raise ValueError(f"--prompts-file: {path} holds no prompt")
    return texts


def run_child(spec_path: str, out_path: str) -> None:
    """In the configuration's own process: one Engine, every batch size, results to out_path."""
    spec = json.loads(Path(spec_path).read_text())
    os.environ.update(spec["env"])
    import sglang

    rows = []
    engine = sglang.Engine(**spec["engine"])

    def ddtree_stats():  # the DDTREE worker's counters (get_server_info), None for other algorithms
        states = engine.get_server_info()["internal_states"]
        return (states[0].get("ddtree") or [None])[0] if states else None

    def generate(batch, params):  # texts (--prompts-file) go in as prompts, random ids as input_ids
        return engine.generate(**{"prompt" if isinstance(batch[0], str) else "input_ids": batch},
                               sampling_params=params)

    try:
        params = {"max_new_tokens": spec["new_tokens"], "temperature": 0.0, "ignore_eos": True}
        generate(spec["prompts"][:1], dict(params, max_new_tokens=8))
        for b in spec["batch_sizes"]:
            batch = spec["prompts"][:b]
            # this size's warm-up: the timed batch itself (same prompts, greedy), so every kernel variant its rounds
            # meet (Triton specializes on lengths) is compiled before the clock starts; a first engine on a machine
            # otherwise pays those compiles inside its timed batch (1.6x slower at B=32 on the H200)
            generate(batch, params)
            before = ddtree_stats()
            t0 = time.perf_counter()
            outs = generate(batch, params)
            seconds = time.perf_counter() - t0
            tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
            verify = sum(o["meta_info"].get("spec_verify_ct", 0) or 0 for o in outs)
            rows.append({"batch": b, "seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                         "tokens_per_verify": tokens / verify if verify else None,
                         "ddtree": stats_delta(before, ddtree_stats())})
    finally:
        engine.shutdown()
    Path(out_path).write_text(json.dumps({"rows": rows}, default=float))


def stats_delta(before: dict | None, after: dict | None) -> dict | None:
    """The DDTREE worker's counters over one timed batch (they accumulate over the engine's life)."""
    if not after:
        return None
    delta = dict(after)
    for counter in ("rounds", "published", "published_early", "without_host_lengths", "drafts_accepted", "host_gaps"):
        if counter in after:
            delta[counter] = after[counter] - before.get(counter, 0)
    if after.get("profiled"):
        delta["seconds"] = {p: after["seconds"][p] - before["seconds"].get(p, 0.0) for p in after["seconds"]}
    return delta


def run_config(name: str, args, out: Path, batch_prompts: list, profile: bool = False) -> dict:
    """One configuration's engine in its own process, on batch_prompts (every configuration's, main)."""
    engine, env = engine_config(name, args)
    if profile:
        env["KDTREE_DDTREE_PROFILE"] = "1"
    tag = name + ("-profile" if profile else "")
    spec = {"engine": engine, "env": env, "batch_sizes": batch_sizes(args), "new_tokens": args.new_tokens,
            "prompts": batch_prompts}
    (out / f"{tag}.spec.json").write_text(json.dumps(spec))
    result_path, log_path = out / f"{tag}.result.json", out / f"{tag}.log"
    result_path.unlink(missing_ok=True)
    t0 = time.monotonic()
    with log_path.open("w") as log:
        try:
            proc = subprocess.run([sys.executable, "-m", "kdtree_ops.bench.engine", "--child",
                                   str(out / f"{tag}.spec.json"), str(result_path)],
                                  stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout_s)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    record = {"config": name, "profiled": profile, "engine": engine, "env": env,
              "wall_s": round(time.monotonic() - t0, 1)}
    if code == 0 and result_path.exists():
        record.update(ok=True, **json.loads(result_path.read_text()))
    else:
        record.update(ok=False, error=f"exit {code}; log tail:\n" + log_path.read_text(errors="replace")[-3000:])
    return record


def time_split(ddtree: dict | None, seconds: float) -> dict | None:
    """Share of a profiled batch's wall time per phase (its stats_delta): the round's phases, `host` (the scheduler's
    work between two decode rounds, ddtree_worker.PhaseClock) and `other`, the rest (the batch's prefill, the
    request's way in and out of the engine)."""
    if not ddtree or not ddtree.get("profiled") or not seconds:
        return None
    phases = ddtree["seconds"]
    split = {p: phases.get(p, 0.0) / seconds for p in (*PHASES, "host")}
    split["other"] = max(0.0, 1.0 - sum(split.values()))
    return split


def host_us_per_round(ddtree: dict | None) -> float | None:
    """The scheduler's host time between two decode rounds, in microseconds a gap (a profiled stats_delta)."""
    if not ddtree or not ddtree.get("profiled") or not ddtree.get("host_gaps"):
        return None
    return 1e6 * ddtree["seconds"].get("host", 0.0) / ddtree["host_gaps"]


# The setting a suggestion names for each DDTREE suffix, with it and without it: those unlike DDTREE's defaults
_VARIANT_ENV = (("-graphs", "", "KDTREE_DDTREE_DRAFT_GRAPHS=0"), ("-overlap", "KDTREE_DDTREE_OVERLAP=1", ""))


def _ddtree_row(record: dict) -> tuple[Callable[[int], int], str] | None:
    """(tree width at a batch size, variant suffix) of a ddtreeN[-graphs][-overlap][-budgets] record: N, or for a
    -budgets row the width its KDTREE_DDTREE_BUDGETS gave that batch size; None for other configurations."""
    name = record["config"]
    budgets = name.endswith("-budgets")
    width, _, variant = name.removesuffix("-budgets")[6:].partition("-")
    if not name.startswith("ddtree") or not width.isdigit():
        return None
    variant = f"-{variant}" if variant else ""
    if not budgets:
        return (lambda batch: int(width)), variant
    raw = record.get("env", {}).get("KDTREE_DDTREE_BUDGETS", "")
    return BudgetPolicy(int(width), parse_steps(raw, int(width))).width, variant


def suggested_budgets(records: list) -> str | None:
    """DDTREE's launch from the table (ddtree_budgets.py): per batch size the fastest of no speculation (1 token,
    plain decode) and the ddtreeN rows of one variant (the scheduler and draft graphs: ddtreeN, ddtreeN-overlap,
    ...; a -budgets row counts at the width its policy gave each batch size), as `--speculative-num-draft-tokens N`
    with a KDTREE_DDTREE_BUDGETS value and the variant's settings; the variant whose choices sum to the most tokens/s
    over no speculation's (or, without that row, over the fastest row's) across the batch sizes, among those with a
    row at every size measured. None without such a row."""
    rows: dict[str, dict[int, list]] = {}  # variant -> batch size -> [(tokens/s, width)]
    plain: dict[int, float] = {}  # batch size -> no speculation's tokens/s
    fastest: dict[int, float] = {}
    for rec in records:
        if not rec.get("ok") or rec["profiled"]:  # a failed row's settings may be what failed
            continue
        row = ((lambda batch: 1), None) if rec["config"] == "none" else _ddtree_row(rec)
        if row is None:
            continue
        width_at, variant = row
        for r in rec["rows"]:
            fastest[r["batch"]] = max(fastest.get(r["batch"], 0.0), r["tokens_per_s"])
            if variant is None:
                plain[r["batch"]] = r["tokens_per_s"]
            else:
                rows.setdefault(variant, {}).setdefault(r["batch"], []).append((r["tokens_per_s"],
                                                                                 width_at(r["batch"])))
    sizes = sorted(fastest)
    choices = {}  # variant -> (score, [(batch size, width)])
    for variant, by_size in rows.items():
        if set(by_size) != set(sizes):
            continue
        best = [max(by_size[b] + ([(plain[b], 1)] if b in plain else [])) for b in sizes]
        score = sum(speed / plain.get(b, fastest[b]) for b, (speed, _) in zip(sizes, best))
        choices[variant] = (score, [(b, width) for b, (_, width) in zip(sizes, best)])
    if not choices:
        return None
    variant = max(choices, key=lambda v: choices[v][0])
    best = choices[variant][1]
    launch = max(width for _, width in best)
    if launch == 1:
        return "no speculation: every DDTREE row is slower than plain decode at every batch size measured"
    steps = [(b, w) for i, (b, w) in enumerate(best) if i == 0 or w != best[i - 1][1]]
    chosen = (present if suffix in variant else absent for suffix, present, absent in _VARIANT_ENV)
    settings = "".join(f" {setting}" for setting in chosen if setting)
    return (f"--speculative-num-draft-tokens {launch} with KDTREE_DDTREE_BUDGETS="
            + ",".join(f"{b}:{w}" for b, w in steps) + settings)


def markdown(records: list) -> str:
    sizes = sorted({r["batch"] for rec in records if rec.get("ok") for r in rec["rows"]})
    lines = ["| configuration | " + " | ".join(f"B={b} tok/s (tokens/verify)" for b in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for rec in records:
        if rec["profiled"]:
            continue
        if not rec.get("ok"):
            lines.append(f"| {rec['config']} | failed: {rec['error'].splitlines()[-1][:120]} |")
            continue
        by = {r["batch"]: r for r in rec["rows"]}
        cells = [f"{by[b]['tokens_per_s']:.1f}" + (f" ({by[b]['tokens_per_verify']:.2f})"
                                                    if by[b]["tokens_per_verify"] else "") if b in by else ""
                 for b in sizes]
        lines.append(f"| {rec['config']} | " + " | ".join(cells) + " |")
    suggestion = suggested_budgets(records)
    if suggestion:
        lines += ["", "DDTREE by batch size from this table (per size the fastest of one variant's rows): "
                  + suggestion]
    profiled = [r for r in records if r["profiled"] and r.get("ok")]
    if profiled:
        columns = (*PHASES, "host", "other")
        lines += ["", "DDTREE round time split (profiled runs, largest batch; share of the batch's wall time; host: "
                  "the scheduler between two decode rounds, us a round):", "",
                  "| configuration | " + " | ".join(columns) + " | host us/round |",
                  "|---|" + "---|" * (len(columns) + 1)]
        for rec in profiled:
            row = max(rec["rows"], key=lambda r: r["batch"])
            split = time_split(row["ddtree"], row["seconds"])
            if split:
                host_us = host_us_per_round(row["ddtree"])
                lines.append(f"| {rec['config']} | " + " | ".join(f"{100 * split[p]:.0f} %" for p in columns)
                             + f" | {'' if host_us is None else f'{host_us:.0f}'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        run_child(argv[1], argv[2])
        return 0
    args = _parser().parse_args(argv)
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    for name in names:
        engine_config(name, args)  # a bad name or a missing draft fails before any engine starts
    # read once for every configuration, so a prompts file without prompts also fails before any engine starts
    batch_prompts = prompts(args, max(batch_sizes(args)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    # A DDTREE configuration's profiled run follows its own run, and the table is written after every run: a run
    # stopped by a time limit keeps the time split of the configurations it reached.
    jobs = [(n, p) for n in names for p in (False, True) if not p or (args.profile and n.startswith("ddtree"))]
    for name, profile in jobs:
        print(f"kdtree_ops bench --engine: {name}{' (profiled)' if profile else ''} ...", flush=True)
        record = run_config(name, args, out, batch_prompts, profile)
        records.append(record)
        with (out / "engine_bench.json").open("a") as f:
            f.write(json.dumps(record, default=float) + "\n")
        print("  " + ("; ".join(f"B={r['batch']}: {r['tokens_per_s']:.1f} tok/s" for r in record["rows"])
                      if record.get("ok") else "FAILED " + record["error"].splitlines()[0]), flush=True)
        (out / "engine_bench.md").write_text(markdown(records))
        (out / "engine_bench.svg").write_text(svg_chart(records, f"End to end, {out.name}"))
    print((out / "engine_bench.md").read_text())
    return 0 if all(r.get("ok") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
