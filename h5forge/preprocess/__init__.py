"""Stage 3, preprocess: decode, normalise and resize each image on every core, quarantining
the broken ones with a reason (``images``: :class:`ImageConfig`; ``normalise``; ``pool``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
