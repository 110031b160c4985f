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
    """Typer renders help text through rich markup, whose emoji codes turn 'afterany:1234:1235' into
    'afterany🔢1235'; Typer has no setting for it, so its text builder is wrapped, once, with emoji off."""
    from rich.text import Text
    from typer import rich_utils

    if getattr(rich_utils._make_rich_text, "_emoji_off", False):
        return
    original = rich_utils._make_rich_text

    def make_rich_text(*, text: str, style: str = "", markup_mode: Any) -> Any:
        if markup_mode != rich_utils.MARKUP_MODE_RICH or rich_utils._has_ansi_character(text):
            return original(text=text, style=style, markup_mode=markup_mode)
        import inspect

        return rich_utils.highlighter(Text.from_markup(inspect.cleandoc(text), style=style, emoji=False))

    make_rich_text._emoji_off = True  # type: ignore[attr-defined]
    rich_utils._make_rich_text = make_rich_text


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
