"""Packing at scale: parts planned (``plan``), packed in parallel (``parts``), surveyed
(``survey``) and merged into one asset (``merge``, ``assemble``): stored bytes copied by the
stored-copy kernel (:mod:`h5forge.asset.stored_copy`), whole part files hashed (``file_check``),
remote parts downloaded (``download``); or, for a sharded version, parts of its shard plan
packed and uploaded where they run, with no merge (``shard_parts``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
