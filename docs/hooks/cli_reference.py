"""mkdocs hook: the command-line reference, generated from the Typer app at build time.

A page that holds the line ``<!-- h5forge-cli-reference -->`` gets it replaced by one section
per command of ``h5forge`` (sub-commands of groups such as ``server`` included): the command's
help text, its usage line and a table of its arguments and options with their help and
defaults, all read from the click objects Typer builds, so the page cannot drift from
``h5forge --help``. Typer ships its own copy of click (``typer._click``), so the objects are
recognised by what they do (``list_commands``, ``param_type_name``), not by click's classes.
Outside the ``h5forge`` package on purpose: the site's build is not part of the library.
"""

from __future__ import annotations

from typing import Any

import typer

MARKER = "<!-- h5forge-cli-reference -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the marker with the reference; pages without it pass through unchanged."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_reference())


def cli_reference() -> str:
    """Markdown for every command of the console script, in the order ``--help`` lists them."""
    from h5forge.deployments.cli import app

    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="h5forge")
    return "\n".join(command_sections(root, ctx, level=2))


def _is_group(command: Any) -> bool:
    return hasattr(command, "list_commands")


def command_sections(command: Any, ctx: Any, *, level: int) -> list[str]:
    """The lines of ``command``'s section, then its sub-commands' (one level deeper)."""
    lines = [f"{'#' * level} `{ctx.command_path}`", ""]
    if command.help:
        lines += [_escape(_text(command.help)), ""]
    lines += ["```text", f"Usage: {ctx.command_path} {_usage(command, ctx)}", "```", ""]
    rows = [_row(p, ctx) for p in command.params if p.name != "help" and not p.hidden]
    rows = [row for row in rows if row]
    if rows:
        lines += ["| argument or option | what it does |", "|---|---|", *rows, ""]
    if _is_group(command):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            sub_ctx = sub.context_class(sub, info_name=name, parent=ctx)
            lines += command_sections(sub, sub_ctx, level=level + 1 if level < 3 else level)
    return lines


def _usage(command: Any, ctx: Any) -> str:
    options = [p for p in command.params if p.param_type_name == "option"]
    pieces = ["[OPTIONS]"] if options else []
    for param in command.params:
        if param.param_type_name == "argument":
            name = (param.name or "").upper()
            pieces.append(name if param.required else f"[{name}]")
    if _is_group(command):
        pieces.append("COMMAND [ARGS]...")
    return " ".join(pieces)


def _row(param: Any, ctx: Any) -> str:
    record = param.get_help_record(ctx) if hasattr(param, "get_help_record") else None
    if param.param_type_name == "argument":
        name = (param.name or "").upper()
        help_text = record[1] if record else ""
    elif record is None:
        return ""
    else:
        name, help_text = record
    # a pipe inside a code span does not split a cell; in text it does, and "[default: 2]"
    # would read as a link reference
    return f"| `{name}` | {_cell(_text(help_text)) or '&nbsp;'} |"


def _text(text: str) -> str:
    # click keeps a docstring's line breaks; markdown wants paragraphs. \b marks a block that
    # click prints as is: keep its lines.
    paragraphs = [
        " ".join(p.split()) if not p.startswith("\b") else p[1:] for p in text.split("\n\n")
    ]
    return "\n\n".join(p.strip() for p in paragraphs)


def _escape(text: str) -> str:
    """Help text as literal markdown: "<PATH>" is not a tag, "[a] [b]" not a link."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for char in "[]*":
        text = text.replace(char, "\\" + char)
    return text


def _cell(text: str) -> str:
    return _escape(text).replace("|", "\\|").replace("\n", " ")
