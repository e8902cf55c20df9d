"""Prompts: text, token ids or chat messages as users give them, their token ids, and the checks
those ids pass before an engine queues them.

A JSONL prompts file holds one object per line: ``{"prompt": TEXT}``, ``{"prompt_ids": [...]}``
or ``{"messages": [{"role": ..., "content": ...}, ...]}``; blank lines are skipped, any other key
is refused (the sampling flags apply to every prompt). Every problem names the file and the
line. Text is Unicode that UTF-8 can encode: a lone surrogate (what Python makes of bytes that
are not UTF-8 in a command-line argument, or a JSON ``"\ud800"``) is refused, not tokenised.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eagletree.app.engine.scheduler import Scheduler
    from eagletree.ports.tokenizer import Tokenizer

Message = Mapping[str, str]
Prompt = Sequence[int] | str  # token ids, or text for the engine's tokenizer


PROMPT_KEYS = ("prompt", "prompt_ids", "messages")


def text_problem(text: str) -> str | None:
    """Why ``text`` is not text UTF-8 can encode (a lone surrogate), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        char = text[error.start]
        byte = f"the byte 0x{ord(char) - 0xDC00:02x}" if 0xDC80 <= ord(char) <= 0xDCFF else ""
        what = byte or f"a lone surrogate {char.encode('unicode_escape').decode()}"
        return f"is not valid UTF-8 text ({what} at character {error.start})"
    return None


def encode_prompt(prompt: Prompt, tokenizer: Tokenizer | None, index: int = 0) -> list[int]:
    """Token ids of a prompt; text needs the tokenizer (ValueError naming request ``index``)."""
    if not isinstance(prompt, str):
        return list(prompt)
    if tokenizer is None:
        raise ValueError(
            f"request {index}: the prompt is text but the checkpoint has no tokenizer "
            "(tokenizer.json or tokenizer.model); give token ids"
        )
    return tokenizer.encode(_checked_text(prompt, index))


def _checked_text(text: str, index: int) -> str:
    problem = text_problem(text)
    if problem is not None:
        raise ValueError(f"request {index}: the prompt {problem}: give UTF-8 text or token ids")
    return text


def check_prompt_ids(
    index: int,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    vocab_size: int,
    max_context_len: int,
    scheduler: Scheduler,
) -> None:
    """Raise a ValueError naming request ``index`` unless the prompt is non-empty ints of the
    vocabulary that leave room for output in the context, and the scheduler's pools could hold
    the request alone."""
    if len(prompt) == 0:
        raise ValueError(f"request {index}: the prompt is empty")
    if len(prompt) >= max_context_len:
        raise ValueError(
            f"request {index}: the prompt has {len(prompt)} tokens but the context holds "
            f"{max_context_len} (prompt and output), which leaves no room for output"
        )
    for position, token in enumerate(prompt):
        if isinstance(token, bool) or not isinstance(token, int):
            raise ValueError(
                f"request {index}: token {token!r} at position {position} is not an int"
            )
        if not 0 <= token < vocab_size:
            raise ValueError(
                f"request {index}: token id {token} at position {position} is outside the "
                f"vocabulary [0, {vocab_size})"
            )
    max_total_len = min(len(prompt) + max_new_tokens, max_context_len)
    problem = scheduler.capacity_problem(max_total_len)
    if problem is not None:
        raise ValueError(
            f"request {index}: {problem}; raise memory.max_total_tokens, the context or "
            "the row width, or lower max_new_tokens"
        )


@dataclass(frozen=True, slots=True)
class PromptSpec:
    """One prompt: exactly one of ``text``, ``ids`` and ``messages``; ``fallback_ids`` are used
    for ``text`` when there is no tokenizer (the default prompt only)."""

    text: str | None = None
    ids: tuple[int, ...] | None = None
    messages: tuple[Message, ...] | None = None
    fallback_ids: tuple[int, ...] | None = None


def to_prompt_ids(spec: PromptSpec, tokenizer: Tokenizer | None, index: int) -> list[int]:
    """The token ids of a prompt; ValueError naming request ``index`` when text needs a
    tokenizer the checkpoint lacks, or messages a chat template it lacks."""
    if spec.ids is not None:
        return list(spec.ids)
    if tokenizer is None:
        if spec.fallback_ids is not None:
            return list(spec.fallback_ids)
        raise ValueError(
            f"request {index}: a text prompt needs the checkpoint's tokenizer (tokenizer.json "
            "or tokenizer.model beside config.json); give token ids with --prompt-ids instead"
        )
    if spec.messages is not None:
        if not tokenizer.has_chat_template:
            raise ValueError(
                f"request {index}: the checkpoint's tokenizer has no chat template "
                "(tokenizer_config.json chat_template); send a plain prompt"
            )
        for message in spec.messages:
            _checked_text(message["content"], index)
        return tokenizer.apply_chat_template(spec.messages)
    assert spec.text is not None
    return tokenizer.encode(_checked_text(spec.text, index))


def read_prompts_file(path: Path) -> list[PromptSpec]:
    """The prompts of a JSONL file; ValueError naming ``path:line`` for a bad line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ValueError(f"--prompts-file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--prompts-file {path} cannot be read as UTF-8 text: {error}") from None
    specs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            specs.append(parse_prompt_line(json.loads(line)))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
        except ValueError as error:
            raise ValueError(f"{path}:{number}: {error}") from None
    if not specs:
        raise ValueError(f"--prompts-file {path} holds no prompts")
    return specs


def parse_prompt_line(value: object) -> PromptSpec:
    """One JSONL object as a PromptSpec; ValueError saying what a line must hold."""
    usage = 'expected {"prompt": TEXT}, {"prompt_ids": [ids]} or {"messages": [...]}'
    if not isinstance(value, dict):
        raise ValueError(usage)
    keys = [key for key in PROMPT_KEYS if key in value]
    if len(keys) != 1:
        raise ValueError(usage)
    unknown = [key for key in value if key not in PROMPT_KEYS]
    if unknown:
        raise ValueError(
            f"unknown key {unknown[0]!r}: a line holds one of "
            f"{', '.join(map(repr, PROMPT_KEYS))}; the flags (--max-new-tokens, "
            "--temperature, ...) apply to every prompt of the file"
        )
    item = value[keys[0]]
    if keys[0] == "prompt":
        if not isinstance(item, str):
            raise ValueError('"prompt" must be a string')
        _check_line_text('"prompt"', item)
        return PromptSpec(text=item)
    if keys[0] == "prompt_ids":
        if not isinstance(item, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in item
        ):
            raise ValueError('"prompt_ids" must be a list of integers')
        return PromptSpec(ids=tuple(item))
    return PromptSpec(messages=parse_messages(item))


def parse_messages(value: object) -> tuple[Message, ...]:
    """Chat messages: a non-empty list of {"role": str, "content": str}."""
    if not isinstance(value, list) or not value:
        raise ValueError('"messages" must be a non-empty list of {"role", "content"} objects')
    messages = []
    for message in value:
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise ValueError('each message must be {"role": str, "content": str}')
        _check_line_text('a message\'s "content"', message["content"])
        messages.append({"role": message["role"], "content": message["content"]})
    return tuple(messages)


def _check_line_text(what: str, text: str) -> None:
    problem = text_problem(text)
    if problem is not None:
        raise ValueError(f"{what} {problem}: write the file as UTF-8 text")
