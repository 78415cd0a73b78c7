"""Stage 4, pack: write the preprocessed samples into the documented HDF5 layout, atomically
(``writer``: :func:`pack`, :class:`PackResult`; ``config``: :class:`PackConfig`; ``sink``,
``attrs``, ``checks``, ``bar``; ``commit``: the stage-verify-seal-rename protocol a merge
shares).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
