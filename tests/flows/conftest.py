"""Fixtures for the flow tests: the demo archive, and one successful build shared by the tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from h5forge.demo import make_demo_archive
from h5forge.location import Location


@dataclass(frozen=True)
class DemoArchive:
    path: Path
    sha256: str


@dataclass(frozen=True)
class Built:
    """A completed run of ``build-h5-dataset`` on the demo archive."""

    state: Any  # prefect State
    summary: Any  # h5forge.flows.build.BuildSummary
    config: Any  # h5forge.flows.build.BuildConfig
    dest: Path
    cache_dir: Path


@pytest.fixture(scope="session")
def demo_archive(tmp_path_factory: pytest.TempPathFactory) -> DemoArchive:
    """The built-in demo dataset (300 images, 2 broken files) as a ``.tar.gz``."""
    path = make_demo_archive(tmp_path_factory.mktemp("demo-source"))
    return DemoArchive(path=path, sha256=Location.of(path).sha256())


@pytest.fixture(scope="session")
def fetch_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One fetch cache for the session, so later builds of the demo reuse the first fetch."""
    return tmp_path_factory.mktemp("fetch-cache")


@pytest.fixture(scope="session")
def built(
    prefect_harness: str,
    demo_archive: DemoArchive,
    fetch_cache: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Built:
    """The demo built once with default settings (fork + spawn smoke-load) to a local path."""
    from h5forge.flows.build import BuildConfig, build_dataset

    dest = tmp_path_factory.mktemp("published") / "demo.h5"
    config = BuildConfig(
        source=str(demo_archive.path), sha256=demo_archive.sha256, destination=str(dest)
    )
    state = build_dataset(config, cache_dir=str(fetch_cache), return_state=True)
    assert state.is_completed(), state.message
    return Built(
        state=state, summary=state.result(), config=config, dest=dest, cache_dir=fetch_cache
    )
