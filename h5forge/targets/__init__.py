"""Targets beyond one class: the columns a sample carries besides its image and class.

A *schema* (:mod:`h5forge.targets.schema`) names each column and its kind: ``multilabel``
(a set of class names), ``boxes`` (XYXY boxes with a class and an ``iscrowd`` flag), ``mask``
(a second image of class ids, one per pixel), ``text`` (a UTF-8 string) or ``number``.
Sources give the raw values (:class:`h5forge.discover.catalog.Sample` ``targets``), in the
coordinates of the source file's pixel grid; :mod:`h5forge.targets.geometry` moves boxes and
masks with the image (EXIF orientation, resize, crop); :mod:`h5forge.targets.store` turns one
sample's values into the bytes each column stores, writes the columns into ``/targets`` and
reads them back. ``docs/FORMAT.md`` (format version 2) is the normative layout.
"""
