"""Every processing version a claim accepts names the article's step outputs and published page."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.articles.publish import publish_path
from onceflow.articles.storage import StepStore
from onceflow.sheets.keys import check_version

_VERSION = st.from_regex(r"[A-Za-z0-9_.-]{1,40}", fullmatch=True)


@settings(max_examples=300, deadline=None, database=None)
@given(version=_VERSION)
def test_a_version_the_claim_accepts_is_a_path_segment_and_one_it_refuses_is_refused_first(
    version, tmp_path_factory
):
    store = StepStore(tmp_path_factory.getbasetemp().as_uri())
    try:
        check_version(version)
    except ValueError:
        # refused at claim time, never half-way through the chain
        assert version.startswith(".")
        with pytest.raises(ValueError):
            publish_path("0123abcd", version)
        return
    # "v1..2" was accepted by the claim, then refused by every step's write (ValueError, retried)
    assert publish_path("0123abcd", version) == f"articles/0123abcd/{version}/index.html"
    assert store.location("0123abcd", version, "fetch", 1, "raw.html").name == "fetch.1.raw.html"


@pytest.mark.parametrize("version", [".", "..", ".v1"])
def test_a_version_naming_a_folder_is_refused_by_the_claim_and_by_the_paths(version):
    with pytest.raises(ValueError, match=r"not start with '\.'"):
        check_version(version)
    with pytest.raises(ValueError, match=r"not start with '\.'"):
        publish_path("0123abcd", version)


def test_a_version_with_inner_dots_names_one_folder():
    assert publish_path("0123abcd", "v1..2") == "articles/0123abcd/v1..2/index.html"
