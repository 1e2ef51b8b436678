"""`KDTREE_DDTREE_BUDGETS`: DDTREE's tree size per batch size, down to plain decode where speculation loses.

A tree's verify costs the target a forward over N tokens per request; at a large batch that forward is
compute-bound and a tree that saves a few decode steps costs more than it returns (`python -m kdtree_ops bench
--engine` measures where). The policy is a list of `B:N` steps, e.g. `KDTREE_DDTREE_BUDGETS=1:64,8:16,24:1`: a round
of a batch of at least B requests (the largest such B) verifies trees of N tokens; batches smaller than the first
step's B use the launch width (`--speculative-num-draft-tokens`). N = 1 is plain decode: the root alone, no draft
forward, one token a request (the drafter still reads the committed token's hidden states, so the next tree round
drafts from a complete context). Every N is at most the launch width and, above 1, one the drafter can fill
(ddtree_algorithm.check_node_budget). Lossless whatever the widths: a round's tree is any prefix-closed set, and a
root-only tree accepts the target's own token.

CUDA graphs: SGLang 0.5.23 captures one verify width (the launch width) and runs a batch of any other width eagerly
(decode_cuda_graph_runner.can_run_graph's uniform-width rule); the worker captures the target's verify at each
narrower width of the policy too (verify_widths.py), so every round replays where SGLang's decode graphs are on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

BUDGETS_ENV = "KDTREE_DDTREE_BUDGETS"


@dataclass(frozen=True)
class BudgetPolicy:
    launch_width: int
    steps: tuple[tuple[int, int], ...]  # (smallest batch size, tree tokens), batch sizes ascending

    def width(self, batch_size: int) -> int:
        """Tree tokens (root included) of a round of `batch_size` requests."""
        chosen = self.launch_width
        for smallest, tokens in self.steps:
            if batch_size < smallest:
                break
            chosen = tokens
        return chosen

    def describe(self) -> str:
        """One line for the server log: each batch-size range and its width."""
        bounds = [(1, self.launch_width)] if not self.steps or self.steps[0][0] > 1 else []
        bounds += list(self.steps)
        parts = []
        for i, (smallest, tokens) in enumerate(bounds):
            last = bounds[i + 1][0] - 1 if i + 1 < len(bounds) else None
            sizes = f"{smallest}+" if last is None else (f"{smallest}" if last == smallest else f"{smallest}-{last}")
            parts.append(f"{sizes}: {tokens}" + (" (plain decode, no draft)" if tokens == 1 else ""))
        return "; ".join(parts)


def _refusal(raw: str, launch_width: int, why: str) -> ValueError:
    return ValueError(f"{BUDGETS_ENV}={raw!r}: {why} (format: comma-separated BATCH:TOKENS steps, batch sizes "
                      f"ascending, e.g. 1:{launch_width},16:1; TOKENS 1 is plain decode)")


def parse_steps(raw: str, launch_width: int) -> tuple[tuple[int, int], ...]:
    """The (batch size, tree tokens) steps of a `KDTREE_DDTREE_BUDGETS` value, checked for form and range (integers,
    batch sizes positive and ascending, tree tokens in [1, launch_width]); parse_budgets adds the drafter's checks."""
    steps: list[tuple[int, int]] = []
    for entry in (e.strip() for e in raw.split(",")):
        batch, _, tokens = entry.partition(":")
        try:
            batch_size, width = int(batch), int(tokens)
        except ValueError:
            raise _refusal(raw, launch_width, f"entry {entry!r} is not BATCH:TOKENS with two integers") from None
        if batch_size < 1:
            raise _refusal(raw, launch_width, f"entry {entry!r}: BATCH must be a positive integer")
        if steps and batch_size <= steps[-1][0]:
            raise _refusal(raw, launch_width, f"entry {entry!r}: batch sizes must ascend")
        if not 1 <= width <= launch_width:
            raise _refusal(raw, launch_width, f"entry {entry!r}: TOKENS must be in [1, {launch_width}] "
                                              f"(--speculative-num-draft-tokens is the widest tree)")
        steps.append((batch_size, width))
    return tuple(steps)


def parse_budgets(raw: str, launch_width: int, topk: int, block_size: int) -> BudgetPolicy:
    """The policy of a `KDTREE_DDTREE_BUDGETS` value; raises naming the variable, the entry and the rule broken."""
    from .ddtree_algorithm import check_node_budget

    steps = parse_steps(raw, launch_width)
    for batch_size, width in steps:
        if width > 1:
            try:
                check_node_budget(width, topk, block_size)
            except ValueError as exc:
                raise _refusal(raw, launch_width, f"entry '{batch_size}:{width}': {exc}") from None
    return BudgetPolicy(launch_width, steps)


def budget_policy(launch_width: int, topk: int, block_size: int) -> BudgetPolicy | None:
    """KDTREE_DDTREE_BUDGETS's policy, or None where it is unset or empty (every round at the launch width)."""
    raw = os.environ.get(BUDGETS_ENV, "").strip()
    return parse_budgets(raw, launch_width, topk, block_size) if raw else None
