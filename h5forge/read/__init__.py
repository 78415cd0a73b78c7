"""Training-time reading: :class:`H5ImageDataset` (``dataset``) and its batched reads
(``batches``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
