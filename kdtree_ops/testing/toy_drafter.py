"""A block drafter for the toy target (kdtree_ops.testing.toy_target): K future positions at once, DDTree-style.

A block-diffusion drafter (DFlash, DDTree's) reads the target's hidden state and proposes all K positions after
the next token in one forward, as per-position distributions. This one does the same for the toy target, whose
greedy continuation is a function of a small state — (current token, parity of the previous token), 2V states
— that the target's final hidden state holds legibly (one-hot dims [0, V), parity dim V + 1):

  1. read the state off the hidden state (argmax of the one-hot dims, sign of the parity dim): one row of a
     lookup, no run of the target; given the block's first token (the bonus, the tree's root), continue from it
     instead of from the greedy bonus the state predicts (sampled decoding: the bonus is a draw);
  2. heads: a table `continuation [2V, K + 1]` of the target's greedy tokens after each state (the bonus token
     the target itself predicts, then K drafts), unrolled once at construction from the target's rule;
  3. per position j, logits = sharpness * (onehot(continuation[state, j]) + noise * z), z a fixed standard
     normal [V] drawn from a bank indexed by (committed length, state), so drafts differ step to step, are
     the same on every device and need no RNG inside a CUDA graph; then log_softmax and the top-k.

`noise` is the knob: the best candidate at a position is the target's token iff 1 + noise z_c beats noise
max_{v != c} z_v. With V = 64 that holds with probability 1.00 at noise 0.15, 0.99 at 0.2, 0.82 at 0.3,
0.56 at 0.4, 0.38 at 0.5 and 0.16 at 0.8 (`top1_accuracy` computes it). A chain of K drafts accepts sum_j p^j tokens on average; a tree
also recovers a wrong top-1 through the runners-up it holds, so acceptance grows with the node budget. At
noise 0 every tree accepts all K (a path of top-1s exists); noise >> 1 accepts almost nothing.
"""

from __future__ import annotations

import torch

from .toy_target import TARGET_CONFIG


class BlockDrafter:
    """Drafts K positions per request from the target's last hidden state (all device ops, capture-safe)."""

    def __init__(self, kappa: torch.Tensor, block_size: int, top_k: int, noise: float, sharpness: float = 4.0,
                 bank_size: int = 1024, seed: int = 0, device="cpu"):
        """kappa: [V] int64, the target's rule (toy_target.margin_target); block_size: K positions drafted;
        top_k: candidates per position (<= V); noise: the accuracy knob above; sharpness: scales the logits
        (larger: top-1 log-probs nearer 0, so the tree builder prefers deep paths to wide ones)."""
        v = kappa.shape[0]
        assert v == TARGET_CONFIG.vocab_size and top_k <= v
        self.vocab, self.block_size, self.top_k = v, block_size, top_k
        self.noise, self.sharpness = noise, sharpness
        # continuation[s] for state s = 2 x + parity(prev): the K + 1 greedy tokens that follow.
        cont = torch.empty(2 * v, block_size + 1, dtype=torch.int64)
        cur = torch.arange(v).repeat_interleave(2)
        prev_parity = torch.arange(2).repeat(v)
        for j in range(block_size + 1):
            nxt = 2 * kappa[cur] + prev_parity
            cont[:, j] = nxt
            cur, prev_parity = nxt, cur % 2
        self.continuation = cont.to(device)
        gen = torch.Generator().manual_seed(seed)
        self.noise_bank = torch.randn(bank_size, block_size, v, generator=gen).to(device)  # [P, K, V]

    def state(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B] int64 state index 2 x_t + parity(x_{t-1}) read off hidden [B, hidden] (the target's final norm)."""
        v = self.vocab
        return 2 * hidden[:, :v].argmax(-1) + (hidden[:, v + 1] > 0).long()

    def __call__(self, hidden: torch.Tensor, seq_lens: torch.Tensor,
                 root_tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft the K positions after the next (bonus) token.

        Args:
            hidden: [B, hidden] the target's hidden state at each request's last committed token.
            seq_lens: [B] int64 committed lengths (they pick the noise).
            root_tokens: [B] int64, the bonus tokens, or None. A block drafter reads its block's first token (DFlash
                embeds it): given, the drafts continue from it — what sampling needs, where the bonus is often not
                the greedy token; None assumes the greedy one. For a greedy bonus both give the same drafts.

        Returns:
            logprobs [B, K, top_k] float32 sorted descending, tokens [B, K, top_k] int64.
        """
        state = self.state(hidden.float())
        if root_tokens is None:
            drafts = self.continuation[state, 1:]                                   # [B, K]
        else:  # the state after the root: (root, parity of the last committed token)
            drafts = self.continuation[2 * root_tokens + (state // 2) % 2, :-1]
        row = (seq_lens * 131 + state) % self.noise_bank.shape[0]
        logits = self.noise * self.noise_bank[row]                                  # [B, K, V]
        logits.scatter_add_(2, drafts[:, :, None], torch.ones_like(logits[:, :, :1]))  # + one-hot of the draft
        logprobs = torch.log_softmax(self.sharpness * logits, dim=-1)
        top = logprobs.topk(self.top_k, dim=-1)
        return top.values, top.indices

    def bonus_token(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B] int64: the token the drafter expects the target to predict next (position 0 of its table)."""
        return self.continuation[self.state(hidden.float()), 0]


def top1_accuracy(noise: float, vocab: int = TARGET_CONFIG.vocab_size, samples: int = 200_000) -> float:
    """Probability that the drafter's best candidate at one position is the target's token (Monte Carlo)."""
    z = torch.randn(samples, vocab, generator=torch.Generator().manual_seed(0))
    z[:, 0] += 1.0 / noise if noise > 0 else float("inf")
    return (z.argmax(-1) == 0).float().mean().item()
