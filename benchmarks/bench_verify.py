"""Full verify of a ~1.5 GB decoded file vs hashlib's sha256 of the same file.

``h5forge.verify.checks`` checks structure, labels, byte ranges, the metadata digest, every sample's
sha256 and the whole file's sha256 in one sequential pass. The baseline only hashes the file
(``hashlib.file_digest``, the standard library's own loop). Both read from the page cache (the
file is read once before timing); runs are interleaved, best of ``--repeat``.

    python -m benchmarks.bench_verify                  # target: verify >= 0.5 x hashlib
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from benchmarks._common import (
    best,
    image_root,
    interleave,
    parser,
    start_report,
    table,
    verdict,
)
from benchmarks.photoset import DATA


def _hashlib(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--side",
        type=int,
        default=500,
        help="decoded images are side x side x 3 (500: 2,000 images make ~1.5 GB)",
    )
    args = p.parse_args()
    from h5forge.pack.config import PackConfig
    from h5forge.pack.writer import pack
    from h5forge.preprocess.config import ImageConfig
    from h5forge.verify.checks import verify

    report = start_report("verify: full verify vs hashlib sha256 of the file")
    root, what = image_root(args)
    out = DATA / f"verify-{root.name}-{args.side}.h5"
    if not out.exists():
        print(f"packing {out} ...", flush=True)
        pack(root, out, config=PackConfig(ImageConfig(size=(args.side, args.side))))
    size = out.stat().st_size
    _hashlib(out)  # warm the page cache for both
    times = interleave(
        {"hashlib": lambda: _hashlib(out), "verify": lambda: verify(str(out))}, args.repeat
    )
    r = verify(str(out))
    assert r.sha256 == _hashlib(out)
    t_hash, t_verify = best(times["hashlib"]), best(times["verify"])
    ratio = t_hash / t_verify
    report.add(
        f"Input: {what}; packed decoded {args.side}x{args.side}x3, {r.num_samples} "
        f"samples, file {size / 1e9:.2f} GB (page cache warm)."
    )
    report.add(
        table(
            ["what", "best s", "GB/s", "vs hashlib"],
            [
                ["hashlib.file_digest sha256", t_hash, size / t_hash / 1e9, 1.0],
                [
                    "h5forge verify (every check, every sample + file sha256)",
                    t_verify,
                    size / t_verify / 1e9,
                    ratio,
                ],
            ],
        )
    )
    report.add(f"verify / hashlib = **{ratio:.2f}x**, {verdict(ratio, 0.5)}")
    report.write(not args.no_record)


if __name__ == "__main__":
    main()
