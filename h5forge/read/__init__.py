"""Training-time reading: :class:`H5ImageDataset` (``dataset``), its per-process handles
(``state``), reading and decoding the samples of file rows (``samples``) and handing whole
batches from DataLoader workers over shared memory (``batches``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
