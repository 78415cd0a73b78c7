"""What a reader pays to check, at open, that a local version's file is the one published.

``H5ImageDataset(BASE, version=SHA)`` on a local store now checks the version's file against
its sidecar before reading (:func:`h5forge.read.version.check_version_file`): the sidecar names
the sha256, the file has the recorded size, and its index and attributes, hashed again, give
the recorded ``metadata_sha256``. Timed in the same run, interleaved, best of ``--repeat``,
page cache warm (the photo set packed decoded 224, published as a version):

- open, checked: ``H5ImageDataset(BASE, version=SHA)`` (the pin, the check, the open);
- open of the file: ``H5ImageDataset(FILE)`` (the version's file by its own path: no pin, no
  check): the reference;
- the check alone: ``check_version_file``;
- full sha256 of the file: what checking every byte at open would cost instead.

Target (issue 28): the check costs <= 0.1x the full hash (milliseconds, not a read of the
file), so a reader can afford it at every open; the checked open is shown against the plain one.

    python -m benchmarks.bench_version_open --count 2000
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks._common import best, image_root, interleave, parser, start_report, table, verdict
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.release import publish_version
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.version import check_version_file


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    args = p.parse_args()
    report = start_report("Opening a local version: the check that its file is the one published")
    root, described = image_root(args)
    with tempfile.TemporaryDirectory(prefix="h5bench-vopen-") as tmp:
        work = Path(tmp)
        packed = pack(root, work / "set.h5", config=PackConfig(ImageConfig()))
        base = str(work / "store" / "set")
        published = publish_version(packed.path, Location(base))
        sha, file = published.sha256, published.url

        def checked() -> None:
            len(H5ImageDataset(base, version=sha))

        def plain() -> None:
            len(H5ImageDataset(file))

        def check() -> None:
            check_version_file(Location(file), sha)

        def full() -> None:
            Location(file).sha256()

        times = interleave(
            {"checked": checked, "plain": plain, "check": check, "full": full}, args.repeat
        )
        size = Path(file).stat().st_size
    b = {k: best(v) for k, v in times.items()}
    rows = [
        [
            "open, checked (version=SHA)",
            f"{b['checked'] * 1e3:.1f}",
            f"{b['checked'] / b['plain']:.2f}x",
            "",
        ],
        ["open of the file (no pin, no check)", f"{b['plain'] * 1e3:.1f}", "1.00x", ""],
        [
            "the check alone",
            f"{b['check'] * 1e3:.1f}",
            f"{b['check'] / b['full']:.3f}x of the full hash",
            verdict(b["check"] / b["full"], 0.1, at_most=True),
        ],
        ["full sha256 of the file", f"{b['full'] * 1e3:.1f}", "", ""],
    ]
    report.add(
        f"Input: {described}; {packed.num_samples} samples decoded 224, file {size:,} bytes; "
        f"best of {args.repeat}, interleaved, page cache warm."
    )
    report.add(table(["variant", "best ms", "ratio", "target"], rows))
    report.write(not args.no_record)


if __name__ == "__main__":
    main()
