"""Stage 3, preprocess: decode, normalise and resize each image on every core, quarantining
the broken ones with a reason (``config``: :class:`ImageConfig`; ``decode``, its steps in
``normalise``, ``jpeg`` (the simplejpeg decoder) and ``resample``; ``images``, one input to
stored bytes or a quarantine reason; ``pool``, with its start method and fork server in
``workers``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
