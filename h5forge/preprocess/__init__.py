"""Stage 3, preprocess: decode, normalise and resize each image on every core, quarantining
the broken ones with a reason (``config``: :class:`ImageConfig`; ``images``; ``normalise``;
``jpeg``, the simplejpeg decoder; ``resample``, the array path's resize; ``pool``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
