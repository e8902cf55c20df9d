"""The `eagletree` command: `generate`, `bench`, `init-random`, `train-draft`, `config show` /
`validate`, `demo`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from eagletree.app import generate_cli
from eagletree.config.eagle_hook import resolve_speculative
from eagletree.config.settings import EngineSettings
from eagletree.config.target import ATTENTION_KINDS, TargetDescription
from eagletree.domain.errors import ConfigurationError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 bad configuration)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:  # the demo parses its own options, --help included
        from eagletree.app import demo  # imported here: `config` does not need it

        return demo.main(argv[1:])
    if argv[:1] == ["bench"]:  # parses its own options; imported here: it pulls in torch
        from eagletree.app import bench_cli

        return bench_cli.main(argv[1:])
    if argv[:1] == ["init-random"]:  # imported here: the checkpoint writer pulls in torch
        from eagletree.app import init_random_cli

        parser = argparse.ArgumentParser(prog="eagletree")
        init_random_cli.add_parser(parser.add_subparsers(dest="command", required=True))
        return init_random_cli.run(parser.parse_args(argv))
    if argv[:1] == ["train-draft"]:  # imported here: training pulls in torch and transformers
        from eagletree.app.training import cli as train_cli

        return train_cli.main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "generate":
        return generate_cli.run(args)
    # Warnings reach stderr through logging's last-resort handler unless the embedding
    # application configured logging; `config show` also prints them in [speculative.resolved].
    try:
        settings = (
            EngineSettings() if args.settings is None else EngineSettings.from_file(args.settings)
        )
        target = TargetDescription.for_architecture(args.target_arch, args.attention_kind)
        resolved = resolve_speculative(settings, target)
    except ConfigurationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.config_command == "validate":
        print("ok")
        return 0
    values: dict[str, Any] = settings.model_dump()
    resolved_values = dataclasses.asdict(resolved)
    values["speculative"] = {**values["speculative"], "resolved": resolved_values}
    values["target"] = dataclasses.asdict(target)
    print(f"# eagletree settings resolved for {target.architecture} ({target.attention_kind})")
    print(to_toml(values), end="")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagletree", description="EAGLE tree speculative decoding."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    config = commands.add_parser("config", help="inspect and check settings")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    show = config_commands.add_parser("show", help="print the resolved settings as TOML")
    show.add_argument("--settings", metavar="FILE", help="a .toml, .yaml or .yml settings file")
    validate = config_commands.add_parser("validate", help="check a settings file; exit 1 if bad")
    validate.add_argument("settings", metavar="FILE")
    for sub in (show, validate):
        sub.add_argument(
            "--target-arch",
            default="LlamaForCausalLM",
            help="target architecture assumed until a checkpoint is given (default: %(default)s)",
        )
        sub.add_argument(
            "--attention-kind", choices=ATTENTION_KINDS, help="override the architecture's kind"
        )

    generate_cli.add_parser(commands)
    commands.add_parser(
        "bench", help="decode throughput of plain, chain and tree configurations", add_help=False
    )
    commands.add_parser(
        "init-random", help="write a random target and draft checkpoint", add_help=False
    )
    commands.add_parser("train-draft", help="train an EAGLE / EAGLE-3 draft head", add_help=False)
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
