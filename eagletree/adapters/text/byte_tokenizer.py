"""Adapter: a small byte-level BPE tokenizer for random checkpoints, so their output is text.

Trained on a fixed built-in word list (deterministic: the same files every time), with
``<unk>``, ``<s>`` (BOS, id 1) and ``</s>`` (EOS, id 2) first, as the random targets declare.
Written as tokenizer.json + tokenizer_config.json (with a chat template), which
transformers.AutoTokenizer loads like any published checkpoint's tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")

_TEXT = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there one all we their can has been if more when "
    "will would who so no out up into do only time about them some could new these two may "
    "first then any like now such our over also after most made many before must through back "
    "years where much your way well down should because each just those people how too little "
    "state good very make world still own see men work long get here between both life being "
    "under never day same another know while last might us great old year off come since "
    "tree draft token verify accept model speculative decoding branch path cache kernel batch "
    "step engine request server client stream text prompt output eagle target beam depth width "
    "memory slot page attention compact move chain root node leaf mask score sample greedy"
)

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }}"
    "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def write_byte_level_tokenizer(directory: str | Path, vocab_size: int) -> None:
    """Write tokenizer.json and tokenizer_config.json of at most ``vocab_size`` tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"a byte-level tokenizer needs a vocabulary of >= 259, got {vocab_size}")
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    words = _TEXT.split()
    corpus = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    tokenizer.train_from_iterator(corpus, trainer)
    # the target was trained (randomly) with BOS first: encode adds it, as Llama's tokenizer does
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", SPECIAL_TOKENS.index("<s>"))]
    )
    directory = Path(directory)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 4096,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
