"""Stage 1, fetch: bring a source (folder, archive, URL, bucket) into a staging folder with
checksums, retries and safe extraction (``sources``: :func:`fetch`; ``http`` with ``connect``
and ``body``; ``objects``; ``cache``; ``extract`` with ``members``; ``staging``; ``dest``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
