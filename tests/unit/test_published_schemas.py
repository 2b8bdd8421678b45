"""The published schemas' install step: where it keeps them, and what a test meets without them."""

from __future__ import annotations

import json
from pathlib import Path

import published_schemas
import pytest


def test_a_missing_schema_fails_naming_make_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_SCHEMA_CACHE", str(tmp_path))
    with pytest.raises(AssertionError, match="run `make install`"):
        published_schemas.path("compose-spec.json")


def test_the_prepared_folder_names_its_sources() -> None:
    sources = json.loads(published_schemas.path("SOURCES.json").read_text())
    assert sources["files"] == published_schemas.FILES
    assert set(sources["wheels"]) == set(published_schemas.WHEELS)
    for kept in published_schemas.FILES:
        assert published_schemas.path(kept).stat().st_size > 0, kept


def test_the_folder_changes_with_the_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    before = published_schemas.folder()
    monkeypatch.setitem(published_schemas.WHEELS, "check-jsonschema", ("0.0.0", "0" * 64))
    assert published_schemas.folder() != before  # a new pin is fetched again, never read stale
