"""Data Docs pages pointed at the docs folder's own copies of their CDN files (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from expectations.offline_docs import CDN_FILES, localize, rewrite_page

GX_ASSETS = "https://great-expectations-web-assets.s3.us-east-2.amazonaws.com"
BOOTSTRAP = "bootstrapcdn.com/bootstrap/4.3.1"
PAGE = (
    "<head>\n"
    f'<link rel="stylesheet" href="https://maxcdn.{BOOTSTRAP}/css/bootstrap.min.css"/>\n'
    f'<script src="https://stackpath.{BOOTSTRAP}/js/bootstrap.min.js" integrity="sha384-x"'
    ' crossorigin="anonymous"></script>\n'
    '<link rel="shortcut icon" href="../../../static/images/favicon.ico" type="image/x-icon"/>\n'
    f"<style>.x {{ background: url('{GX_ASSETS}/full_logo_dark.png') }}</style>\n"
    "</head><body>\n"
    f'<img src="{GX_ASSETS}/logo-long.png?d=20261126T1&dataContextId=c83b" alt="GX"/>\n'
    '<a href="https://greatexpectations.io">a link, not a load</a>\n'
    "</body>"
)


def test_cdn_files_logo_and_static_links_point_into_the_docs_folder() -> None:
    html = rewrite_page(PAGE, "../../../../static")
    assert 'href="../../../../static/vendor/bootstrap/dist/css/bootstrap.min.css"/>' in html
    script = '<script src="../../../../static/vendor/bootstrap/dist/js/bootstrap.min.js"></script>'
    assert script in html  # no integrity, no crossorigin: a file:// page cannot check them
    assert 'href="../../../../static/images/favicon.ico"' in html  # GX's is a folder short
    assert html.count("../../../../static/images/logo-long.png") == 2
    assert "amazonaws" not in html and "bootstrapcdn" not in html
    assert 'href="https://greatexpectations.io"' in html
    assert rewrite_page(html, "../../../../static") == html  # again: nothing changes


def test_every_cdn_url_of_the_templates_is_known() -> None:
    """GX's own templates name no CDN file that is not served locally."""
    import re

    import great_expectations

    templates = Path(great_expectations.__file__).parent / "render" / "view" / "templates"
    urls = set()
    for template in templates.glob("*.j2"):
        text = template.read_text()
        loads = r'<(?:script|link)[^>]*?(?:src|href)="(https://[^"{]+)"'
        urls |= set(re.findall(loads, text))
    assert len(urls) >= 12 and urls - set(CDN_FILES) == set()


def test_without_the_assets_pages_keep_their_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MQAUDIT_DOCS_ASSETS", str(tmp_path / "nothing"))
    (tmp_path / "index.html").write_text(PAGE)
    assert localize(tmp_path) == 0
    assert (tmp_path / "index.html").read_text() == PAGE
