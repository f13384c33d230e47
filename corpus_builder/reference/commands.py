"""The CLI reference: every command of ``corpus``, its arguments and options with their types and defaults, and its
exit codes, read from the click commands themselves and from ``cli.EXIT_CODES``."""

from __future__ import annotations

import inspect

import click

from ..cli import cli, exit_codes
from .markdown import cell, table


def render_commands() -> str:
    intro = ("Every command of `corpus`, as `corpus COMMAND --help` prints it: its arguments, its options with their "
             "types and defaults, and what each exit code means. `corpus --version` prints the version; `-h` is "
             "`--help` everywhere.")
    overview = table(("command", "what it does"),
                     [(f"[`corpus {name}`](#corpus-{name})", cell(_first_sentence(command)))
                      for name, command in cli.commands.items()])
    sections = [_command(name, command) for name, command in cli.commands.items()]
    return "\n\n".join([f"# CLI reference\n\n{intro}", overview, *sections]) + "\n"


def _command(name: str, command: click.Command) -> str:
    context = click.Context(command, info_name=f"corpus {name}")
    usage = " ".join(["corpus", name, *command.collect_usage_pieces(context)])
    parts = [f"## `corpus {name}`", f"```\n{usage}\n```", inspect.cleandoc(command.help or "")]
    arguments = [param for param in command.params if isinstance(param, click.Argument)]
    if arguments:
        parts.append(table(("argument", "type", "required"),
                           [(f"`{param.make_metavar(context)}`", cell(_type(param)), "yes" if param.required else "no")
                            for param in arguments]))
    options = [param for param in command.params if isinstance(param, click.Option) and "--help" not in param.opts]
    if options:
        rows = [(_names(param, context), cell(_type(param)), _default(param, context), cell(param.help or ""))
                for param in options]
        parts.append(table(("option", "type", "default", "description"), rows))
    parts.append(table(("exit code", "meaning"), [(str(code), cell(meaning)) for code, meaning in exit_codes(name)]))
    return "\n\n".join(parts)


def _first_sentence(command: click.Command) -> str:
    text = " ".join(inspect.cleandoc(command.help or "").split("\n\n")[0].split())
    return text.split(": ")[0].split(". ")[0].rstrip(".")


def _names(option: click.Option, context: click.Context) -> str:
    metavar = "" if option.is_flag else f" {_metavar(option, context)}"
    text = ", ".join(f"`{name}{metavar}`" for name in [*option.opts, *option.secondary_opts])
    if option.required:
        text += " (required)"
    if option.multiple:
        text += " (repeatable)"
    return text


def _metavar(option: click.Option, context: click.Context) -> str:
    """The option's own metavar; else a short word for its type (click's "[a|b|c]" would repeat the type column)."""
    if option.metavar:
        return option.metavar
    if isinstance(option.type, click.Choice):
        return (option.name or "value").upper()
    if isinstance(option.type, click.FloatRange) and option.type.name == "share":
        return "SHARE"
    if isinstance(option.type, click.IntRange):
        return "N"
    if isinstance(option.type, click.FloatRange):
        return "X"
    return option.make_metavar(context)


def _type(param: click.Parameter) -> str:
    kind = param.type
    if isinstance(param, click.Option) and param.is_flag:
        return "flag"
    if isinstance(kind, click.Choice):
        return " | ".join(f"`{choice}`" for choice in kind.choices)
    if isinstance(kind, click.IntRange | click.FloatRange):
        bounds = [f"≥ {kind.min}" if kind.min is not None else "", f"≤ {kind.max}" if kind.max is not None else ""]
        number = "integer" if isinstance(kind, click.IntRange) else "number"
        return " ".join([number, *(bound for bound in bounds if bound)])
    if isinstance(kind, click.Path):
        return "path"
    return {"integer": "integer", "float": "number"}.get(kind.name, "text")


def _default(option: click.Option, context: click.Context) -> str:
    if option.is_flag or option.multiple:
        return ""
    default = option.get_default(context, call=False)
    unset = getattr(click.core, "UNSET", None)  # click 8.3's "no default given", beside None
    return "" if default is None or default is unset else f"`{default}`"
