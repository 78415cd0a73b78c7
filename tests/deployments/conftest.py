"""Fixtures for the deployment tests."""

from __future__ import annotations

import pytest

from h5forge.demo import make_demo_archive


@pytest.fixture(scope="module")
def demo_source(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The built-in demo dataset (a deterministic ``.tar.gz`` of JPEGs and PNGs with two broken
    files), written once per module; returns the archive's path."""
    return str(make_demo_archive(tmp_path_factory.mktemp("demo-source")))
