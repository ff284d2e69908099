"""Command-line flags generated from dataclass fields, and the parser every command of the kitchen uses.

One reading of values everywhere: a boolean flag takes true or false (any case), and alone means true; a flag
with choices takes exactly one of them; `none` turns an optional flag off. Flag names are never abbreviated
(`--compute_clas 2m` is an error, not a run), and a value may start with '-' (`--compute_class -5h` reaches
the flag's own check).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing

BOOL_VALUES = ("true", "false")


def arg(default, help: str, choices: tuple | None = None):
    """A dataclass field with the help text (and the accepted values) its command-line flag shows."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching, and with values that may start with '-'.

    argparse takes `-5h` after `--compute_class` for an option and says "expected one argument"; here a token
    after a flag that stores one value is that flag's value unless it is itself a flag of this parser.
    """

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        argv = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(self._join_dashed_values(argv), namespace)

    def _join_dashed_values(self, argv: list[str]) -> list[str]:
        stores_one = {s for a in self._actions if isinstance(a, argparse._StoreAction) and a.nargs in (None, "?")
                      for s in a.option_strings}
        known = {s for a in self._actions for s in a.option_strings}
        joined, i = [], 0
        while i < len(argv):
            token, following = argv[i], argv[i + 1] if i + 1 < len(argv) else None
            if (token in stores_one and following is not None and following.startswith("-") and following != "-"
                    and following.split("=")[0] not in known):
                joined.append(f"{token}={following}")
                i += 2
            else:
                joined.append(token)
                i += 1
        return joined


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in BOOL_VALUES:
        return value == "true"
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


def _parser_for(annotation, choices: tuple | None = None):
    """The argparse type of a field annotation such as int, float | None or str; with choices, a value must be
    one of them (after the conversion)."""
    base, optional = _field_type(annotation)
    convert = parse_bool if base is bool else base

    def parse(text: str):
        if optional and text.strip().lower() == "none":
            return None
        value = convert(text)
        if choices is not None and value not in choices:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(map(str, choices))}, got '{text}'")
        return value

    parse.__name__ = getattr(base, "__name__", str(base))  # argparse names the type in its errors
    return parse


def _default_text(default) -> str:
    return "none" if default is None else str(default).lower() if isinstance(default, bool) else str(default)


def add_dataclass_flags(parser: argparse.ArgumentParser, cls, title: str, defaults: dict | str | None = None) -> None:
    """One flag per field of `cls`, with its help, choices and default.

    defaults: the defaults --help shows: None, the fields' own; a dict, these instead (a named config's values);
    a string, said once under the title instead of each flag's (where they depend on another flag)."""
    group = parser.add_argument_group(title, defaults if isinstance(defaults, str) else None)
    types_of = typing.get_type_hints(cls)  # the fields' types, also where annotations are strings (PEP 563)
    for f in dataclasses.fields(cls):
        help_text = f.metadata.get("help", "")
        if not isinstance(defaults, str):
            default = defaults[f.name] if isinstance(defaults, dict) else f.default
            help_text += f" (default: {_default_text(default)})"
        choices = f.metadata.get("choices")
        # a bare boolean flag means true; default None still marks "not given" for overrides()
        is_bool = _field_type(types_of[f.name])[0] is bool
        bare = {"nargs": "?", "const": True} if is_bool else {}
        metavar = "{" + ",".join(map(str, choices)) + "}" if choices else "true|false" if is_bool else f.name.upper()
        group.add_argument(f"--{f.name}", type=_parser_for(types_of[f.name], choices), default=None,
                           metavar=metavar, help=help_text.strip() or None, **bare)


def overrides(args: argparse.Namespace, cls) -> dict:
    """The fields of `cls` that were given on the command line."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}
