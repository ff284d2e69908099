"""Command-line flags generated from dataclass fields; a boolean flag takes true/false, and alone means true."""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing


def arg(default, help: str, choices: tuple | None = None):
    """A dataclass field with the help text (and the accepted values) its command-line flag shows."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def add_bool_flag(parser, name: str, default: bool, help: str) -> None:
    """--name true/false; a bare --name means true (so `--dry_run` works as people type it)."""
    parser.add_argument(name, type=parse_bool, nargs="?", const=True, default=default, metavar="true|false",
                        help=help)


def _field_type(annotation):
    """(base type, optional) of a field annotation such as int, float | None or str."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    optional = typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1
    return (args[0] if optional else annotation), optional


def _parser_for(annotation):
    """The argparse type of a field annotation such as int, float | None or str."""
    base, optional = _field_type(annotation)
    convert = parse_bool if base is bool else base

    def parse(text: str):
        if optional and text.strip().lower() == "none":
            return None
        return convert(text)

    parse.__name__ = getattr(base, "__name__", str(base))  # argparse names the type in its errors
    return parse


def add_dataclass_flags(parser: argparse.ArgumentParser, cls, title: str, show_defaults: bool = True) -> None:
    group = parser.add_argument_group(title)
    types_of = typing.get_type_hints(cls)  # the fields' types, also where annotations are strings (PEP 563)
    for f in dataclasses.fields(cls):
        help_text = f.metadata.get("help", "") + (f" (default: {f.default})" if show_defaults else "")
        choices = f.metadata.get("choices")
        # a bare boolean flag means true; default None still marks "not given" for overrides()
        bare = {"nargs": "?", "const": True} if _field_type(types_of[f.name])[0] is bool else {}
        group.add_argument(f"--{f.name}", type=_parser_for(types_of[f.name]), default=None, choices=choices,
                           metavar="{" + ",".join(choices) + "}" if choices else f.name.upper(),
                           help=help_text.lstrip() or None, **bare)


def overrides(args: argparse.Namespace, cls) -> dict:
    """The fields of `cls` that were given on the command line."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}
