"""Stage 2, discover: list the samples and their labels, from an ImageFolder layout or a
sample listing (``catalog``: :func:`discover`, :class:`Catalog`; ``folder``; ``listing``; ``rows``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
