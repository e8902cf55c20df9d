"""Text deltas of a growing output: characters split across tokens are held back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from eagletree.app.engine.streaming import IncrementalDecoder, OutputWatcher
from eagletree.domain.request import FinishReason, Request
from eagletree.domain.sampling import SamplingParams


class ByteTokenizer:
    """One token per UTF-8 byte, as a byte-level BPE without merges."""

    has_chat_template = False
    eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        raise ValueError("no template")


def test_a_character_split_across_tokens_is_emitted_once_complete() -> None:
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode("aé€b")  # é is 2 bytes, € is 3
    decoder = IncrementalDecoder(tokenizer)
    deltas = [decoder.delta(ids[: n + 1]) for n in range(len(ids))]
    assert "".join(deltas) == "aé€b"
    assert "\ufffd" not in "".join(deltas)
    assert deltas[1] == "" and deltas[2] == "é"  # after the first byte of é: nothing yet


def test_an_invalid_byte_at_the_end_is_emitted_when_the_output_is_final() -> None:
    decoder = IncrementalDecoder(ByteTokenizer())
    assert decoder.delta([0x61, 0xC3]) == "a"
    assert decoder.delta([0x61, 0xC3], final=True) == "\ufffd"


def test_the_watcher_reports_new_tokens_once_and_the_finish_last() -> None:
    request = Request(7, [1, 2], SamplingParams(max_new_tokens=3), max_context_len=16)
    watcher = OutputWatcher(0, request, ByteTokenizer())
    assert watcher.poll() is None
    request.admit(0, now=0.0)
    request.append_tokens([0x61, 0x62], eos_token_ids=(), now=1.0)
    event = watcher.poll()
    assert event is not None and (event.token_ids, event.text, event.finished) == (
        [0x61, 0x62],
        "ab",
        False,
    )
    assert watcher.poll() is None
    request.append_tokens([0x63], eos_token_ids=(), now=2.0)  # max_new_tokens: LENGTH
    request.release()
    request.finish(now=3.0)
    last = watcher.poll()
    assert last is not None and last.finish_reason is FinishReason.LENGTH and last.text == "c"
    assert watcher.done and watcher.poll() is None
