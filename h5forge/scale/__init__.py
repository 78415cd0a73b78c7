"""Packing at scale: shards packed in parallel (``shards``), surveyed (``survey``) and merged
into one asset (``merge``) with checked copies (``checked_copy``, ``kernel_copy``,
``file_check``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
