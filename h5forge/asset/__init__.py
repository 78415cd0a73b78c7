"""The asset on disk, shared by every stage that writes or reads one: the layout's names
(``format``), the metadata digest (``metadata``), opening a local or remote file (``open``),
loading and checking its index (``index``), reading sample byte ranges (``ranges``), the link
and filter walk that refuses references out of the file (``structure``), the declared sizes
checked against the counts (``declared``), the one chunk-index walk (``chunks``), where the
writer puts metadata and index (``placement``), and copying samples' stored bytes from one
sealed file into the file being written, checked (``stored_copy``, the stored-copy kernel used
by incremental reuse and the merge, over file-to-file byte copies: ``range_copy``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
