"""Report stage: the build's markdown report and the link to its preview, as artifacts.

The report is rendered from the stages' own results: the pack stage's
:class:`~h5forge.pack.writer.PackResult`, the smoke-load's :class:`~h5forge.smoke.SmokeReport`
and the publisher's :class:`~h5forge.publish.storage.PublishResult`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact

from h5forge.pack.writer import PackResult
from h5forge.publish.storage import PublishResult
from h5forge.smoke.load import SmokeReport
from h5forge.tasks.common import run_name
from h5forge.tasks.pack import artifact_key

__all__ = ["render_report", "viewable_url", "write_report"]

# The markdown report lists this many quarantined files; the table artifact has them all.
_QUARANTINE_ROWS = 50
_TOP_BINS = 10  # histogram bins shown per target column


def viewable_url(url: str) -> str:
    """A link a browser can follow: local paths become ``file://`` URIs."""
    return url if "://" in url else Path(url).expanduser().resolve().as_uri()


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _counts_table(counts: dict[str, dict[str, int]], classes: tuple[str, ...]) -> list[str]:
    splits = sorted(counts)
    heads = [s or "(all)" for s in splits]
    lines = ["| class | " + " | ".join(heads) + " | total |", "|---|" + "---:|" * (len(splits) + 1)]
    totals = dict.fromkeys(splits, 0)
    for name in classes:
        row = [counts[s].get(name, 0) for s in splits]
        for s, v in zip(splits, row, strict=True):
            totals[s] += v
        lines.append(f"| {_cell(name)} | " + " | ".join(map(str, row)) + f" | {sum(row)} |")
    lines.append(
        "| **total** | "
        + " | ".join(str(totals[s]) for s in splits)
        + f" | **{sum(totals.values())}** |"
    )
    return lines


def _figure(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return "–" if value is None else _cell(value)


def _top(counts: dict[str, Any]) -> str:
    ranked = sorted(counts.items(), key=lambda kv: -float(kv[1] or 0))[:_TOP_BINS]
    return ", ".join(f"{_cell(k)} {_figure(n)}" for k, n in ranked)


def _targets_section(stats: dict[str, dict[str, Any]]) -> list[str]:
    """One row per target column: its figures, and its largest histogram bins (class ->
    count: boxes or samples per class, pixels per mask class id)."""
    if not stats:
        return []
    lines = ["## Targets", "", "| column | figures | largest counts |", "|---|---|---|"]
    for name, figures in stats.items():
        words = {k: k.replace("_", " ") for k in figures}
        plain = [f"{words[k]} {_figure(v)}" for k, v in figures.items() if not isinstance(v, dict)]
        bins = [f"{words[k]}: {_top(v)}" for k, v in figures.items() if isinstance(v, dict) and v]
        lines.append(f"| {_cell(name)} | {'; '.join(plain)} | {'; '.join(bins) or '–'} |")
    return [*lines, ""]


def _rate(stage: str, secs: float, pack: PackResult, smoke: SmokeReport, mb: float) -> str:
    if secs <= 0:
        return "–"
    if stage in ("discover", "pack", "verify"):
        return f"{pack.num_samples / secs:,.0f} img/s"
    if stage == "smoke-load":
        return f"{smoke.samples_checked / secs:,.0f} img/s"
    if stage == "publish":
        return f"{mb / secs:,.1f} MB/s"
    return "–"


def render_report(
    *,
    dataset: str,
    source: str,
    pack: PackResult,
    smoke: SmokeReport,
    published: PublishResult,
    preview: str,
    format_version: int,
    stage_seconds: dict[str, float],
) -> str:
    """The build report as markdown (pure function: the task only publishes it).

    ``preview`` is the published preview's URL (redacted).
    """
    n = pack.num_samples
    mb = published.bytes / 1e6
    lines = [
        f"# h5forge build: {dataset}",
        "",
        f"- **asset**: `{published.url}` ({mb:,.1f} MB, format v{format_version})",
        f"- **sha256**: `{published.sha256}`",
        f"- **sidecar**: `{published.sidecar_url}`",
        f"- **preview**: [{Path(preview).name}]({viewable_url(preview)})",
        f"- **source**: `{source}`",
        f"- **samples**: {n} in {pack.num_classes} classes; "
        f"**quarantined**: {pack.num_quarantined}",
        "",
        "## Samples per class and split",
        "",
        *_counts_table(pack.counts, pack.classes),
        "",
        *_targets_section(pack.target_stats),
        f"## Quarantined files ({pack.num_quarantined})",
        "",
    ]
    if pack.quarantined:
        lines += ["| path | reason |", "|---|---|"]
        lines += [f"| `{_cell(p)}` | {_cell(r)} |" for p, r in pack.quarantined[:_QUARANTINE_ROWS]]
        if pack.num_quarantined > _QUARANTINE_ROWS:
            lines.append(
                f"\n… {pack.num_quarantined - _QUARANTINE_ROWS} more in the quarantine "
                "table artifact."
            )
    else:
        lines.append("None: every input was packed.")
    lines += ["", "## Stages", "", "| stage | seconds | throughput |", "|---|---:|---:|"]
    for stage, secs in stage_seconds.items():
        lines.append(f"| {stage} | {secs:,.2f} | {_rate(stage, secs, pack, smoke, mb)} |")
    lines.append(f"| **total** | {sum(stage_seconds.values()):,.2f} | |")
    per_method = "; ".join(
        f"{m.start_method}: {round(m.images_per_second, 1):,.0f} img/s after "
        f"{round(m.startup_seconds, 2):.1f} s of worker start-up"
        for m in smoke.methods
    )
    lines += [
        "",
        "## Smoke-load",
        "",
        f"{smoke.samples_checked} samples read through `H5ImageDataset` in a DataLoader with "
        f"{smoke.workers} workers and checked (dtype, shape, label, sha256) — {per_method}. "
        "Rates count from the moment every worker has delivered its first batch.",
        "",
    ]
    return "\n".join(lines)


@task(name="report", task_run_name=run_name("report"))
def write_report(markdown: str, *, dataset: str, preview: str) -> None:
    """Publish ``markdown`` as the build report and a link artifact to the preview PNG."""
    create_markdown_artifact(
        markdown, key=artifact_key("build-report", dataset), description=f"build of {dataset}"
    )
    create_link_artifact(
        viewable_url(preview),
        link_text=f"preview of {dataset}",
        key=artifact_key("preview", dataset),
        description="grid of sample images with their class names",
    )
