"""Packing at scale: parts planned (``plan``), packed in parallel (``parts``), surveyed
(``survey``) and merged into one asset (``merge``, ``assemble``) with checked copies
(``stored_copy``, ``checked_copy``, ``kernel_copy``, ``file_check``, ``download``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
