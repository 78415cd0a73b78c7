"""Stage 1, fetch: bring a source (folder, archive, URL, bucket) into a staging folder with
checksums, retries and safe extraction (``sources``: :func:`fetch`; ``http``, ``extract``,
``cache``, ``staging``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
