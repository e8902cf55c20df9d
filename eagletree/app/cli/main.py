"""The `eagletree` command: `generate`, `serve`, `bench`, `init-random`, `train-draft`,
`token-map`, `config show|validate`, `demo`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eagletree import __version__
from eagletree.app.cli import generate as generate_cli
from eagletree.app.composition.platform import resolve_cpu_threads
from eagletree.app.composition.run_settings import (
    check_checkpoint_shapes,
    check_checkpoint_values,
    check_draft_path,
    describe_checkpoint,
    load_settings,
    read_token_map_setting,
    settings_for_run,
)
from eagletree.app.server.serve_args import add_serve_parser
from eagletree.config.eagle_hook import resolve_speculative
from eagletree.config.overlap import resolve_overlap
from eagletree.config.settings import EngineSettings
from eagletree.config.target import ATTENTION_KINDS, TargetDescription
from eagletree.domain.errors import ConfigurationError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 bad configuration)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:  # the demo parses its own options, --help included
        from eagletree.app.cli import demo  # imported here: `config` does not need it

        return demo.main(argv[1:])
    if argv[:1] == ["bench"]:  # parses its own options; imported here: it pulls in torch
        from eagletree.app.bench import cli as bench_cli

        return bench_cli.main(argv[1:])
    if argv[:1] == ["init-random"]:  # imported here: the checkpoint writer pulls in torch
        from eagletree.app.cli import init_random as init_random_cli

        parser = argparse.ArgumentParser(prog="eagletree")
        init_random_cli.add_parser(parser.add_subparsers(dest="command", required=True))
        return init_random_cli.run(parser.parse_args(argv))
    if argv[:1] == ["token-map"]:  # imported here: counting pulls in torch and tokenizers
        from eagletree.app.cli import token_map as token_map_cli

        return token_map_cli.main(argv[1:])
    if argv[:1] == ["train-draft"]:  # imported here: training pulls in torch and transformers
        from eagletree.app.training import cli as train_cli

        return train_cli.main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "generate":
        return generate_cli.run(args)
    if args.command == "serve":
        from eagletree.app.server import cli as serve_cli

        return serve_cli.run(args)
    # Warnings reach stderr through logging's last-resort handler unless the embedding
    # application configured logging; `config show` also prints them in [speculative.resolved].
    try:
        return config_command(args)
    except ConfigurationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def config_command(args: argparse.Namespace) -> int:
    """`config show` / `config validate`: the settings generate would run, checked."""
    if args.file is not None and args.settings is not None and args.file != args.settings:
        raise ConfigurationError(
            f"config {args.config_command} got two settings files ({args.file} and "
            f"--settings {args.settings}): give one"
        )
    notes: list[str] = []
    path = args.settings or args.file
    settings = settings_for_run(load_settings(path), notes.append, create_default=False)
    target, assumed = _target_of(args, settings)
    resolved = resolve_speculative(settings, target)
    if args.config_command == "validate":
        if assumed is not None:
            raise ConfigurationError(assumed)
        _validate_checkpoints(settings, target)
        print("ok")
        return 0
    values: dict[str, Any] = settings.model_dump()
    resolved_values = dataclasses.asdict(resolved)
    values["speculative"] = {**values["speculative"], "resolved": resolved_values}
    values["target"] = dataclasses.asdict(target)
    model, backend = settings.model, settings.backend
    overlap = resolve_overlap(settings, model.device.partition(":")[0], resolved.worker)
    print(
        f"# eagletree settings resolved for {target.architecture} ({target.attention_kind}) on "
        f"{model.device} in {model.dtype}: attention {backend.attention}, kv_move "
        f"{backend.kv_move}, cuda_graph {backend.cuda_graph}, overlap "
        f"{'on' if overlap.enabled else 'off'}"
    )
    if overlap.reason is not None:
        print(f"# scheduler.overlap off: {overlap.reason}")
    print(f"# {_cpu_threads_line(settings)}")
    for note in notes:
        print(f"# {note}")
    if assumed is not None:
        print(f"# {assumed}")
    print(to_toml(values), end="")
    return 0


def _cpu_threads_line(settings: EngineSettings) -> str:
    """What the thread policy will do when `generate` builds the engine of ``settings``."""
    from eagletree.adapters.models.config import ConfigReader

    path = settings.model.target_path
    assert path is not None  # settings_for_run fills in the default
    try:
        threads = resolve_cpu_threads(
            settings,
            lambda: ConfigReader.from_dir(path).get_int("hidden_size"),
            os.cpu_count() or 1,
            os.environ.get("OMP_NUM_THREADS"),
        )
    except ConfigurationError:
        return "cpu threads: set from the target's hidden size once its config.json is readable"
    count = "torch's own" if threads.count is None else threads.count
    return f"cpu threads: {count} ({threads.reason})"


def _target_of(
    args: argparse.Namespace, settings: EngineSettings
) -> tuple[TargetDescription, str | None]:
    """The target read from the checkpoint, or (when it cannot be read) the one assumed from
    --target-arch and the reason, which `validate` reports as its error."""
    from eagletree.app.composition.default_checkpoint import default_checkpoint_dir

    path = settings.model.target_path
    assert path is not None  # settings_for_run fills in the default
    assumed = TargetDescription.for_architecture(args.target_arch, args.attention_kind)
    is_default = Path(path) == default_checkpoint_dir() / "target"
    if is_default and not Path(path).is_dir():
        note = f"target: the embedded default {path}, written by the first `eagletree generate`"
        return assumed, None if args.config_command == "validate" else note
    try:
        target = describe_checkpoint(path)
    except ConfigurationError as error:
        if args.config_command == "validate":
            return assumed, str(error)
        return assumed, f"{error} (target assumed from --target-arch {args.target_arch})"
    if args.attention_kind is not None:
        target = dataclasses.replace(target, attention_kind=args.attention_kind)
    return target, None


def _validate_checkpoints(settings: EngineSettings, target: TargetDescription) -> None:
    from eagletree.adapters.models.config import ConfigReader
    from eagletree.app.composition.startup import check_context_len, check_draft_topk, check_topk

    path = settings.model.target_path
    if path is None or not Path(path).is_dir():  # the embedded default, not written yet
        return
    check_draft_path(settings)
    check_context_len(settings, target)
    resolved = resolve_speculative(settings, target)
    check_checkpoint_shapes(path, resolved.draft_path, resolved.algorithm)
    for checkpoint in dict.fromkeys(p for p in (path, resolved.draft_path) if p is not None):
        check_checkpoint_values(checkpoint)
    vocab_size = ConfigReader.from_dir(path).get_int("vocab_size")
    check_topk(resolved, vocab_size)
    token_map = read_token_map_setting(resolved.token_map, vocab_size)
    if token_map is not None:
        check_draft_topk(resolved, [token_map.numel()])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagletree", description="EAGLE tree speculative decoding."
    )
    parser.add_argument("--version", action="version", version=f"eagletree {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    config = commands.add_parser("config", help="inspect and check settings")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    show = config_commands.add_parser("show", help="print the resolved settings as TOML")
    validate = config_commands.add_parser(
        "validate", help="check settings, checkpoints and device; exit 1 if bad"
    )
    for sub in (show, validate):  # both take the file either way
        sub.add_argument("file", metavar="FILE", nargs="?", help="a .toml, .yaml or .yml file")
        sub.add_argument("--settings", metavar="FILE", help="the same, as generate takes it")
        sub.add_argument(
            "--target-arch",
            default="LlamaForCausalLM",
            help="target architecture assumed when no checkpoint can be read "
            "(default: %(default)s)",
        )
        sub.add_argument(
            "--attention-kind", choices=ATTENTION_KINDS, help="override the architecture's kind"
        )

    generate_cli.add_parser(commands)
    add_serve_parser(commands)
    commands.add_parser(
        "bench", help="decode throughput of plain, chain and tree configurations", add_help=False
    )
    commands.add_parser(
        "init-random", help="write a random target and draft checkpoint", add_help=False
    )
    commands.add_parser("train-draft", help="train an EAGLE / EAGLE-3 draft head", add_help=False)
    commands.add_parser(
        "token-map", help="an EAGLE token map: a corpus's most frequent ids", add_help=False
    )
    commands.add_parser("demo", help="one tree decode step on fixed numbers, phase by phase")
    return parser


def to_toml(table: Mapping[str, Any], prefix: str = "") -> str:
    """TOML for nested dicts of str/bool/int/float/None and lists of those.

    TOML has no null: an unset value becomes a comment, so the output still parses.
    """
    lines: list[str] = []
    subtables = {key: value for key, value in table.items() if isinstance(value, Mapping)}
    for key, value in table.items():
        if isinstance(value, Mapping):
            continue
        lines.append(f"# {key} is unset" if value is None else f"{key} = {_toml_value(value)}")
    text = "\n".join(lines) + "\n" if lines else ""
    for key, value in subtables.items():
        name = f"{prefix}.{key}" if prefix else key
        text += f"\n[{name}]\n" + to_toml(value, name)
    return text


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON's escapes are valid TOML basic-string escapes
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


if __name__ == "__main__":
    sys.exit(main())
