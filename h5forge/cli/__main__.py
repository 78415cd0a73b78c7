"""``python -m h5forge.cli``: the library's command line (see :mod:`h5forge.cli.app`)."""

from h5forge.cli.app import main

if __name__ == "__main__":  # spawned workers import this module again: run only once
    main()
