"""The site builds with no warnings, and no internal link or anchor of it is broken."""

from __future__ import annotations

import textwrap
from pathlib import Path

from docs_site import Build, broken_links, build_site


def test_the_site_builds_strictly_with_no_warning(built_site: Build) -> None:
    assert built_site.returncode == 0, built_site.output
    assert "WARNING" not in built_site.output, built_site.output


def test_every_internal_link_and_anchor_of_the_built_site_resolves(site_dir: Path) -> None:
    assert (site_dir / "index.html").is_file()
    assert broken_links(site_dir) == []


def test_the_link_check_reports_a_missing_page_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "index.html").write_text(
        '<a href="sub/page.html#here">ok</a> <a href="sub/page.html#gone">anchor</a>'
        ' <a href="missing.html">page</a> <a href="#top">self</a> <a href="https://x.test/">out</a>'
        ' <h1 id="top">t</h1>'
    )
    (tmp_path / "sub" / "page.html").write_text('<h2 id="here">h</h2><img src="../img.png">')
    assert broken_links(tmp_path) == [
        "index.html: sub/page.html#gone -> no anchor #gone",
        "index.html: missing.html -> no such file",
        "sub/page.html: ../img.png -> no such file",
    ]


def test_the_strict_build_fails_on_a_link_to_a_missing_anchor_or_file(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[a](other.md#nowhere) and [b](absent.md)\n")
    (docs / "other.md").write_text("# Other\n\n## Somewhere\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        textwrap.dedent(
            """\
            site_name: t
            validation:
              links:
                not_found: warn
                anchors: warn
            """
        )
    )
    build = build_site(tmp_path / "site", config)
    assert build.returncode != 0
    assert "'other.md' does not contain an anchor '#nowhere'" in build.output
    assert "'absent.md', but the target is not found" in build.output
