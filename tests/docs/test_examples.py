"""The Python examples of README.md and docs/*.md run, so they cannot rot.

Every fenced ``python`` block of those pages is preceded (blank lines aside) by one marker:

* ``<!-- run -->`` or ``<!-- run: WORD ... -->``: the block is a whole script. It is written to
  ``example.py`` in an empty temporary folder and run there by this Python in a subprocess,
  which must exit 0. The words ask for what the script assumes around it (:data:`SETUPS`):
  ``photos`` (an ImageFolder ``photos/<class>/<image>``), ``splits`` (``photos/<split>/<class>/
  <image>``), ``prefect`` (the session's Prefect test server in ``PREFECT_API_URL``), ``s3`` (the
  loopback moto S3 server as ``AWS_ENDPOINT_URL``, with an empty bucket ``my-bucket``), and
  ``slow`` (the test gets the ``slow`` marker).
* ``<!-- not run: REASON -->``: the block cannot run here; the reason says why (a GPU cluster,
  a real bucket, a fragment of a larger script).

A block without a marker fails :func:`test_every_python_example_is_marked`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from h5forge.demo import write_image_folder

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
MARKER = re.compile(r"^<!--\s*(?:(run)(?::\s*([\w\s,-]*))?|not run:\s*(\S.*?))\s*-->$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
EXAMPLE_TIMEOUT_S = 420


@dataclass(frozen=True)
class Example:
    """One fenced python block: where it is, its code, and its marker."""

    page: Path
    line: int
    code: str
    marker: str | None  # the marker line, or None when there is none
    runs: bool
    words: tuple[str, ...]
    reason: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def extract(page: Path) -> list[Example]:
    """Every fenced ``python``/``py`` block of ``page``, with the marker before it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, lang = opening.groups()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if lang in ("python", "py"):
            body = [
                line[len(indent) :] if line.startswith(indent) else line
                for line in lines[i + 1 : end]
            ]
            before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            found.append(_example(page, i + 1, "\n".join(body) + "\n", before))
        i = end + 1
    return found


def _example(page: Path, line: int, code: str, before: str) -> Example:
    match = MARKER.match(before)
    if not match:
        return Example(page, line, code, None, False, (), "")
    run, words, reason = match.groups()
    return Example(
        page,
        line,
        code,
        before,
        runs=bool(run),
        words=tuple(re.split(r"[\s,]+", (words or "").strip())) if words and words.strip() else (),
        reason=reason or "",
    )


EXAMPLES = [example for page in PAGES for example in extract(page)]
RUNNABLE = [example for example in EXAMPLES if example.runs]


Setup = Callable[[Path, pytest.FixtureRequest], dict[str, str]]


def _photos(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    write_image_folder(
        tmp / "photos",
        classes=("cat", "dog", "owl"),
        per_class=8,
        seed=3,
        size=((48, 96), (48, 96)),
    )
    return {}


def _splits(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    write_image_folder(
        tmp / "photos",
        classes=("cat", "dog", "owl"),
        per_class=8,
        splits=("train", "val"),
        seed=4,
        size=((48, 96), (48, 96)),
    )
    return {}


def _prefect(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    # prefect_harness also puts PREFECT_API_URL into this process's environment
    return {"PREFECT_API_URL": request.getfixturevalue("prefect_harness")}


def _s3(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    import s3fs

    # s3_storage_options isolates the AWS environment (test keys, no ~/.aws, no metadata server)
    options: dict[str, Any] = request.getfixturevalue("s3_storage_options")
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    if fs.exists("my-bucket"):
        fs.rm("my-bucket", recursive=True)
    fs.mkdir("my-bucket")
    request.addfinalizer(lambda: fs.rm("my-bucket", recursive=True))
    # botocore (and so s3fs) takes the endpoint from the environment: the example reads
    # s3://my-bucket/... exactly as it would on AWS.
    return {"AWS_ENDPOINT_URL": options["client_kwargs"]["endpoint_url"]}


SETUPS: dict[str, Setup] = {
    "photos": _photos,
    "splits": _splits,
    "prefect": _prefect,
    "s3": _s3,
    "slow": lambda tmp, request: {},
}


def test_every_python_example_is_marked() -> None:
    unmarked = [e.id for e in EXAMPLES if e.marker is None]
    assert not unmarked, (
        f"python examples without a marker: {unmarked}; put `<!-- run -->` (or "
        "`<!-- run: photos prefect ... -->`) before a whole script, or `<!-- not run: REASON -->`"
    )


def test_markers_name_known_setups() -> None:
    unknown = {e.id: w for e in RUNNABLE for w in e.words if w not in SETUPS}
    assert not unknown, f"unknown setup words {unknown}; known: {sorted(SETUPS)}"


def test_the_required_examples_run() -> None:
    """The README's script, training with resume, a remote read and a versioned build run."""
    ran = {e.page.name for e in RUNNABLE}
    assert {"README.md", "training.md", "remote.md", "versions.md"} <= ran, ran
    readme = [e for e in RUNNABLE if e.page.name == "README.md"]
    assert any("build_dataset" in e.code and '__name__ == "__main__"' in e.code for e in readme)


def test_getting_started_shows_the_readmes_script() -> None:
    """The README's script is shown again in Getting started; it runs once, from the README."""
    readme = next(e for e in RUNNABLE if e.page.name == "README.md" and "build_dataset" in e.code)
    page = [e.code for e in EXAMPLES if e.page.name == "getting-started.md"]
    assert readme.code in page, "docs/getting-started.md must show the README's script as is"


def test_extract_finds_markers_and_indented_blocks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- run: photos slow -->\n\n```python\nprint(1)\n```\n\n"
        "- item\n\n    <!-- not run: needs a GPU cluster -->\n\n"
        "    ```python\n    x = 1\n    ```\n\n"
        "```python\ny = 2\n```\n```bash\necho\n```\n",
        encoding="utf-8",
    )
    first, second, third = extract(page)
    assert (first.runs, first.words, first.code) == (True, ("photos", "slow"), "print(1)\n")
    assert (second.runs, second.reason, second.code) == (False, "needs a GPU cluster", "x = 1\n")
    assert third.marker is None


def _marks(example: Example) -> list[pytest.MarkDecorator]:
    return [pytest.mark.slow] if "slow" in example.words else []


# above the subprocess's own limit, so that a hung example still reports its output
@pytest.mark.timeout(EXAMPLE_TIMEOUT_S + 120)
@pytest.mark.parametrize("example", [pytest.param(e, id=e.id, marks=_marks(e)) for e in RUNNABLE])
def test_example_runs(example: Example, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    extra: dict[str, str] = {}
    for word in example.words:
        extra.update(SETUPS[word](tmp_path, request))
    # the environment after the setups (their fixtures set and clear variables)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(extra, PREFECT_SERVER_ANALYTICS_ENABLED="false")
    script = tmp_path / "example.py"
    script.write_text(example.code, encoding="utf-8")
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=EXAMPLE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        output = _tail(e.stdout) + _tail(e.stderr)
        pytest.fail(f"{example.id} ran past {EXAMPLE_TIMEOUT_S} s\n--- output\n{output}")
    assert done.returncode == 0, (
        f"{example.id} exited {done.returncode}\n--- stdout\n{done.stdout[-4000:]}"
        f"\n--- stderr\n{done.stderr[-6000:]}"
    )


def _tail(output: str | bytes | None) -> str:
    text = output.decode(errors="replace") if isinstance(output, bytes) else output or ""
    return text[-4000:]
