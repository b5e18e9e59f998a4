"""MkDocs hooks: the CLI reference generated from the code, and the committed figures.

``cli-reference.md`` holds the marker ``<!-- cli-reference -->``; at build time it is replaced by
every command of the click tree behind ``interp.cli.app`` (a typer app, or a click group named
``interp.cli.cli``): its help text, usage line and each option's help record (names, metavar,
default, ``[required]``), exactly as ``interp COMMAND --help`` prints them. Nothing is written by
hand, so the page cannot drift from the options the code declares.

The repository's ``figures/`` folder (committed study figures) is served under ``figures/`` so
that the results pages can show them without copying PNGs into ``docs/``; pages link them as
``../figures/...``, which reads right in the repository and is rewritten for the site.
"""

from __future__ import annotations

import html
import importlib
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File

MARKER = "<!-- cli-reference -->"
ROOT = Path(__file__).resolve().parent.parent


def _root_command() -> Any:
    """The click command tree of the ``interp`` command line."""
    cli = importlib.import_module("interp.cli")
    app = getattr(cli, "app", None)
    if app is None:
        return cli.cli
    if hasattr(app, "context_class"):  # already a click command
        return app
    import typer.main

    return typer.main.get_command(app)


def _cell(text: str) -> str:
    """Markdown-table-safe text: ``|`` and HTML escaped outside backtick code spans."""
    parts = text.replace("\n", " ").split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no code span at all
        parts = [text.replace("\n", " ").replace("`", "\\`")]
    for i in range(0, len(parts), 2):  # even parts are outside code spans
        parts[i] = html.escape(parts[i], quote=False).replace("|", "\\|")
    return "`".join(parts)


def _walk(cmd: Any, path: list[str], parent: Any, out: list[str]) -> None:
    ctx = cmd.context_class(cmd, info_name=path[-1], parent=parent)
    depth = min(len(path) + 1, 6)
    out += [f"{'#' * depth} `{' '.join(path)}`", ""]
    for para in (cmd.help or "").strip().split("\n\n"):
        if para.strip():
            out += [_cell(para.strip()), ""]
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    out += ["```text", f"{ctx.command_path} {usage}".rstrip(), "```", ""]
    rows = [r for r in (p.get_help_record(ctx) for p in cmd.get_params(ctx)) if r]
    if rows:
        out += ["| option | what it sets |", "| --- | --- |"]
        out += [f"| <code>{html.escape(name)}</code> | {_cell(help_ or '')} |"
                for name, help_ in rows]
        out.append("")
    subs = getattr(cmd, "commands", {})
    for name in cmd.list_commands(ctx) if subs else []:
        sub = cmd.get_command(ctx, name)
        if sub is not None and not getattr(sub, "hidden", False):
            _walk(sub, [*path, name], ctx, out)


def cli_reference() -> str:
    """Markdown for every command of ``interp`` (help, usage, options), from the code."""
    out: list[str] = []
    _walk(_root_command(), ["interp"], None, out)
    return "\n".join(out)


def on_files(files: Any, config: Any) -> Any:
    """Serve the repository's committed ``figures/**/*.png`` under ``figures/``."""
    for png in sorted((ROOT / "figures").rglob("*.png")):
        files.append(File(png.relative_to(ROOT).as_posix(), str(ROOT), config["site_dir"],
                          config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the CLI-reference marker with the generated reference; point figure links.

    Pages link the committed figures relative to the repository (``../figures/...`` from
    ``docs/``, ``../../figures/...`` from ``docs/findings/``: right when the Markdown is read in
    the repository); the site serves them under ``figures/`` (:func:`on_files`), one level
    nearer.
    """
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    up = "../" * page.file.src_uri.count("/")
    return markdown.replace(f"](../{up}figures/", f"]({up}figures/")
