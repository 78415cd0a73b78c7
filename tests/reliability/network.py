"""Campaign 5 — network faults: HTTP drops, stalls, 5xx, short and wrong bodies; S3 outages.

HTTP (``fetch`` against the loopback server of ``tests/fixtures/servers.py``): each trial queues a
random sequence of faults for the archive's URL — a connection dropped after a random number of
body bytes (a short body), a stall longer than the timeout, 500/502/503, a Range request
answered from byte 0 or ignored, a redirect (same origin, or to a second server: another
origin), a 404, bytes of the right length but the wrong content, an endless body, a body or a
response head trickled a byte at a time, an endless run of ``100 Continue``, a Content-Length
larger or smaller than the body, a 206 of bytes 0.. whatever was asked — then fetches it with
``sha256`` pinned, a caller header, ``retries=3``, ``timeout=0.5`` s, ``min_rate=1000`` B/s and
``max_bytes=4 MiB``. The outcome must match what the sequence allows: completed with exactly
the archive's files, or a clear error (``ChecksumError`` naming both digests,
``TimeoutError``/``ConnectionError`` naming the URL and the attempts, ``FileNotFoundError`` for a
404, ``UnsafeArchiveError`` naming ``max_bytes`` for an endless body) within a bound computed
from the timeout and the retry schedule — a stalled or trickling connection never hangs — with
the destination absent, no staging, incoming, lock or partial download left behind, and the
caller header never seen by the other origin.

S3 (a moto server that is stopped and restarted on the same port, keeping its buckets): each
trial publishes a ~24 MB file while the server goes away at a random moment of the upload for a
random time (sometimes long enough that s3fs's retries give up, sometimes not). ``publish`` must
either complete — file and sidecar match, ``verify`` over ``s3://`` passes — or raise within a
bounded time, with no sidecar written (nothing published). After the server is back, the same
publish must complete.

Build level (with a Prefect server, full campaign only): ``h5forge build http://...`` completes
through drops and 5xx, and fails with exit 1 and "nothing was published" on a permanent 404,
leaving the destination empty.
"""

from __future__ import annotations

import hashlib
import io
import random
import shutil
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from h5forge.demo import write_image_folder
from h5forge.errors import ChecksumError, UnsafeArchiveError
from h5forge.fetch.sources import fetch
from h5forge.publish.sidecar import read_sidecar
from h5forge.publish.storage import publish
from tests.fixtures.servers import LoopbackHTTP
from tests.reliability._result import CampaignResult
from tests.reliability._servers import RestartableS3, loopback_http

__all__ = ["http_trial", "make_archive", "run", "s3_trial"]

RETRIES, TIMEOUT, BACKOFF, MIN_RATE, MAX_BYTES = 3, 0.5, 0.05, 1000.0, 4 << 20
SECRET = {"X-Campaign-Secret": "never-cross-origin"}
# The last two end a trial for sure; they are added to a few trials only.
FAULTS = (
    "drop",
    "stall",
    "500",
    "502",
    "503",
    "bad_range",
    "ignore_range",
    "redirect",
    "cross_redirect",
    "endless",
    "trickle",
    "trickle_head",
    "continues",
    "lie_long",
    "lie_short",
    "partial",
    "corrupt",
    "404",
)
# How many failures without progress a fault can cause (a Content-Length larger than the body
# also makes the resume answer 416, which restarts); used by _allowed.
_NO_PROGRESS = {
    "500": 1,
    "502": 1,
    "503": 1,
    "stall": 1,
    "bad_range": 1,
    "trickle": 1,
    "trickle_head": 1,
    "continues": 1,
    "lie_long": 1,
    "lie_short": 2,
    "partial": 1,
}


def make_archive(work: Path) -> tuple[bytes, dict[str, bytes]]:
    """A small ImageFolder as .tar.gz bytes, and its files (relative path -> bytes)."""
    src = work / "net-src"
    files = write_image_folder(
        src, classes=("a", "b", "c"), per_class=8, seed=4, size=((40, 80), (40, 80))
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(src, arcname="data")
    content = {str(p.relative_to(src)): p.read_bytes() for p in files}
    shutil.rmtree(src)
    return buf.getvalue(), content


def _queue(
    http: LoopbackHTTP,
    path: str,
    faults: list[str],
    size: int,
    rng: random.Random,
    other: LoopbackHTTP | None,
) -> None:
    for f in faults:
        if f == "drop":
            http.drop(path, after=rng.randrange(1, size))
        elif f == "stall":
            http.stall(path, seconds=30, after=rng.randrange(0, size))  # 0: no progress
        elif f in ("500", "502", "503"):
            http.fail(path, status=int(f))
        elif f == "bad_range":
            http.bad_range(path)
        elif f == "ignore_range":
            http.ignore_range(path)
        elif f == "redirect":
            http.redirect(path, to=path.replace(".tar.gz", "-moved.tar.gz"))
        elif f == "cross_redirect":
            moved = path.replace(".tar.gz", "-moved.tar.gz")
            http.redirect(path, to=other.url(moved) if other else moved)
        elif f == "endless":
            http.endless(path)
        elif f == "trickle":
            http.trickle(path, seconds=0.05)
        elif f == "trickle_head":
            http.trickle(path, seconds=0.05, head=True)
        elif f == "continues":
            http.continues(path)
        elif f == "lie_long":  # declares fewer bytes than it sends
            http.lie_length(path, length=rng.randrange(1, size))
        elif f == "lie_short":  # declares more bytes than it sends
            http.lie_length(path, length=size + rng.randrange(1, size))
        elif f == "partial":
            http.partial(path, 0, rng.randrange(1, size + 1))
        elif f == "corrupt":
            http.corrupt(path)
        elif f == "404":
            http.fail(path, status=404)


def _allowed(faults: list[str]) -> set[str]:
    """The outcomes a fault sequence may lead to (every one must be clear and bounded).

    Completing with exactly the archive's files is always allowed. A checksum error needs a
    corrupt body, a not-found a 404, giving up more no-progress failures (5xx, a stall or a
    bad resume answer) than ``RETRIES``; a redirect or a request without Range can make later
    faults moot, so these are upper bounds, not predictions.
    """
    allowed = {"complete"}
    if "corrupt" in faults:
        allowed.add("checksum")
    if "404" in faults:
        allowed.add("notfound")
    if "endless" in faults:
        allowed.add("too-big")
    if sum(_NO_PROGRESS.get(f, 0) for f in faults) > RETRIES:
        allowed.add("gives-up")
    return allowed


def http_trial(
    k: int,
    http: LoopbackHTTP,
    archive: bytes,
    content: dict[str, bytes],
    work: Path,
    rng: random.Random,
    res: CampaignResult,
    other: LoopbackHTTP | None = None,
) -> None:
    """One fetch through a random fault sequence (``other``: the second origin)."""
    path = f"/t{k}/data.tar.gz"
    moved = path.replace(".tar.gz", "-moved.tar.gz")
    http.serve(path, archive)
    http.serve(moved, archive)
    if other is not None:
        other.serve(moved, archive)
    faults = [rng.choice(FAULTS[:-2]) for _ in range(rng.randrange(0, 5))]
    if rng.random() < 0.08:
        faults.append(rng.choice(["corrupt", "404"]))
    _queue(http, path, faults, len(archive), rng, other)
    box = work / f"http-{k}"
    shutil.rmtree(box, ignore_errors=True)
    box.mkdir(parents=True)
    dest = box / "dest"
    sha = hashlib.sha256(archive).hexdigest()
    t0 = time.perf_counter()
    outcome, detail = "complete", ""
    try:
        result = fetch(
            http.url(path),
            dest,
            sha256=sha,
            retries=RETRIES,
            timeout=TIMEOUT,
            backoff=BACKOFF,
            cache_dir=box / "cache",
            min_rate=MIN_RATE,
            max_bytes=MAX_BYTES,
            storage_options={"headers": SECRET},
        )
        got = {
            str(p.relative_to(Path(result.root))): p.read_bytes()
            for p in Path(result.root).rglob("*")
            if p.is_file() and p.name[0] != "."
        }
        if got != content:
            outcome, detail = "WRONG CONTENT", f"{len(got)} files"
    except ChecksumError as e:
        outcome, detail = "checksum", str(e)[:80]
    except FileNotFoundError as e:
        outcome, detail = "notfound", str(e)[:80]
    except (TimeoutError, ConnectionError) as e:
        outcome, detail = "gives-up", str(e)[:120]
    except UnsafeArchiveError as e:
        outcome, detail = ("too-big" if "max_bytes" in str(e) else "unclear unsafe"), str(e)[:120]
    except Exception as e:  # noqa: BLE001 - classified below as an unclear error
        outcome, detail = f"unclear {type(e).__name__}", str(e)[:200]
    seconds = time.perf_counter() - t0
    # No-progress attempts: at most (RETRIES + 1) per streak, each <= TIMEOUT plus backoff.
    bound = (len(faults) + RETRIES + 2) * (TIMEOUT + 0.5) + 5
    left = sorted(
        str(p.relative_to(box))
        for p in box.rglob("*")
        if any(s in p.name for s in (".staging-", ".incoming-", ".part-", ".lock"))
    )
    allowed = _allowed(faults)
    problems = []
    if outcome != "complete" and dest.exists():
        problems.append(f"failed ({outcome}) but {dest} exists")
    if left:
        problems.append(f"left {left}")
    if seconds > bound:
        problems.append(f"took {seconds:.1f} s, bound {bound:.1f} s (a hang?)")
    leaked = [
        r.path
        for r in (other.requests_for(moved) if other else [])
        if "X-Campaign-Secret" in r.headers
    ]
    if leaked:
        problems.append(f"LEAKED the caller header to another origin: {leaked}")
    if outcome.startswith(("unclear", "WRONG")):
        problems.append(f"{outcome}: {detail}")
    elif outcome not in allowed:
        problems.append(f"expected one of {sorted(allowed)}, got {outcome}: {detail}")
    label = f"http {'+'.join(faults) or 'no fault'} -> {outcome}"
    res.record(
        f"http: {outcome}",
        detected=not problems,
        lost=outcome == "WRONG CONTENT" or bool(leaked),
        problem=f"trial {k} {label}: " + "; ".join(problems) if problems else None,
    )
    if not problems:
        shutil.rmtree(box, ignore_errors=True)


def s3_trial(
    k: int,
    s3: RestartableS3,
    local: Path,
    sha: str,
    rng: random.Random,
    res: CampaignResult,
    log: Callable[[str], None],
    when: tuple[float, float] | None = None,
) -> None:
    """Publish while the S3 server goes away mid-upload; then publish again once it is back.

    ``when``: ``(seconds into the upload, outage seconds)``; random when None.
    """
    import s3fs

    bucket = "h5forge-net"
    url = f"s3://{bucket}/trial-{k}/asset.h5"
    options = s3.storage_options()
    fs = s3fs.S3FileSystem(**options)
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    delay, outage = when or (rng.uniform(0.0, 0.6), rng.choice([0.3, 1.0, 3.0, 8.0]))

    def outage_now() -> None:
        time.sleep(delay)
        s3.stop()
        time.sleep(outage)
        s3.start()

    chaos = threading.Thread(target=outage_now, daemon=True)
    t0 = time.perf_counter()
    chaos.start()
    outcome, problems = "", []
    try:
        publish(local, url, storage_options=options, extra={"counts": {"": {"x": 1}}})
        outcome = "completed despite the outage"
    except Exception as e:  # noqa: BLE001 - classified: which errors are clear is reported
        outcome = f"failed: {type(e).__name__}"
        if (
            "127.0.0.1" not in str(e)
            and "endpoint" not in str(e).lower()
            and "connect" not in str(e).lower()
            and "read-back" not in str(e)
        ):
            problems.append(f"unclear error {type(e).__name__}: {str(e)[:200]}")
    seconds = time.perf_counter() - t0
    chaos.join()
    if seconds > 120:
        problems.append(f"publish took {seconds:.0f} s (a hang?)")
    fresh = s3fs.S3FileSystem(**options)
    path = url[len("s3://") :]
    sidecar = fresh.exists(path + ".manifest.json")
    if sidecar:
        m = read_sidecar(url, storage_options=options)
        if m["sha256"] != sha or fresh.size(path) != m["bytes"]:
            problems.append("TORN: the sidecar does not match the object")
        elif outcome.startswith("failed"):
            # The sidecar PUT reached the server, its answer did not (the server went away):
            # an ambiguous commit. Consistent (checked above); a retry finds it unchanged.
            outcome += ", but its sidecar had landed (ambiguous commit, consistent)"
    try:
        again = publish(
            local, url, storage_options=options, extra={"counts": {"": {"x": 1}}}, overwrite=True
        )
        if again.sha256 != sha:
            problems.append("re-publish digest differs")
        m = read_sidecar(url, storage_options=options)
        if m["sha256"] != sha or fresh.size(path) != m["bytes"]:
            problems.append("after re-publish the sidecar does not match the object")
    except Exception as e:  # noqa: BLE001
        problems.append(f"re-publish after the restart failed: {type(e).__name__}: {e}")
    res.record(
        f"s3 outage during publish: {outcome}",
        detected=not problems,
        lost=any("TORN" in p for p in problems),
        problem=f"s3 trial {k} (outage at +{delay:.2f}s for {outage}s): " + "; ".join(problems)
        if problems
        else None,
    )
    log(
        f"  s3 trial {k}: outage at +{delay:.2f}s for {outage:.1f}s -> {outcome} "
        f"in {seconds:.1f}s{' PROBLEMS' if problems else ''}"
    )


def run(
    *,
    http_trials: int = 120,
    s3_trials: int = 12,
    seed: int = 0,
    work: Path,
    build: Callable[[LoopbackHTTP, bytes, CampaignResult], None] | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> CampaignResult:
    """HTTP fault trials, S3 outage trials and (when ``build`` is given) build-level trials."""
    import os

    t0 = time.perf_counter()
    res = CampaignResult("network")
    rng = random.Random(seed)
    archive, content = make_archive(work)
    with loopback_http() as http, loopback_http() as other:
        for k in range(http_trials):
            http_trial(k, http, archive, content, work, rng, res, other)
        log(f"  http: {http_trials} trials")
        if build is not None:
            build(http, archive, res)
    if s3_trials:
        saved = {k: os.environ.get(k) for k in _AWS}
        os.environ.update(_AWS)
        s3 = RestartableS3()
        try:
            local = work / "s3-asset.h5"
            local.write_bytes(random.Random(seed).randbytes(24 << 20))
            sha = hashlib.sha256(local.read_bytes()).hexdigest()
            for k in range(s3_trials):
                s3_trial(k, s3, local, sha, rng, res, log)
        finally:
            s3.close()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    res.seconds = time.perf_counter() - t0
    return res


_AWS: dict[str, Any] = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
