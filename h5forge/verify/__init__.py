"""Stage 5, verify: structure, labels and per-sample digests of an asset (``checks``:
:func:`verify`, :class:`VerifyReport`), built from the labels and attribute digests
(``metadata``), the byte ranges against the HDF5 layout (``layout``) and the one read pass that
hashes samples and the whole file (``digests``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
