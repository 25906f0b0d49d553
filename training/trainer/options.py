"""Command-line options declared once, on the config dataclasses they fill.

A config field becomes a CLI option by carrying help text in its metadata: declared with
:func:`option` (its default, its help, optionally the flag's name), or, in packages that
must not know about the CLI (``optim``, ``distributed``), with a plain
``field(default=..., metadata={"help": ...})``. :func:`cli_options` walks a dataclass tree and
lists those fields, :func:`typer_command` turns the list into a Typer command, and
:func:`build_config` turns the parsed values back into the dataclass tree. A new option is
one new field; nothing else maps flags to fields.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

_REQUIRED = dataclasses.MISSING


def option(
    default: Any = _REQUIRED,
    help: str = "",
    *,
    flag: str | None = None,
    choices: Sequence[str] | None = None,
    required: bool = False,
) -> Any:
    """A dataclass field that is also a CLI option (``--flag``, default: the field's name).

    ``choices`` restricts a string; a ``Literal[...]`` field gets its values as choices
    without saying so. ``required`` makes the CLI ask for a field that code may leave at
    its default. List defaults are copied per instance.
    """
    metadata = {
        "help": help,
        "flag": flag,
        "choices": tuple(choices) if choices else None,
        "required": required,
    }
    if isinstance(default, list):
        items = list(default)
        return dataclasses.field(default_factory=lambda: list(items), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class CliOption:
    """One option: where its value goes in the config tree, and how the CLI shows it."""

    #: Field names from the root config down to the field (``("optimizer", "lr")``).
    path: tuple[str, ...]
    #: Python identifier of the option (``ns_schedule``); the flag is ``--ns-schedule``.
    name: str
    #: The type the CLI parses (``str`` for choices, ``list[str]`` for tuples of strings).
    cli_type: Any
    default: Any
    help: str
    choices: tuple[str, ...] | None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def declaration(self) -> str:
        """The flag as Typer declares it: a switch that is on by default also gets its
        ``--no-`` form, or it could not be turned off."""
        if self.cli_type is bool and self.default is True:
            return f"{self.flag}/--no-{self.flag[2:]}"
        return self.flag


def cli_options(config_type: type, path: tuple[str, ...] = ()) -> list[CliOption]:
    """Every field declared with :func:`option` in ``config_type`` and nested dataclasses."""
    hints = typing.get_type_hints(config_type)
    found: list[CliOption] = []
    for field in dataclasses.fields(config_type):
        hint = hints[field.name]
        if "help" in field.metadata:
            found.append(_cli_option(field, hint, (*path, field.name)))
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
            found.extend(cli_options(hint, (*path, field.name)))
    names = [o.name for o in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TypeError(f"{config_type.__name__}: two options named {duplicates}")
    return found


def _cli_option(field: dataclasses.Field[Any], hint: Any, path: tuple[str, ...]) -> CliOption:
    choices = field.metadata.get("choices")
    cli_type = hint
    if typing.get_origin(hint) is Literal:
        choices, cli_type = tuple(typing.get_args(hint)), str
    elif choices:
        cli_type = str
    elif typing.get_origin(hint) is tuple:
        cli_type = list[typing.get_args(hint)[0]]  # type: ignore[misc]
    default: Any
    if field.metadata.get("required"):
        default = _REQUIRED
    elif field.default is not dataclasses.MISSING:
        default = field.default
    elif field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    else:
        default = _REQUIRED
    if isinstance(default, tuple):
        default = list(default)
    return CliOption(
        path=path,
        name=field.metadata.get("flag") or field.name,
        cli_type=cli_type,
        default=default,
        help=field.metadata["help"],
        choices=choices,
    )


def typer_command(
    options: Sequence[CliOption], run: Callable[[dict[str, Any]], None], doc: str
) -> Callable[..., None]:
    """A function Typer can register: its parameters are ``options``, it calls ``run``."""
    parameters = []
    for opt in options:
        help_text = opt.help + (f" One of: {', '.join(opt.choices)}." if opt.choices else "")
        annotation = Annotated[opt.cli_type, typer.Option(opt.declaration, help=help_text)]  # type: ignore[name-defined]
        default = inspect.Parameter.empty if opt.default is _REQUIRED else opt.default
        parameters.append(
            inspect.Parameter(
                opt.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )

    def command(**values: Any) -> None:
        run(values)

    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    command.__doc__ = doc
    return command


def check_choices(options: Sequence[CliOption], values: Mapping[str, Any]) -> str | None:
    """The first value outside its option's choices, as a one-line message; else None."""
    for opt in options:
        if opt.choices and values[opt.name] not in opt.choices:
            return f"{opt.flag} must be one of {', '.join(opt.choices)}"
    return None


def build_config(config_type: type, options: Sequence[CliOption], values: Mapping[str, Any]) -> Any:
    """The config tree with every option's value in place and other fields at defaults."""
    tree: dict[str, Any] = {}
    for opt in options:
        node = tree
        for name in opt.path[:-1]:
            node = node.setdefault(name, {})
        node[opt.path[-1]] = values[opt.name]
    return _construct(config_type, tree)


def _construct(config_type: type, values: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(config_type)
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        hint = hints[name]
        if isinstance(value, dict):
            kwargs[name] = _construct(hint, value)
        elif typing.get_origin(hint) is tuple and isinstance(value, list):
            kwargs[name] = tuple(value)
        elif _accepts_path(hint) and isinstance(value, str):
            kwargs[name] = Path(value)
        else:
            kwargs[name] = value
    return config_type(**kwargs)


def _accepts_path(hint: Any) -> bool:
    if hint is Path:
        return True
    return isinstance(hint, types.UnionType) and Path in typing.get_args(hint)
