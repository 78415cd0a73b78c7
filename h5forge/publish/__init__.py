"""Stage 7, publish: copy an asset through fsspec, read it back, compare, and write the
manifest last (``storage``: :func:`publish`, the read-back, stale temps; ``manifest``:
:func:`read_manifest`; ``preview``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
