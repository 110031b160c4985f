"""How the CLI prints: rich output with emoji codes off, tables at full width when piped, and Typer
commands whose help text keeps ':1234:' as typed. rich is imported only when something is printed."""

from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand, TyperGroup

from flux_cluster.console import cli_console, print_table

__all__ = ["Command", "Group", "Typer", "cli_console", "print_table"]

if TYPE_CHECKING:
    from typer import _click as click


def _help_without_emoji() -> None:
    """Typer renders help text through rich markup: its emoji codes turn 'afterany:1234:1235' into
    'afterany🔢1235' and its tags eat '[task 3]'. Typer has no setting for either, so its text builder is
    wrapped, once: help is plain text ('\\[' still reads as '[', as rich markup has it), emoji off."""
    from rich.text import Text
    from typer import rich_utils

    if getattr(rich_utils._make_rich_text, "_emoji_off", False):
        return
    original = rich_utils._make_rich_text

    def make_rich_text(*, text: str, style: str = "", markup_mode: Any) -> Any:
        if markup_mode != rich_utils.MARKUP_MODE_RICH or rich_utils._has_ansi_character(text):
            return original(text=text, style=style, markup_mode=markup_mode)
        import inspect

        plain = inspect.cleandoc(text).replace("\\[", "[")
        return rich_utils.highlighter(Text(plain, style=style, overflow="fold"))  # a long path: never cut

    make_rich_text._emoji_off = True  # type: ignore[attr-defined]
    rich_utils._make_rich_text = make_rich_text
    _readable_types()


_TYPE_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "path": "PATH", "Path": "PATH"}


def _readable_types() -> None:
    """Typer shows an option's type as '<bool>' for a flag (which takes no value), '<int range>' and
    '<table|json|csv|md|html>' (cut mid-word in a narrow window). Shown instead: nothing for a flag, the
    metavar where one is given, else click's words (TEXT, INTEGER, PATH; a choice: its name in capitals,
    its choices listed in the help text)."""
    from typer import core, rich_utils

    def display_type_rich(self: Any, ctx: "click.Context") -> str | None:
        if getattr(self, "is_flag", False):
            return None
        if self.metavar is not None:
            return str(self.metavar)
        descriptor = self.type_descriptor
        if descriptor.is_choice:
            long = [o for o in getattr(self, "opts", []) if o.startswith("--")]
            label = (long[0][2:] if long else self.name or "value").upper().replace("-", "_")
        else:
            bare = self.display_type(ctx).strip("<>").removesuffix(" range")
            inner = bare.removeprefix("list[").removesuffix("]")
            label = _TYPE_NAMES.get(inner, inner.upper()) + ("..." if inner != bare else "")
        return label + ("..." if self.nargs != 1 and not label.endswith("...") else "")

    original_help = rich_utils._get_parameter_help

    def parameter_help(*, param: Any, ctx: "click.Context", markup_mode: Any) -> Any:
        columns = original_help(param=param, ctx=ctx, markup_mode=markup_mode)
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is not None and descriptor.is_choice and descriptor.choices and param.metavar is None:
            from rich.text import Text

            choices = ", ".join(str(getattr(c, "value", c)) for c in descriptor.choices)
            columns.renderables.insert(1, Text(f"One of: {choices}.", style=rich_utils.STYLE_OPTION_HELP))
        return columns

    core._TyperParameter.display_type_rich = display_type_rich  # type: ignore[method-assign]
    core.TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]
    rich_utils._get_parameter_help = parameter_help


class Command(TyperCommand):
    def format_help(self, ctx: "click.Context", formatter: "click.HelpFormatter") -> None:
        _help_without_emoji()
        super().format_help(ctx, formatter)


class Group(TyperGroup):
    def format_help(self, ctx: "click.Context", formatter: "click.HelpFormatter") -> None:
        _help_without_emoji()
        super().format_help(ctx, formatter)


class Typer(typer.Typer):
    """typer.Typer whose groups and commands print help without emoji codes."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cls", Group)
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", Command)
        return super().command(*args, **kwargs)
