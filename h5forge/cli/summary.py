"""The readable text ``h5forge inspect`` prints for :func:`h5forge.summary.summarize`'s dict.

Every name that comes from the file goes through :func:`h5forge.text.printable`: a file cannot
send control characters to the terminal.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from h5forge.documents import DocumentError, parse_json
from h5forge.text import printable

__all__ = ["format_summary"]


def _lines(value: Any, indent: str) -> list[str]:
    """``key: value`` lines of a JSON-like value, nested mappings indented."""
    if not isinstance(value, dict):
        return [f"{indent}{printable(json.dumps(value, ensure_ascii=False))}"]
    out = []
    for key, item in sorted(value.items()):
        if isinstance(item, dict) and item:
            out.append(f"{indent}{printable(key)}:")
            out.extend(_lines(item, indent + "  "))
        else:
            shown = item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)
            out.append(f"{indent}{printable(key)}: {printable(shown)}")
    return out


def format_summary(info: Mapping[str, Any]) -> str:
    """The readable ``inspect`` text of :func:`h5forge.summary.summarize`'s dict."""
    attrs = info.get("attributes", {})
    get = attrs.get
    counts: dict[str, dict[str, int]] = info.get("counts", {})
    quarantined = info.get("quarantined", [])
    shape = info.get("image_shape")
    shown_shape = "x".join(map(str, shape)) if isinstance(shape, list) else str(shape)
    lines = [
        f"file:         {printable(info.get('url', ''))}",
        f"sealed:       {'yes' if info.get('sealed') else 'NO (not a finished asset)'}",
        f"format:       {printable(get('format', '?'))} v{get('format_version', '?')}, "
        f"written by h5forge {printable(get('h5forge_version', '?'))} at "
        f"{printable(get('created_at', '?'))}",
        f"layout:       {printable(get('layout', '?'))} ({printable(get('storage', '?'))} "
        f"storage, encoding {printable(get('encoding', '?'))}, mode {printable(get('mode', '?'))},"
        f" images {printable(shown_shape)})",
        f"compression:  {printable(get('compression', 'none'))}",
        f"size:         {int(info.get('bytes', 0)):,} bytes"
        + (
            f" in {info['shards']} shard{'' if info['shards'] == 1 else 's'}"
            if "shards" in info
            else ""
        ),
        f"samples:      {get('num_samples', '?')} in {get('num_classes', '?')} classes, "
        f"{get('num_quarantined', len(quarantined))} quarantined",
    ]
    if get("source_url"):
        lines.append(
            f"source:       {printable(get('source_url'))}"
            + (f" (sha256 {printable(get('source_sha256'))})" if get("source_sha256") else "")
        )
    targets = info.get("targets") or []
    if targets:
        from h5forge.targets.schema import Column
        from h5forge.targets.words import describe_columns

        words = describe_columns([Column(**c) for c in targets])
        lines.append(f"targets:      {printable(words)}")
    lines.append("counts:")
    for split, per_class in sorted(counts.items()):
        total = sum(per_class.values())
        per = ", ".join(f"{printable(c)} {n}" for c, n in per_class.items())
        lines.append(f"  {printable(split) or '(all)'}: {total} ({per})")
    config = info.get("config") or ""
    lines.append("config:")
    try:
        parsed = (
            parse_json(config, what="the config_json attribute")
            if isinstance(config, str) and config
            else config
        )
        lines.extend(_lines(parsed, "  ") if parsed else ["  (none)"])
    except DocumentError as e:  # shown, not raised: inspect is how one looks at a bad file
        lines.append(f"  ({printable(str(e), limit=200)})")
    total_bad = get("num_quarantined", len(quarantined))
    lines.append(f"quarantined:  {total_bad}")
    for path, reason in quarantined:
        lines.append(f"  {printable(path)}: {printable(reason)}")
    if isinstance(total_bad, int) and total_bad > len(quarantined):
        lines.append(
            f"  ... and {total_bad - len(quarantined)} more (all are in the file's "
            "/quarantine group)"
        )
    return "\n".join(lines)
