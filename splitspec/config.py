"""Command-line parsing for the services' config dataclasses.

Each service declares one frozen dataclass; every field becomes a `--flag` whose help text is the
field's `metadata["help"]` followed by its default, once: a help text that already says
"(default: ...)" (a default worked out at start-up, e.g. "directory name") keeps its own words.
The parsed object is passed explicitly to whatever needs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Sequence, TypeVar

T = TypeVar("T")

DEFAULT_MODEL = "models/target"  # the target shipped in the repository (relative to its root)


def option(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with CLI help text."""
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default),
                                 metadata={"help": help, **kwargs})
    return dataclasses.field(default=default, metadata={"help": help, **kwargs})


def shown_default(default: Any) -> str:
    """A default as --help shows it: on / off for a switch, none for an empty value."""
    if isinstance(default, bool):
        return "on" if default else "off"
    if default is None or default == "" or (isinstance(default, (list, tuple)) and not default):
        return "none"
    if isinstance(default, (list, tuple)):
        return ", ".join(map(str, default))
    return str(default)


def with_default(help_text: str, default: Any, repeatable: bool = False) -> str:
    """`help_text` followed by its default, unless it already says what the default is."""
    if "default:" in help_text:
        return help_text
    shown = shown_default(default).replace("%", "%%")  # argparse %-formats help texts
    return f"{help_text} ({'repeatable; ' if repeatable else ''}default: {shown})"


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """A flag per field; fields whose metadata names a `group` (options shared by several
    services, e.g. splitspec/tls_options.py) are listed under that heading in --help."""
    hints = typing.get_type_hints(cls)
    groups: dict[str, argparse._ArgumentGroup] = {}
    top = parser
    for f in dataclasses.fields(cls):
        group = f.metadata.get("group")
        parser = (groups.setdefault(group, top.add_argument_group(group)) if group else top)
        # a renamed option keeps its old flag as a deprecated alias (metadata "aliases")
        aliases = tuple(f.metadata.get("aliases", ()))
        flags = ["--" + f.name.replace("_", "-"), *aliases]
        dest = {"dest": f.name}
        kind = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text = f.metadata.get("help", "")
        if aliases:
            help_text += f" ({', '.join(aliases)}: deprecated spelling)"
        origin = typing.get_origin(kind)
        args = typing.get_args(kind)
        if kind is bool:
            parser.add_argument(*flags, **dest, default=default,
                                action=argparse.BooleanOptionalAction,
                                help=with_default(help_text, default))
        elif origin in (tuple, list):
            # None here: a flag given on the command line replaces the default list.
            parser.add_argument(*flags, **dest, default=None, action="append", type=args[0],
                                help=with_default(help_text, default, repeatable=True))
        else:
            if origin is typing.Union or str(origin) == "types.UnionType":
                kind = next(a for a in args if a is not type(None))
            choices = f.metadata.get("choices")
            parser.add_argument(*flags, **dest, default=default, type=kind, choices=choices,
                                help=with_default(help_text, default))


def parse_config(cls: type[T], argv: Sequence[str] | None = None,
                 description: str | None = None) -> T:
    parser = argparse.ArgumentParser(description=description or cls.__doc__)
    add_arguments(parser, cls)
    return from_namespace(cls, parser.parse_args(argv))


def from_namespace(cls: type[T], ns: argparse.Namespace) -> T:
    """The config object from parsed arguments (extra attributes of `ns` are ignored)."""
    values = {}
    for f in dataclasses.fields(cls):
        value = getattr(ns, f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if isinstance(default, (list, tuple)):
            value = type(default)(default if value is None else value)
        values[f.name] = value
    return cls(**values)
