"""``python -m h5forge.cli``: the library's command line (see :mod:`h5forge.cli.app`)."""

from h5forge.cli.app import main

main()
