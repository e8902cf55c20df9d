"""What the docs' code shows: their code blocks and spans, the project's commands in them, and
what each command answers to ``--help`` (for tests/unit/test_docs.py)."""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import shlex
import sys
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`]+)`")
INDENTED = re.compile(r"(?:^\n)((?: {4}.*\n?)+)", re.M)
SHELL_SPLIT = re.compile(r"\s(?:&&|\|\||;|\|)\s|\n")


@dataclass(frozen=True)
class Command:
    kind: str  # "eagletree", "module" or "gpu.sh" (a phase of scripts/gpu.sh)
    name: str  # the module for "module"
    words: tuple[str, ...]  # subcommands, or the phase
    flags: tuple[str, ...]

    def __str__(self) -> str:
        head = {"eagletree": "eagletree", "gpu.sh": "bash scripts/gpu.sh"}.get(self.kind)
        return " ".join([head or f"python -m {self.name}", *self.words, *self.flags])


def code_of(text: str) -> list[str]:
    """The code of a markdown text: fenced and indented blocks, then inline spans; a line ending
    in a backslash is joined with the next."""
    blocks = FENCED.findall(text)
    prose = FENCED.sub("", text)
    blocks += [re.sub(r"^ {4}", "", b, flags=re.M) for b in INDENTED.findall(prose)]
    blocks += INLINE.findall(INDENTED.sub("\n", prose))
    return [re.sub(r"\\\n\s*", " ", block) for block in blocks]


def words_of(segment: str) -> list[str]:
    try:
        words = shlex.split(segment, comments=True)
    except ValueError:
        words = segment.split()
    words = [w.strip("[](),") for w in words]
    while words and (re.fullmatch(r"\w+=\S*", words[0]) or words[0] in ("env", "time", "-u")):
        words = words[2:] if words[0] == "-u" else words[1:]
    return [w for w in words if w]


def command(words: list[str]) -> Command | None:
    """The command ``words`` run, if it is one of this project's."""
    if not words:
        return None
    head, rest = words[0], words[1:]
    script = re.fullmatch(r"benchmarks/(\w+)\.py", rest[0]) if rest else None
    if head in ("python", "python3") and script:  # benchmarks/ is a package: run with -m
        return command([head, "-m", f"benchmarks.{script[1]}", *rest[1:]])
    if head in ("python", "python3") and len(rest) >= 2 and rest[0] == "-m":
        module, rest = rest[1], rest[2:]
        if module == "eagletree.app.cli.main":
            return command(["eagletree", *rest])
        if module.split(".")[0] not in ("eagletree", "benchmarks"):
            return None
        return Command("module", module, (), flags_of(rest))
    if head == "eagletree":
        subcommands = []
        for word in rest[:2]:
            if not re.fullmatch(r"[a-z][a-z-]*", word):
                break
            subcommands.append(word)
        return Command("eagletree", "eagletree", tuple(subcommands), flags_of(rest))
    if head == "bash" and rest[:1] == ["scripts/gpu.sh"] and len(rest) >= 2:
        phase, args = rest[1], rest[2:]
        if phase == "ab" and "--" in args:
            after = args[args.index("--") + 1 :]
            after = ["cli", "bench", *after] if after[:1] and after[0][0] == "-" else after
            return command(["bash", "scripts/gpu.sh", *after])
        if phase == "bench" and args:
            return Command("module", f"benchmarks.{args[0]}", (), flags_of(args[1:]))
        if phase == "cli" and args:
            return command(["eagletree", *args])
        if phase == "real-pair":
            return Command("module", "benchmarks.real_pair", (), flags_of(args))
        return Command("gpu.sh", "scripts/gpu.sh", (phase,), ())
    return None


def flags_of(words: list[str]) -> tuple[str, ...]:
    return tuple(w.split("=")[0] for w in words if re.fullmatch(r"--[a-z][\w-]*(=.*)?", w))


def commands_of(text: str) -> list[Command]:
    found = []
    for code in code_of(text):
        for segment in SHELL_SPLIT.split(code):
            if (found_command := command(words_of(segment))) is not None:
                found.append(found_command)
    return found


@cache
def help_of(kind: str, name: str, words: tuple[str, ...]) -> tuple[object, str]:
    """(exit status, output) of the command with ``--help``, run in this process."""
    if kind == "gpu.sh":
        phases = set(re.findall(r"^([a-z-]+)\)$", (ROOT / name).read_text("utf-8"), re.M))
        return (0, "") if words[0] in phases else (f"no phase {words[0]!r}", "")
    out = io.StringIO()
    argv = sys.argv
    status: object = 0
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(out),
        warnings.catch_warnings(),  # runpy warns of a module imported before it runs
    ):
        warnings.simplefilter("ignore")
        try:
            if kind == "eagletree":
                from eagletree.app.cli.main import main

                status = main([*words, "--help"])
            else:
                sys.argv = [name, *words, "--help"]
                runpy.run_module(name, run_name="__main__", alter_sys=True)
        except SystemExit as exit_:
            status = exit_.code or 0
        except Exception as error:  # an import error of a missing module, say
            status = repr(error)
        finally:
            sys.argv = argv
    return status, out.getvalue()
