"""The GPU engine suite's verdicts (sglang_gpu/engine_suite.py, engine_report.py) on literal replies: a wrong token
fails, a near-tie taken passes and is counted, a failed configuration fails the run, TP ranks that disagree fail;
the tp_size=2 configurations and their environment."""

from __future__ import annotations

import json
from pathlib import Path

from sglang_gpu.engine_report import failures, merged, rank_mismatch, replay_proof, verdict, write_summary
from sglang_gpu.engine_suite import (NEAR_TIE, PROMPT_LENS, configurations, cpu_loadable, first_differences,
                                    greedy_check, unscored, visible_gpus)


def _scored(tops: list) -> dict:
    """A scoring reply: the start token's empty entry, then (top-1, top-2) per output token."""
    return {"meta_info": {"input_top_logprobs": [None] + [[(a, ia, None), (b, ib, None)] for a, ia, b, ib in tops]}}


def test_greedy_check_flags_a_wrong_token_and_counts_near_ties():
    reply = _scored([(-0.1, 7, -3.0, 8), (-0.5, 9, -0.5 - NEAR_TIE / 2, 4), (-0.2, 5, -2.0, 6)])
    assert greedy_check([[1, 2]], [[7, 9, 5]], [reply])["num_violations"] == 0
    near = greedy_check([[1, 2]], [[7, 4, 5]], [reply])
    assert near["near_ties_taken"] == 1 and near["num_violations"] == 0
    wrong = greedy_check([[1, 2]], [[8, 9, 5]], [reply])  # top-2, but 2.9 nats below the greedy token
    assert wrong["num_violations"] == 1 and wrong["violations"][0] == {"request": 0, "position": 0, "token": 8,
                                                                     "greedy": 7, "margin": 2.9}
    assert greedy_check([[1]], [[7, 9, 6]], [reply])["num_violations"] == 1  # not even in the top 2


def test_first_differences_reports_the_reference_margin():
    assert first_differences([[1, 2, 3]], [[1, 2, 3]], [[1.0, 1.0, 1.0]]) == {"equal": True, "differences": []}
    d = first_differences([[1, 2, 3], [4, 5]], [[1, 9, 3], [4, 5]], [[1.0, 0.01, 1.0], [1.0, 1.0]])
    assert d == {"equal": False, "differences": [{"request": 0, "position": 1, "ref_margin": 0.01}]}


def test_report_verdicts(tmp_path):
    lines = [{"model": "m", "config": "none", "ok": True},
             {"model": "m", "config": "ddtree64", "ok": True, "compare": {"equal": True, "differences": []},
              "ddtree": [{"rounds": 33, "published": 33, "published_early": 0, "without_host_lengths": 33}]},
             {"model": "m", "config": "eagle", "ok": True},
             {"model": "m", "config": "dflash", "ok": False, "error": "EngineError: boom"},
             {"model": "m", "config": "ddtree64", "greedy_check": {"checked": 3, "near_ties_taken": 0,
                                                                    "num_violations": 0, "violations": []}},
             {"model": "m", "config": "eagle", "greedy_check": {"checked": 3, "near_ties_taken": 0,
                                                                 "num_violations": 1, "violations": []}}]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "results.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    assert sorted(r["config"] for r in failures(tmp_path)) == ["dflash", "eagle"]
    assert verdict({"config": "none", "ok": True}) == "reference"
    summary = write_summary(tmp_path)
    assert "| m | ddtree64 | ok | 3 tokens, 0 near-ties, 0 wrong | equal |" in summary
    assert "| 33 rounds, 33 published, 33 without host lengths |" in summary
    assert "| m | eagle | WRONG |" in summary and "| m | dflash | FAILED |" in summary


def test_replay_proof_reads_the_device_count_per_layer():
    # status() of two kdtree backends (target and draft): Python saw 2 op calls a layer (warm-up, capture), the
    # device counted 7 (five replays ran the op)
    states = [{"verify_steps": 5, "op_calls": {"0": 2, "1": 2}, "device_op_calls": {"0": 7, "1": 7},
               "device_non_finite": 0}, {"verify_steps": None}]
    record = {"config": "ddtree64", "ok": True, "kdtree": states,
              "greedy_check": {"checked": 3, "near_ties_taken": 0, "num_violations": 0, "violations": []}}
    assert replay_proof(record) == "replayed" and verdict(record) == "ok"
    eager = dict(record, kdtree=[dict(states[0], device_op_calls={"0": 2, "1": 2})])
    assert replay_proof(eager) == "no replay"
    poisoned = dict(record, kdtree=[dict(states[0], device_non_finite=3)])
    assert replay_proof(poisoned) == "NON-FINITE rows 3" and verdict(poisoned) == "WRONG"
    assert replay_proof({"config": "none", "ok": True}) == ""


def test_a_greedy_check_belongs_to_its_own_run(tmp_path):
    # one call ran ddtree16 and stopped before scoring it; a later call ran and scored it again
    check = {"checked": 3, "near_ties_taken": 0, "num_violations": 0, "violations": []}
    first = [{"model": "m", "config": "none", "ok": True}, {"model": "m", "config": "ddtree16", "ok": True}]
    second = first + [{"model": "m", "config": "ddtree16", "greedy_check": check}]
    for name, lines in (("call1", first), ("call2", second)):
        (tmp_path / name / "m").mkdir(parents=True)
        (tmp_path / name / "m" / "results.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    verdicts = [verdict(r) for r in merged(tmp_path) if r["config"] == "ddtree16"]
    assert verdicts == ["ran", "ok"]


def test_score_only_takes_the_greedy_runs_no_check_scores_yet(tmp_path):
    # a call stopped before scoring: ddtree64 scored, eagle scored but run again after, ddtree16 never scored,
    # a sampled run (no compare) and a failed run are not greedy records
    check = {"checked": 3, "near_ties_taken": 0, "num_violations": 0, "violations": []}
    run = {"ok": True, "ids": [[1, 2]], "compare": {"equal": True, "differences": []}}
    lines = [{"config": "none", "ok": True, "ids": [[1, 2]], "engine": {"attention_backend": "triton"}},
             dict(run, config="ddtree64"), {"config": "ddtree64", "greedy_check": check},
             dict(run, config="eagle"), {"config": "eagle", "greedy_check": check}, dict(run, config="eagle", n=2),
             dict(run, config="ddtree16"), {"config": "ddtree64-sampled", "ok": True, "ids": [[3]]},
             {"config": "dflash", "ok": False, "error": "x"}]
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    reference, greedy = unscored(path)
    assert reference["engine"] == {"attention_backend": "triton"}
    assert sorted((r["config"], r.get("n")) for r in greedy) == [("ddtree16", None), ("eagle", 2)]


def test_cpu_scoring_loads_an_mla_target_with_identity_yarn(tmp_path):
    mla, llama = tmp_path / "mla", tmp_path / "llama"
    for folder, config in ((mla, {"kv_lora_rank": 512, "max_position_embeddings": 4096, "rope_scaling": None}),
                           (llama, {"num_key_value_heads": 2})):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "model.safetensors").write_bytes(b"weights")
    assert cpu_loadable(llama) == str(llama)
    copy = Path(cpu_loadable(mla))
    assert copy != mla and json.loads((mla / "config.json").read_text())["rope_scaling"] is None  # source untouched
    scaling = json.loads((copy / "config.json").read_text())["rope_scaling"]
    assert scaling["factor"] == 1.0 and scaling["mscale"] == 1.0 and scaling["original_max_position_embeddings"] == 4096
    assert (copy / "model.safetensors").is_symlink() and (copy / "model.safetensors").read_bytes() == b"weights"
    assert cpu_loadable(mla) == str(copy)  # a second call reuses the copy


def _rank(r: int, steps: int, ops: int, device: int | None = None) -> dict:
    state = {"verify_steps": steps, "op_calls": {"0": ops, "1": ops}}
    if device is not None:
        state["device_op_calls"] = {"0": device, "1": device}
    return {"tp_rank": r, "kdtree": [{"verify_steps": 0, "op_calls": {}}, state]}


def test_tp_ranks_must_agree():
    ok = {"config": "ddtree16-tp2", "ok": True, "kdtree_ranks": [_rank(0, 5, 5, 40), _rank(1, 5, 5, 40)]}
    assert rank_mismatch(ok) == "" and verdict(ok) == "ran"
    idle = dict(ok, kdtree_ranks=[_rank(0, 5, 5), {"tp_rank": 1, "kdtree": [{"verify_steps": 0, "op_calls": {}}]}])
    assert rank_mismatch(idle) == "rank 1: the op never ran" and verdict(idle) == "WRONG"
    replayed = dict(ok, kdtree_ranks=[_rank(0, 5, 5, 40), _rank(1, 5, 5, 38)])
    assert "disagree" in rank_mismatch(replayed) and verdict(replayed) == "WRONG"
    assert rank_mismatch({"config": "none-tp2", "ok": True, "kdtree_ranks": [{"tp_rank": 0}, {"tp_rank": 1}]}) == ""


def test_tp2_configurations_only_when_asked_with_multicast_off():
    models = {"eagle": "e", "dflash": "d"}
    assert not [c for c in configurations(models) if c[0].endswith("-tp2")]
    tp2 = {name: (engine, env) for name, engine, env, _ in configurations(models, tp2=True) if name.endswith("-tp2")}
    assert set(tp2) == {"none-tp2", "ngram-tp2", "eagle-tp2", "ddtree16-tp2", "ddtree64-tp2"}
    for name, (engine, env) in tp2.items():
        assert engine["tp_size"] == 2, name
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1", name
        assert env["NVSHMEM_DISABLE_NVLS"] == "1", name
    assert tp2["eagle-tp2"][0]["speculative_eagle_topk"] > 1
    assert tp2["ddtree16-tp2"][0]["attention_backend"] == "kdtree"


def test_visible_gpus_reads_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert visible_gpus() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert visible_gpus() == 1


def test_graph_path_configurations_serve_the_suite_batch_at_the_intended_widths():
    """-graphs must reach a narrower tree (draft graphs + the verify's width-16 graphs) and -plain plain decode
    (width-1 verify graphs) at the suite's batch size; the B=1 warm-up runs the launch width."""
    from kdtree_ops.sglang.ddtree_budgets import parse_budgets

    configs = {name: (engine, env) for name, engine, env, _ in configurations({"eagle": "e", "dflash": "d"})}
    for name, width in (("ddtree64-graphs", 16), ("ddtree64-plain", 1)):
        engine, env = configs[name]
        policy = parse_budgets(env["KDTREE_DDTREE_BUDGETS"], engine["speculative_num_draft_tokens"], 8, 16)
        assert policy.width(len(PROMPT_LENS)) == width, name
        assert policy.width(1) == engine["speculative_num_draft_tokens"] == 64, name
        assert env.get("KDTREE_DDTREE_DRAFT_GRAPHS", "1") == "1", name  # the draft graphs on (the default)
        assert engine["attention_backend"] == "kdtree", name
    assert configs["ddtree64-eager"][1]["KDTREE_DDTREE_DRAFT_GRAPHS"] == "0"
