"""Exception types raised by h5forge.

Every error subclasses a built-in type so callers can catch what they already know
(``ValueError``, ``ImportError``), and carries a message that names the value found,
what was allowed, and how to fix it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "BusyError",
    "ChecksumError",
    "DestinationExistsError",
    "DownloadRefusedError",
    "EmptyDatasetError",
    "H5ForgeError",
    "IntegrityError",
    "MainReimportError",
    "MissingExtraError",
    "PreviewPublishError",
    "StoreError",
    "TooManyBadImagesError",
    "UnsafeArchiveError",
    "UnsafePathError",
    "UnsealedFileError",
    "UnsupportedPlatformError",
]


class H5ForgeError(Exception):
    """Base class of every error h5forge raises on purpose."""


class IntegrityError(H5ForgeError, ValueError):
    """A file, sample or transfer does not match what it claims to be.

    Attributes:
        failures: one line per failing check (sample index, expected and actual values).
    """

    def __init__(self, message: str, failures: Sequence[str] = ()) -> None:
        self.failures = list(failures)
        if self.failures:
            shown = self.failures[:20]
            more = len(self.failures) - len(shown)
            message = message + "\n  - " + "\n  - ".join(shown)
            if more:
                message += f"\n  ... and {more} more"
        super().__init__(message)


class UnsealedFileError(IntegrityError):
    """The file is a ``.partial``, was never sealed, or has an unknown format version."""


class ChecksumError(IntegrityError):
    """A downloaded or published byte stream does not have the expected digest."""


class TooManyBadImagesError(H5ForgeError, ValueError):
    """More inputs were quarantined than ``max_bad_fraction`` allows.

    Attributes:
        quarantined: ``(path, reason)`` for every quarantined input.
    """

    def __init__(self, message: str, quarantined: Sequence[tuple[str, str]] = ()) -> None:
        self.quarantined = list(quarantined)
        super().__init__(message)


class EmptyDatasetError(H5ForgeError, ValueError):
    """The source holds no usable image, or a class folder holds none."""


class UnsafeArchiveError(H5ForgeError, ValueError):
    """An archive member would escape the staging folder or exceeds a safety cap."""


class DownloadRefusedError(H5ForgeError, OSError):
    """The downloader refused the server's answer, and another attempt would get the same one.

    A redirect it does not follow (out of http(s), or more hops than it allows: the message
    names the hop, ``from -> to``, redacted), or an HTTP status that is neither a success nor
    worth retrying. An ``OSError``, as every other failed download is; not an
    :class:`UnsafeArchiveError` (nothing was extracted) and never retried (an
    :class:`H5ForgeError`).
    """


class StoreError(H5ForgeError, OSError):
    """A remote store kept failing a read after its client's retries: it throttled (503
    SlowDown), answered a server error, dropped the connection mid-answer or timed out on every
    attempt. The message names the URL, the bytes, what failed, the attempts and the storage
    option that allows more (:mod:`h5forge.store_errors`). Nothing is wrong with the asset:
    read again later."""


class MissingExtraError(H5ForgeError, ImportError):
    """An optional dependency is needed for the requested feature (message names the extra)."""


class MainReimportError(H5ForgeError, RuntimeError):
    """An entry point that starts processes was called where spawned children run it again.

    The message shows the fix: call it under ``if __name__ == "__main__":``.
    """


class UnsupportedPlatformError(H5ForgeError, NotImplementedError):
    """A Linux-only code path was reached on a platform without the system call it needs."""


class DestinationExistsError(H5ForgeError, FileExistsError):
    """The output or destination exists and replacing it was not asked for.

    Attributes:
        url: the destination (redacted); the command line words the fix as ``--overwrite``.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__(f"{url} already exists; set overwrite=True to replace it")


class PreviewPublishError(H5ForgeError):
    """The asset and its sidecar were published; only the preview beside them failed.

    The asset is complete and valid (the sidecar is its commit marker); the cause (e.g. a
    full disk) is ``__cause__``.

    Attributes:
        url: the published asset (redacted); sidecar_url: its sidecar; preview_url: the
            preview that could not be written.
    """

    def __init__(self, message: str, *, url: str, sidecar_url: str, preview_url: str) -> None:
        self.url, self.sidecar_url, self.preview_url = url, sidecar_url, preview_url
        super().__init__(message)


class UnsafePathError(H5ForgeError, FileExistsError):
    """A name h5forge is about to create is taken by something it did not make (a planted
    symlink, a hard link, a file of another run or user); nothing was written through it."""


class BusyError(H5ForgeError, BlockingIOError):
    """Another live run holds the output; the message names it (pid, host) and what to do."""
