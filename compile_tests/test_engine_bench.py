"""`python -m kdtree_ops bench --engine` on the CPU engine (graphs off, float32; its speed is not the point): every
configuration it names becomes the launch it says, a run writes a row per batch size with the tokens it generated,
DDTREE accepts drafts, the profiled run gives the round's time split, and a failing configuration is reported
without stopping the others."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from sglang_cpu import ddtree_models  # noqa: E402
from sglang_cpu.engine_driver import driver_env  # noqa: E402
from sglang_cpu.engine_host import PLATFORM_SETTINGS  # noqa: E402

from kdtree_ops.bench import engine as engine_bench  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _args(**overrides):
    argv = ["--model-path", "/m", "--draft-model-path", "/d"]
    for key, value in overrides.items():
        argv += [f"--{key.replace('_', '-')}", value]
    return engine_bench._parser().parse_args(argv)


def test_configuration_names_are_the_launches_they_say():
    args = _args(base_backend="triton")
    engine, env = engine_bench.engine_config("dflash", args)
    assert engine["speculative_algorithm"] == "DFLASH" and engine["attention_backend"] == "triton" and env == {}
    engine, env = engine_bench.engine_config("dflash-kdtree", args)
    assert engine["attention_backend"] == "kdtree" and env == {"KDTREE_BASE_BACKEND": "triton"}
    engine, _ = engine_bench.engine_config("ddtree256", args)
    assert (engine["speculative_algorithm"], engine["speculative_num_draft_tokens"],
            engine["attention_backend"]) == ("DDTREE", 256, "kdtree")
    assert "speculative_algorithm" not in engine_bench.engine_config("none", args)[0]
    engine, env = engine_bench.engine_config("ddtree64-overlap", args)
    assert (engine["speculative_num_draft_tokens"], env["KDTREE_DDTREE_OVERLAP"]) == (64, "1")
    assert "KDTREE_DDTREE_OVERLAP" not in engine_bench.engine_config("ddtree64", args)[1]
    with pytest.raises(ValueError, match="unknown configuration 'ddtreeX'"):
        engine_bench.engine_config("ddtreeX", args)
    engine, env = engine_bench.engine_config("ddtree64-overlap-budgets", _args(ddtree_budgets="1:64,16:1"))
    assert engine["speculative_num_draft_tokens"] == 64
    assert env == {"KDTREE_DDTREE_OVERLAP": "1", "KDTREE_DDTREE_BUDGETS": "1:64,16:1",
                   "KDTREE_DDTREE_DRAFT_GRAPHS": "0"}
    with pytest.raises(ValueError, match="--ddtree-budgets is needed"):
        engine_bench.engine_config("ddtree64-budgets", args)
    engine, env = engine_bench.engine_config("ddtree64-graphs-overlap", args)
    assert env == {"KDTREE_DDTREE_OVERLAP": "1", "KDTREE_DDTREE_DRAFT_GRAPHS": "1", "KDTREE_BASE_BACKEND": "triton"}
    # the draft graphs are DDTREE's default: a row without -graphs turns them off, other algorithms never name them
    assert engine_bench.engine_config("ddtree64-overlap", args)[1]["KDTREE_DDTREE_DRAFT_GRAPHS"] == "0"
    assert "KDTREE_DDTREE_DRAFT_GRAPHS" not in engine_bench.engine_config("dflash-kdtree", args)[1]
    for bad in ("ddtree64-budgets-overlap", "ddtree64-overlap-graphs", "dflash-graphs", "dflash-budgets"):
        with pytest.raises(ValueError, match=f"unknown configuration '{bad}'"):
            engine_bench.engine_config(bad, _args(ddtree_budgets="1:1"))
    with pytest.raises(ValueError, match="--eagle-draft-model-path"):
        engine_bench.engine_config("eagle-kdtree", args)


def test_stats_delta_counts_the_timed_batch_alone():
    before = {"rounds": 3, "published": 0, "published_early": 1, "without_host_lengths": 2, "profiled": True,
              "drafts_accepted": 5, "host_gaps": 2, "seconds": {"draft": 1.0, "host": 0.5}}
    after = {"rounds": 8, "published": 0, "published_early": 4, "without_host_lengths": 7, "profiled": True,
             "drafts_accepted": 12, "host_gaps": 6, "seconds": {"draft": 1.5, "host": 0.75}}
    delta = engine_bench.stats_delta(before, after)
    assert (delta["rounds"], delta["drafts_accepted"], delta["host_gaps"], delta["published"],
            delta["published_early"], delta["without_host_lengths"]) == (5, 7, 4, 0, 3, 5)
    assert delta["seconds"] == pytest.approx({"draft": 0.5, "host": 0.25})


def test_time_split_shares_and_the_rest():
    stats = {"profiled": True, "seconds": {"draft": 1.0, "build": 0.5, "verify": 2.0, "accept": 0.25, "commit": 0.25}}
    split = engine_bench.time_split(stats, 5.0)
    assert split == pytest.approx({"draft": 0.2, "build": 0.1, "verify": 0.4, "accept": 0.05, "commit": 0.05,
                                   "host": 0.0, "other": 0.2}, abs=1e-12)
    assert engine_bench.time_split({"profiled": False}, 5.0) is None
    stats["seconds"]["host"], stats["host_gaps"] = 0.5, 4
    split = engine_bench.time_split(stats, 5.0)
    assert (split["host"], split["other"]) == pytest.approx((0.1, 0.1), abs=1e-12)
    assert engine_bench.host_us_per_round(stats) == pytest.approx(125000.0)
    assert engine_bench.host_us_per_round({"profiled": False}) is None


def _record(config: str, tokens_per_s: dict, ok: bool = True, profiled: bool = False) -> dict:
    return {"config": config, "ok": ok, "profiled": profiled, "error": "" if ok else "exit 1",
            "rows": [{"batch": b, "tokens_per_s": t, "tokens_per_verify": None, "ddtree": None, "seconds": 1.0}
                     for b, t in tokens_per_s.items()]}


def test_the_suggested_budgets_take_the_fastest_row_per_batch_size():
    # the enginebench table of 2026-12-05 (H100): ddtree64 wins at 1 and 4, ddtree16 nowhere, none at 16 and 32
    records = [_record("none", {1: 105.4, 4: 425.2, 16: 1515.1, 32: 2936.0}),
               _record("dflash", {1: 158.9, 4: 435.4, 16: 1562.9, 32: 2609.7}),
               _record("ddtree16", {1: 170.3, 4: 458.8, 16: 1334.8, 32: 1944.3}),
               _record("ddtree64", {1: 200.4, 4: 486.6, 16: 786.3, 32: 1113.9}),
               _record("ddtree64-overlap", {1: 999.0}), _record("ddtree256", {1: 9999.0}, ok=False),
               _record("ddtree16", {1: 9999.0}, profiled=True)]
    assert engine_bench.suggested_budgets(records) == (
        "--speculative-num-draft-tokens 64 with KDTREE_DDTREE_BUDGETS=1:64,16:1 KDTREE_DDTREE_DRAFT_GRAPHS=0")
    records[2]["rows"][2]["tokens_per_s"] = 1600.0  # ddtree16 now wins at 16
    assert engine_bench.suggested_budgets(records).endswith("=1:64,16:16,32:1 KDTREE_DDTREE_DRAFT_GRAPHS=0")
    assert engine_bench.suggested_budgets(records[:2]) is None  # no DDTREE row
    slow = [_record("none", {1: 100.0}), _record("ddtree16", {1: 50.0})]
    assert engine_bench.suggested_budgets(slow).startswith("no speculation")
    assert "KDTREE_DDTREE_BUDGETS=1:64,16:16,32:1" in engine_bench.markdown(records)


def test_the_suggestion_takes_one_variant_s_rows_and_names_its_settings():
    none = _record("none", {1: 100.0, 32: 3000.0})
    sync = [_record("ddtree64", {1: 180.0, 32: 1000.0}), _record("ddtree8", {1: 150.0, 32: 2000.0})]
    overlap = [_record("ddtree64-graphs-overlap", {1: 250.0, 32: 1500.0}),
               _record("ddtree8-graphs-overlap", {1: 200.0, 32: 3600.0})]
    # the overlap variant wins at both sizes: its widths, with its settings
    records = [none, *sync, *overlap]
    assert engine_bench.suggested_budgets(records) == (
        "--speculative-num-draft-tokens 64 with KDTREE_DDTREE_BUDGETS=1:64,32:8 KDTREE_DDTREE_OVERLAP=1")
    # a variant short of a batch size is not comparable: the synchronous rows decide (plain decode at 32)
    overlap[1]["rows"] = overlap[1]["rows"][:1]
    overlap[0]["rows"] = overlap[0]["rows"][:1]
    assert engine_bench.suggested_budgets(records).endswith("64 with KDTREE_DDTREE_BUDGETS=1:64,32:1 "
                                                            "KDTREE_DDTREE_DRAFT_GRAPHS=0")


def test_a_budgets_row_counts_at_the_width_its_policy_gave_each_batch_size():
    # the 2026-12-07 H100 table: no fixed width beats no speculation at 32, the policy's trees of 8 do
    records = [_record("none", {1: 104.6, 32: 2734.0}),
               _record("ddtree64-graphs-overlap", {1: 242.5, 32: 1391.7}),
               {**_record("ddtree64-graphs-overlap-budgets", {1: 252.4, 32: 3116.5}),
                "env": {"KDTREE_DDTREE_BUDGETS": "1:64,16:8"}},
               _record("ddtree16-graphs-overlap", {1: 173.7, 32: 2619.7}),
               _record("ddtree4-graphs-overlap", {1: 148.7, 32: 2332.2})]
    assert engine_bench.suggested_budgets(records) == (
        "--speculative-num-draft-tokens 64 with KDTREE_DDTREE_BUDGETS=1:64,32:8 KDTREE_DDTREE_OVERLAP=1")
    records[2]["env"]["KDTREE_DDTREE_BUDGETS"] = "1:64,16:1"  # plain decode at 32: no speculation's row is faster
    assert engine_bench.suggested_budgets(records).endswith("=1:64,32:1 KDTREE_DDTREE_OVERLAP=1")


def test_engine_bench_runs_on_the_cpu_engine(tmp_path):
    target = ddtree_models.markov_llama(tmp_path / "target")
    draft = ddtree_models.dflash_draft(tmp_path / "draft")
    settings = {k: v for k, v in PLATFORM_SETTINGS["cpu"].items()}
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "kdtree_ops", "bench", "--engine", "--model-path", str(target),
           "--draft-model-path", str(draft), "--configs", "none,ddtree16,ddtree9x", "--batch-sizes", "1,2",
           "--new-tokens", "12", "--prompt-len", "8",
           "--vocab-range", f"{ddtree_models.FIRST_WORD},{ddtree_models.VOCAB}",
           "--engine-args", json.dumps(settings), "--profile", "--out", str(out)]
    bad = subprocess.run(cmd, cwd=REPO, env=driver_env(platform="cpu"), capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "unknown configuration 'ddtree9x'" in bad.stderr  # before any engine starts
    # eagle-kdtree's draft does not exist: it fails, is reported, and the others still run
    cmd[cmd.index("none,ddtree16,ddtree9x")] = "none,ddtree16,eagle-kdtree"
    cmd += ["--eagle-draft-model-path", str(tmp_path / "no-such-draft")]
    run = subprocess.run(cmd, cwd=REPO, env=driver_env(platform="cpu"), capture_output=True, text=True, timeout=900)
    records = [json.loads(line) for line in (out / "engine_bench.json").read_text().splitlines()]
    # a DDTREE configuration's profiled run right after its own (a time limit keeps the splits it reached)
    assert [(r["config"], r["profiled"]) for r in records] == [("none", False), ("ddtree16", False),
                                                             ("ddtree16", True), ("eagle-kdtree", False)], run.stdout
    none, ddtree, profiled, eagle = records
    for rec in (none, ddtree, profiled):
        assert rec["ok"], rec.get("error")
        assert [(r["batch"], r["tokens"]) for r in rec["rows"]] == [(1, 12), (2, 24)]
        assert all(r["tokens_per_s"] > 0 for r in rec["rows"])
    assert none["rows"][0]["tokens_per_verify"] is None
    assert all(r["tokens_per_verify"] > 1.5 for r in ddtree["rows"])  # the toy drafter agrees most of the time
    for row in profiled["rows"]:  # the phases of the timed batch only: within its wall time
        assert row["ddtree"]["rounds"] > 0 and row["ddtree"]["drafts_accepted"] > 0
        split = engine_bench.time_split(row["ddtree"], row["seconds"])
        assert split["verify"] > 0 and split["draft"] > 0 and split["build"] > 0 and split["other"] > 0
        # 12 tokens a request: more than one decode round, so at least one gap between two of them was timed
        # a gap between two rounds of this batch: fewer than its rounds (counted over the timed batch alone)
        assert 0 < row["ddtree"]["host_gaps"] < row["ddtree"]["rounds"] and split["host"] > 0
        assert engine_bench.host_us_per_round(row["ddtree"]) > 0
        assert sum(split.values()) == pytest.approx(1.0)
    assert not eagle["ok"] and "no-such-draft" in eagle["error"] and run.returncode == 1
    table = (out / "engine_bench.md").read_text()
    assert "| ddtree16 |" in table and "| eagle-kdtree | failed:" in table and "DDTREE round time split" in table
    assert 'data-config="ddtree16"' in (out / "engine_bench.svg").read_text()  # the chart beside the table


def test_the_chart_draws_each_run_over_no_speculation_at_each_batch_size():
    import xml.etree.ElementTree as ET

    from kdtree_ops.bench.engine_plot import svg_chart

    records = [_record("dflash", {1: 150.0, 32: 1500.0}), _record("none", {1: 100.0, 32: 3000.0}),
               _record("ddtree64", {1: 250.0, 32: 900.0}), _record("ddtree64", {1: 1.0}, profiled=True),
               _record("ddtree256", {1: 9999.0}, ok=False)]
    svg = ET.fromstring(svg_chart(records, "t"))
    bars = [e for e in svg.iter("{http://www.w3.org/2000/svg}rect") if e.get("class") == "bar"]
    drawn = {(b.get("data-config"), int(b.get("data-batch"))): b for b in bars}
    assert set(drawn) == {(c, b) for c in ("dflash", "none", "ddtree64") for b in (1, 32)}  # no profiled, no failed
    height = {key: float(bar.get("height")) for key, bar in drawn.items()}
    assert height[("ddtree64", 1)] / height[("none", 1)] == pytest.approx(2.5, rel=1e-2)
    assert height[("dflash", 32)] / height[("none", 32)] == pytest.approx(0.5, rel=1e-2)
    bottoms = {round(float(b.get("y")) + float(b.get("height")), 1) for b in bars}
    assert len(bottoms) == 1  # every bar stands on the same axis
    assert "tokens/s over none" in ET.tostring(svg, encoding="unicode")


def test_each_batch_size_warms_up_on_the_timed_batch_itself(tmp_path, monkeypatch):
    """The untimed warm-up before each size's timed batch is that batch (same prompts, same tokens): a shorter one
    leaves kernel variants of later rounds to compile inside the timed batch (a first engine on a machine ran 1.6x
    slower at B=32 on the H200)."""
    import types

    calls = []

    class RecordingEngine:
        def __init__(self, **kwargs):
            pass

        def generate(self, input_ids, sampling_params):
            calls.append((list(map(tuple, input_ids)), dict(sampling_params)))
            meta = {"completion_tokens": sampling_params["max_new_tokens"], "spec_verify_ct": 0}
            return [{"meta_info": meta} for _ in input_ids]

        def get_server_info(self):
            return {"internal_states": []}

        def shutdown(self):
            pass

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=RecordingEngine))
    prompts = [[5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 16]]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"env": {}, "engine": {}, "new_tokens": 24, "batch_sizes": [1, 4], "prompts": prompts}))
    engine_bench.run_child(str(spec), str(tmp_path / "out.json"))
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 4] and [r["tokens"] for r in rows] == [24, 96]
    first_of = {1: 1, 4: 3}  # after the engine's own 8-token warm-up: (warm-up, timed) per size
    for b, at in first_of.items():
        warm, timed = calls[at], calls[at + 1]
        assert warm == timed and len(timed[0]) == b and timed[1]["max_new_tokens"] == 24


def test_a_prompts_file_gives_every_configuration_its_texts_in_turn(tmp_path):
    plain = tmp_path / "prompts.txt"
    plain.write_text("def add(a, b):\n\n  Translate: bonjour\n")
    assert engine_bench.read_prompts(plain) == ["def add(a, b):", "  Translate: bonjour"]
    lines = tmp_path / "prompts.jsonl"
    lines.write_text(json.dumps({"prompt": "a\nb"}) + "\n\n" + json.dumps({"prompt": "c", "id": 7}) + "\n")
    assert engine_bench.read_prompts(lines) == ["a\nb", "c"]  # a prompt may hold newlines there
    args = _args(prompts_file=str(lines))
    assert engine_bench.prompts(args, 5) == ["a\nb", "c", "a\nb", "c", "a\nb"]


@pytest.mark.parametrize("name, text, message", [
    ("empty.txt", "\n \n", "holds no prompt"),
    ("bad.jsonl", '{"prompt": "ok"}\n{"text": "no prompt key"}\n', "bad.jsonl:2 is not a"),
    ("notjson.jsonl", "plain text\n", "notjson.jsonl:1 is not a"),
    ("number.jsonl", '{"prompt": 3}\n', "number.jsonl:1 is not a"),
    ("missing.txt", None, "cannot read"),
])
def test_a_prompts_file_without_prompts_fails_before_any_engine(tmp_path, name, text, message):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=f"--prompts-file: .*{message}"):
        engine_bench.main(["--model-path", "/m", "--configs", "none", "--prompts-file", str(path), "--out", str(out)])
    assert not out.exists()


def test_text_prompts_reach_the_engine_as_prompts(tmp_path, monkeypatch):
    import types

    calls = []

    class RecordingEngine:
        def __init__(self, **kwargs):
            pass

        def generate(self, prompt=None, input_ids=None, sampling_params=None):
            calls.append((prompt, input_ids))
            batch = prompt if prompt is not None else input_ids
            return [{"meta_info": {"completion_tokens": 3, "spec_verify_ct": 0}} for _ in batch]

        def get_server_info(self):
            return {"internal_states": []}

        def shutdown(self):
            pass

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=RecordingEngine))
    for prompts, field in ((["one", "two"], 0), ([[5, 6], [7, 8]], 1)):
        calls.clear()
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"env": {}, "engine": {}, "new_tokens": 3, "batch_sizes": [2], "prompts": prompts}))
        engine_bench.run_child(str(spec), str(tmp_path / "out.json"))
        assert [c[field] for c in calls] == [prompts[:1], prompts, prompts]  # engine warm-up, size warm-up, timed
        assert all(c[1 - field] is None for c in calls)
