"""App: a target checkpoint under transformers, computing what draft training reads, online.

The target is an HF-format directory (what eagletree loads), so ``AutoModelForCausalLM`` reads
it. Forward hooks capture the inputs of the EAGLE-3 capture layers — the tensors eagletree's
target concatenates as aux states (layer i: its input; i = L: the last layer's output) — and
the final-normed hidden state is the EAGLE-1 feature.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn


class TargetBatch(NamedTuple):
    """One forward of the target over (batch, seq_len) tokens."""

    # (batch, seq_len, V) in the target's dtype: the distribution of the next token (an
    # argmax reads it as it is; a probability upcasts what it reads)
    logits: torch.Tensor
    hidden: torch.Tensor  # (batch, seq_len, H) final-normed (the lm_head input)
    aux: torch.Tensor | None  # (batch, seq_len, n·H) captured layer inputs, or None


class HFTarget:
    """The frozen target; ``aux_layer_ids`` as eagletree's loader resolves them."""

    def __init__(
        self,
        path: str | Path,
        dtype: torch.dtype,
        device: torch.device,
        aux_layer_ids: Sequence[int] = (),
    ) -> None:
        from transformers import AutoModelForCausalLM

        model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        self.model = model.to(device).eval().requires_grad_(False)
        self.device = device
        self.aux_layer_ids = tuple(aux_layer_ids)
        layers: nn.ModuleList = self.model.model.layers
        self.num_layers = len(layers)
        self._captured: dict[int, torch.Tensor] = {}
        for i in set(self.aux_layer_ids):
            if i < self.num_layers:
                layers[i].register_forward_pre_hook(self._capture_input(i), with_kwargs=True)
            else:
                layers[-1].register_forward_hook(self._capture_output(i))

    @property
    def embed_tokens(self) -> nn.Embedding:
        embed: nn.Embedding = self.model.get_input_embeddings()
        return embed

    @property
    def lm_head(self) -> nn.Linear:
        head: nn.Linear = self.model.get_output_embeddings()
        return head

    @property
    def final_norm_weight(self) -> torch.Tensor | None:
        """The weight of the norm the lm_head reads through, where the model has one."""
        weight = getattr(getattr(self.model.model, "norm", None), "weight", None)
        return weight if isinstance(weight, torch.Tensor) else None

    @property
    def vocab_size(self) -> int:
        return int(self.embed_tokens.num_embeddings)

    @property
    def hidden_size(self) -> int:
        return int(self.embed_tokens.embedding_dim)

    def _capture_input(self, layer: int) -> Any:
        def hook(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self._captured[layer] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _capture_output(self, layer: int) -> Any:
        def hook(_: nn.Module, __: Any, output: Any) -> None:
            self._captured[layer] = output[0] if isinstance(output, tuple) else output

        return hook

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor) -> TargetBatch:
        # input_ids: (batch, seq_len) int64
        self._captured.clear()
        out = self.model.model(input_ids=input_ids.to(self.device), use_cache=False)
        hidden: torch.Tensor = out.last_hidden_state
        logits = self.lm_head(hidden)
        aux = None
        if self.aux_layer_ids:
            aux = torch.cat([self._captured[i] for i in self.aux_layer_ids], dim=-1)
        self._captured.clear()
        return TargetBatch(logits, hidden, aux)

    @torch.no_grad()
    def generate(self, prompts: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy continuations: (batch, prompt_len) -> (batch, prompt_len + max_new_tokens),
        the full length even past an end-of-text token. Each token recomputes the whole prefix:
        no KV cache, whose keyword transformers versions spell differently."""
        tokens = prompts.to(self.device)
        for _ in range(max_new_tokens):
            hidden = self.model.model(input_ids=tokens, use_cache=False).last_hidden_state
            next_ids = self.lm_head(hidden[:, -1]).argmax(-1, keepdim=True)
            tokens = torch.cat((tokens, next_ids), dim=1)
        return tokens
