"""Packing at scale: shards planned (``plan``), packed in parallel (``shards``), surveyed
(``survey``) and merged into one asset (``merge``, ``assemble``): stored bytes copied by the
stored-copy kernel (:mod:`h5forge.asset.stored_copy`), whole shard files hashed (``file_check``),
remote shards downloaded (``download``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
