"""What a model forward returns to the workers: logits and the hidden states EAGLE needs."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ModelOutput:
    """Logits of the requested rows and hidden states of every token of the forward.

    ``logits``: (num_logit_rows, V) in the model's dtype (no float32 copy of a 128k-wide row
    is made unless a consumer needs one: an argmax or a top-k does not), one row per index of
    the forward's ``logits_rows`` (every token when it was None). ``hidden_states``:
    (num_tokens, H); for a target, the final-normed last hidden state (the lm_head input) —
    what an EAGLE draft consumes, as in the EAGLE reference and SGLang; for a draft model, its
    own output hidden state fed to the next draft step. ``aux_hidden_states``: (num_tokens,
    n·H) the concatenated inputs of the capture layers (EAGLE-3), or None when not captured.
    ``token_ids``: (V,) int64, the target token id of each logits column where a draft
    proposes from part of the target vocabulary (an EAGLE-3 draft vocabulary, an EAGLE token
    map); None when column i is token i. The draft's top-k maps its picks through it
    (``sampling.top_k_probs``'s ``token_ids``).
    """

    logits: torch.Tensor
    hidden_states: torch.Tensor
    aux_hidden_states: torch.Tensor | None = None
    token_ids: torch.Tensor | None = None
