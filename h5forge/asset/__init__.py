"""The asset on disk, shared by every stage that writes or reads one: the layout's names
(``format``), opening a local or remote file and loading its index (``access``), the link and
filter walk that refuses references out of the file (``structure``) and where the writer puts
metadata and index (``placement``).

Nothing is imported here, so that naming a module of this package stays cheap.
"""
