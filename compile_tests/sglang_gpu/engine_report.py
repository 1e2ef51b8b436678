"""summary.md of an engine-suite results folder (sglang_gpu/engine_suite.py's results.jsonl, in the folder or below
it: one per model where the models ran side by side, one folder per call where several calls make up a result).

    python -m sglang_gpu.engine_report DIR     # writes DIR/summary.md; exit 1 if a configuration failed
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(out: Path) -> list:
    """Every results.jsonl under `out` (a run's folder, a model's, or a folder of several runs), each file in order."""
    paths = sorted(Path(out).rglob("results.jsonl"))
    return [[json.loads(line) for line in path.read_text().splitlines() if line.strip()] for path in paths]


def _device_counts(record: dict) -> tuple:
    """(op calls seen from Python — eager and capture —, op calls counted on the device — replays too —,
    non-finite verify rows) summed over the kdtree backends of the run (KDTREE_VERIFY_COUNT=1)."""
    op = device = non_finite = 0
    for state in record.get("kdtree") or []:
        op += sum(state.get("op_calls", {}).values())
        device += sum(state.get("device_op_calls", {}).values())
        non_finite += state.get("device_non_finite", 0)
    return op, device, non_finite


def replay_proof(record: dict) -> str:
    """'replayed' when the device counted more op calls than Python made (the rest ran inside replayed graphs) and
    every verify row was finite; '' where the run verified nothing through kdtree."""
    op, device, non_finite = _device_counts(record)
    if not device:
        return ""
    if non_finite:
        return f"NON-FINITE rows {non_finite}"
    return "replayed" if device > op else "no replay"


def _op_counts(record: dict) -> str:
    """Verify steps, op calls at capture/eager, and the device-side count of op calls (replays included); per TP
    rank where the engine had more than one (`kdtree_ranks`)."""
    ranks = record.get("kdtree_ranks") or []
    if len(ranks) > 1:
        return "; ".join(f"rank {r.get('tp_rank')}: {_op_counts({'kdtree': r.get('kdtree')}) or '-'}" for r in ranks)
    parts = []
    for state in record.get("kdtree") or []:
        if state.get("verify_steps") is None:
            continue
        op = sum(state.get("op_calls", {}).values())
        base = sum(state.get("base_calls", {}).values())
        device = sum(state.get("device_op_calls", {}).values())
        parts.append(f"{state['verify_steps']} steps, op {op}" + (f", base {base}" if base else "")
                     + (f", device {device}" if device else ""))
    return "; ".join(parts)


def ddtree_rounds(record: dict) -> str:
    """The DDTREE worker's decode rounds over the engine's life: how many published their lengths (the overlap
    loop) and how many SGLang copied no host lengths for (over triton on that loop: every one); '' without DDTREE."""
    parts = []
    for stats in record.get("ddtree") or []:
        text = f"{stats['rounds']} rounds"
        if stats.get("published"):
            text += f", {stats['published']} published"
        if "without_host_lengths" in stats:
            text += f", {stats['without_host_lengths']} without host lengths"
        parts.append(text)
    return "; ".join(parts)


def merged(out: Path) -> list:
    """One record per configuration run: its line with its scoring line's greedy check folded in. A scoring line
    follows its runs in the same file and belongs to the last run of its (model, configuration) before it, so runs
    repeated across files or calls keep their own checks."""
    records = []
    for lines in load(out):
        last = {}
        for line in lines:
            key = (line.get("model"), line.get("config"))
            if "greedy_check" in line:
                if key in last:
                    last[key]["greedy_check"] = line["greedy_check"]
            else:
                records.append(line)
                last[key] = line
    return records


def rank_mismatch(record: dict) -> str:
    """Where the engine had several TP ranks: why their kdtree statuses disagree (a rank whose op never ran, or
    ranks that verified or replayed different numbers of steps), else ''."""
    ranks = record.get("kdtree_ranks") or []
    if len(ranks) < 2 or not any(r.get("kdtree") for r in ranks):
        return ""
    seen = set()
    for rank in ranks:
        verifying = [s for s in rank.get("kdtree") or [] if s.get("verify_steps")]
        if not verifying or not sum(verifying[0].get("op_calls", {}).values()):
            return f"rank {rank.get('tp_rank')}: the op never ran"
        seen.add((verifying[0]["verify_steps"], sum(verifying[0].get("device_op_calls", {}).values())))
    return "" if len(seen) == 1 else f"ranks disagree on (verify steps, device calls): {sorted(seen, key=str)}"


def verdict(record: dict) -> str:
    """FAILED (did not run), WRONG (a token failed the greedy check, or the TP ranks' statuses disagree), ok
    (checked), ran (nothing to check)."""
    if not record.get("ok"):
        return "FAILED"
    if rank_mismatch(record):
        return "WRONG"
    check = record.get("greedy_check")
    if _device_counts(record)[2]:
        return "WRONG"  # a verify row went non-finite
    if check is not None:
        return "WRONG" if check["num_violations"] else "ok"
    return "reference" if record["config"] == "none" else "ran"


def failures(out: Path) -> list:
    return [r for r in merged(out) if verdict(r) in ("FAILED", "WRONG")]


def _equal(record: dict) -> str:
    cmp = record.get("compare")
    if cmp is None:
        return ""
    if cmp["equal"]:
        return "equal"
    return "first difference at " + ", ".join(f"{d['position']} (margin {d['ref_margin']})" for d in cmp["differences"])


def write_summary(out: Path) -> str:
    lines = ["| model | configuration | verdict | greedy check | vs no speculation | tokens/verify | tok/s | startup s "
             "| verify (kdtree) | op in replays | DDTREE rounds | error |", "|---" * 12 + "|"]
    for r in merged(out):
        g = r.get("greedy_check")
        check = f"{g['checked']} tokens, {g['near_ties_taken']} near-ties, {g['num_violations']} wrong" if g else ""
        if g and g.get("scored_on") == "cpu":  # --score-only on the CPU: the float32 target judged the tokens
            check += " (scored on the CPU, float32)"
        error = (r.get("error") or "").strip().splitlines()[-1][:160] if r.get("error") else rank_mismatch(r)
        lines.append(f"| {r.get('model')} | {r['config']} | {verdict(r)} | {check} | {_equal(r)} | "
                     f"{r.get('tokens_per_verify') or ''} | {r.get('tokens_per_s') or ''} | {r.get('startup_s') or ''} | "
                     f"{_op_counts(r)} | {replay_proof(r)} | {ddtree_rounds(r)} | {error.replace('|', '/')} |")
    text = "\n".join(lines) + "\n"
    (Path(out) / "summary.md").write_text(text)
    return text


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    print(write_summary(folder))
    sys.exit(1 if failures(folder) else 0)
