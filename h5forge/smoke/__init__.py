"""Smoke-load: read a finished asset the way training code will, and check what comes out.

:func:`h5forge.smoke.load.smoke_load` runs the check (DataLoader workers under each start
method); :mod:`h5forge.smoke.expected` holds what each sample must be and the comparison.

Nothing is imported here, so that naming a module of this package stays cheap.
"""
