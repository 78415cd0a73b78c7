"""Stage 7, publish: copy an asset through fsspec, read it back, compare, and write the
sidecar last (``storage``: :func:`publish`, the read-back, stale temps; ``sidecar``:
:func:`read_sidecar`; ``preview``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
