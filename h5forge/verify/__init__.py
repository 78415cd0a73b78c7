"""Stage 5, verify: structure, labels and per-sample digests of an asset (``checks``:
:func:`verify`, :class:`VerifyReport`).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
