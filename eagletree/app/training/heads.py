"""App: the trainable EAGLE-1 and EAGLE-3 heads and their unrolled (training-time test) forward.

Unrolling reproduces what a head sees while drafting: step 0 reads the target's features; step
``s`` reads, at position q, the head's own output of step ``s - 1`` at q − 1, and attends to the
step-0 keys of the committed prefix (positions ≤ q − s) plus the keys its own draft path wrote
at steps 1..s (one per step, on the diagonal) — the draft tree's attention mask.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from eagletree.app.training.head_modules import (
    MLP,
    Attention,
    HeadShape,
    KVCache,
    RMSNorm,
    Rope,
)


def unrolled_attention_mask(seq_len: int, step: int, device: torch.device) -> torch.Tensor:
    """(seq_len, (step + 1) · seq_len) bool, True where step ``step``'s query q may attend.

    Block 0 (step-0 keys): positions ≤ q − step. Block j ≥ 1: the one key at q − step + j, the
    same draft path's node of depth j. Block ``step`` therefore holds q itself, so no row is
    empty (rows with q < step have no real prefix; their losses are masked).
    """
    q = torch.arange(seq_len, device=device)[:, None]
    k = torch.arange(seq_len, device=device)[None, :]
    blocks = [k <= q - step] + [k == q - step + j for j in range(1, step + 1)]
    return torch.cat(blocks, dim=1)


class DraftHead(Protocol):
    """What the trainer needs of a head."""

    shape: HeadShape

    def new_caches(self) -> list[KVCache]: ...

    def step(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        first: bool,
        rope: Rope,
        caches: list[KVCache],
        mask: torch.Tensor,
    ) -> torch.Tensor: ...

    def logits(self, out: torch.Tensor) -> torch.Tensor: ...


class DecoderLayer(nn.Module):
    """A Llama decoder layer; EAGLE-1's first layer has no input norm (SafeAILab's layout)."""

    def __init__(self, shape: HeadShape, input_norm: bool) -> None:
        super().__init__()
        hidden = shape.hidden_size
        self.input_layernorm = RMSNorm(hidden, shape.rms_norm_eps) if input_norm else None
        self.self_attn = Attention(shape, hidden)
        self.post_attention_layernorm = RMSNorm(hidden, shape.rms_norm_eps)
        self.mlp = MLP(hidden, shape.intermediate_size)

    def forward(
        self, h: torch.Tensor, rope: Rope, cache: KVCache, mask: torch.Tensor
    ) -> torch.Tensor:
        x = h if self.input_layernorm is None else self.input_layernorm(h)
        h = h + self.self_attn(x, rope, cache, mask)
        out: torch.Tensor = h + self.mlp(self.post_attention_layernorm(h))
        return out


class EagleHead(nn.Module):
    """EAGLE-1: ``fc([embed(t + 1); feature(t)])`` into decoder layers; the output is both the
    next step's feature and the input of the target's (frozen) lm_head."""

    def __init__(self, shape: HeadShape, num_layers: int, lm_head: nn.Linear) -> None:
        super().__init__()
        self.shape = shape
        self.fc = nn.Linear(2 * shape.hidden_size, shape.hidden_size, bias=True)
        self.layers = nn.ModuleList(DecoderLayer(shape, i > 0) for i in range(num_layers))
        self._lm_head = (lm_head,)  # a tuple keeps the target's head out of the state dict

    def new_caches(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def step(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        first: bool,
        rope: Rope,
        caches: list[KVCache],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        # embeds, hidden: (batch, seq_len, H) -> (batch, seq_len, H)
        h = self.fc(torch.cat((embeds, hidden.to(embeds.dtype)), dim=-1))
        for layer, cache in zip(self.layers, caches, strict=True):
            h = layer(h, rope, cache, mask)
        out: torch.Tensor = h
        return out

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """(batch, seq_len, H) -> (batch, seq_len, V) in the compute dtype."""
        logits: torch.Tensor = self._lm_head[0](out)
        return logits


class Eagle3MidLayer(nn.Module):
    def __init__(self, shape: HeadShape) -> None:
        super().__init__()
        hidden, eps = shape.hidden_size, shape.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.self_attn = Attention(shape, 2 * hidden)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = MLP(hidden, shape.intermediate_size)

    def forward(
        self, embeds: torch.Tensor, h: torch.Tensor, rope: Rope, cache: KVCache, mask: torch.Tensor
    ) -> torch.Tensor:
        x = torch.cat((self.input_layernorm(embeds), self.hidden_norm(h)), dim=-1)
        h = h + self.self_attn(x, rope, cache, mask)
        out: torch.Tensor = h + self.mlp(self.post_attention_layernorm(h))
        return out


class Eagle3Head(nn.Module):
    """EAGLE-3: ``fc`` fuses the target's three captured states (step 0 only); own norm and
    lm_head over the draft vocabulary."""

    def __init__(self, shape: HeadShape, num_aux: int, draft_vocab_size: int) -> None:
        super().__init__()
        self.shape = shape
        self.fc = nn.Linear(num_aux * shape.hidden_size, shape.hidden_size, bias=False)
        self.midlayer = Eagle3MidLayer(shape)
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.lm_head = nn.Linear(shape.hidden_size, draft_vocab_size, bias=False)

    def new_caches(self) -> list[KVCache]:
        return [KVCache()]

    def step(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        first: bool,
        rope: Rope,
        caches: list[KVCache],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        # hidden: (batch, seq_len, n·H) target aux states at step 0, else (batch, seq_len, H)
        h = self.fused_input(hidden.to(embeds.dtype)) if first else hidden
        out: torch.Tensor = self.midlayer(embeds, h, rope, caches[0], mask)
        return out

    def fused_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """(batch, seq_len, n·H) target aux states -> (batch, seq_len, H), step 0's input."""
        fused: torch.Tensor = self.fc(hidden)
        return fused

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """(batch, seq_len, H) -> (batch, seq_len, draft_vocab) in the compute dtype."""
        logits: torch.Tensor = self.lm_head(self.norm(out))
        return logits


def unrolled_forward(
    head: DraftHead, embeds: torch.Tensor, features: torch.Tensor, num_steps: int
) -> list[torch.Tensor]:
    """Outputs of steps 0..num_steps−1, each (batch, seq_len, H).

    ``embeds`` (batch, seq_len, H): embeddings of the tokens at q + 1; ``features``: the target
    features at q. Gradients flow through the whole unroll.
    """
    seq_len = embeds.shape[1]
    shape = head.shape
    rope = Rope.of(seq_len, shape.head_dim, shape.rope_theta, embeds.device)
    caches = head.new_caches()
    outputs: list[torch.Tensor] = []
    hidden = features
    for step in range(num_steps):
        mask = unrolled_attention_mask(seq_len, step, embeds.device)
        out = head.step(embeds, hidden, step == 0, rope, caches, mask)
        outputs.append(out)
        # the next step reads, at q, this step's output at q − 1 (row 0 has no parent)
        hidden = torch.nn.functional.pad(out[:, :-1], (0, 0, 1, 0))
    return outputs
