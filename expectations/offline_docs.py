"""Data Docs that read offline: the scripts, styles and fonts they load from CDNs, served
from the docs folder instead.

Great Expectations' page templates load bootstrap, jQuery, popper, bootstrap-table (with its
filter control), bootstrap-datepicker, vega and font-awesome from CDNs; without internet
the index shows no rows at all. `make docs-assets` installs the same packages at the same
versions from npm (`expectations/docs_assets/package*.json`) into ASSETS_ROOT; `localize`
copies the files the pages name to `DOCS/static/vendor/<package>/<path>` and points each
page there (each link relative to the page, as the docs' own static files are). Pages are
rewritten where they still name a CDN, so running it again changes nothing.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
from pathlib import Path

log = logging.getLogger("mqaudit.gate")

ASSETS_ENV = "MQAUDIT_DOCS_ASSETS"
VENDOR = Path("static") / "vendor"

# CDN URL in GX 1.x's templates -> (npm package, file in it). The versions are those the
# URLs name (package.json pins them); the bare majors (`vega@5`) are pinned there too.
CDN_FILES: dict[str, tuple[str, str]] = {
    "https://cdn.jsdelivr.net/npm/vega@5": ("vega", "build/vega.min.js"),
    "https://cdn.jsdelivr.net/npm/vega-lite@5": ("vega-lite", "build/vega-lite.min.js"),
    "https://cdn.jsdelivr.net/npm/vega-embed@6": ("vega-embed", "build/vega-embed.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": (
        "@fortawesome/fontawesome-free",
        "css/all.min.css",
    ),
    "https://code.jquery.com/jquery-3.7.1.min.js": ("jquery", "dist/jquery.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": (
        "popper.js",
        "dist/umd/popper.min.js",
    ),
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": (
        "bootstrap",
        "dist/js/bootstrap.min.js",
    ),
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": (
        "bootstrap",
        "dist/css/bootstrap.min.css",
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": (
        "bootstrap-table",
        "dist/bootstrap-table.min.js",
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": (
        "bootstrap-table",
        "dist/bootstrap-table.min.css",
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/"
    "bootstrap-table-filter-control.min.js": (
        "bootstrap-table",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
    ),
    # The templates take the filter control's styles from 1.19.0, its script from 1.19.1.
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/"
    "bootstrap-table-filter-control.min.css": (
        "bootstrap-table",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/"
    "bootstrap-table-filter-control.css": (
        "bootstrap-table",
        "dist/extensions/filter-control/bootstrap-table-filter-control.css",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/"
    "bootstrap-datepicker.min.js": ("bootstrap-datepicker", "dist/js/bootstrap-datepicker.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/"
    "bootstrap-datepicker.min.css": (
        "bootstrap-datepicker",
        "dist/css/bootstrap-datepicker.min.css",
    ),
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/"
    "bootstrap-prefers-dark.css": (
        "@forevolve/bootstrap-dark",
        "dist/css/bootstrap-prefers-dark.css",
    ),
}
# Whole folders some files load by relative URL (font-awesome's css: ../webfonts/...).
CDN_DIRS: list[tuple[str, str]] = [("@fortawesome/fontawesome-free", "webfonts")]

# A script or link naming a CDN URL; subresource integrity and CORS attributes go (a file://
# page cannot make the CORS request `crossorigin` asks for).
_URL = re.compile(
    r"""(?P<attr>src|href)=(?P<q>["'])(?P<url>https://[^"']+)(?P=q)"""
    r"""(?P<rest>[^>]*?)(?P<end>/?>)"""
)
_SRI = re.compile(r"""\s+(?:integrity|crossorigin)=(["'])[^"']*\1""")
# The navigation bar's logo (and its dark-mode twin in the styles) comes from GX's web
# assets bucket; the docs' own static/images has the logo.
_LOGO = re.compile(
    r"https://great-expectations-web-assets\.s3\.us-east-2\.amazonaws\.com/"
    r"(?:logo-long|full_logo_dark)\.png(?:\?[^\"'()\s]*)?"  # ?d=...&dataContextId=...
)


# Links to the docs' own static folder, made relative by GX's templates: on validation pages
# the favicon's link is one folder short (GX 1.24); each is made relative to its page again.
_STATIC = re.compile(r"""(?<=["'(])(?:\./|(?:\.\./)+)static/""")


def assets_root() -> Path:
    """Where `make docs-assets` put the npm packages (env MQAUDIT_DOCS_ASSETS wins)."""
    env = os.environ.get(ASSETS_ENV)
    if env:
        return Path(env)
    return Path(sys.prefix) / "share" / "mqaudit-docs-assets" / "node_modules"


def missing_assets(root: Path | None = None) -> list[str]:
    """The files the pages need that are not under `root`."""
    root = root or assets_root()
    need = [f"{pkg}/{name}" for pkg, name in CDN_FILES.values()]
    need += [f"{pkg}/{folder}" for pkg, folder in CDN_DIRS]
    return [n for n in need if not (root / n).exists()]


def _copy_assets(root: Path, docs_dir: Path) -> None:
    vendor = docs_dir / VENDOR
    for pkg, name in CDN_FILES.values():
        target = vendor / pkg / name
        source = root / pkg / name
        if not target.exists() or target.stat().st_size != source.stat().st_size:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    for pkg, folder in CDN_DIRS:
        shutil.copytree(root / pkg / folder, vendor / pkg / folder, dirs_exist_ok=True)


def rewrite_page(html: str, to_static: str) -> str:
    """`html` with every known CDN URL pointing under `to_static` (the relative URL of the
    docs' static folder)."""
    to_vendor = f"{to_static}/vendor"

    def local(m: re.Match[str]) -> str:
        known = CDN_FILES.get(m["url"])
        if known is None:
            return m.group(0)
        pkg, name = known
        rest = _SRI.sub("", m["rest"])
        return f"{m['attr']}={m['q']}{to_vendor}/{pkg}/{name}{m['q']}{rest}{m['end']}"

    html = _STATIC.sub(f"{to_static}/", _URL.sub(local, html))
    return _LOGO.sub(f"{to_static}/images/logo-long.png", html)


def localize(docs_dir: Path, since: float | None = None) -> int:
    """Serve the docs' CDN files from `docs_dir`; the number of pages rewritten.

    Only pages modified at or after `since` (a time.time()) are looked at, when given.
    Without the assets (no `make docs-assets`) the pages keep their CDN links: a warning.
    """
    root = assets_root()
    missing = missing_assets(root)
    if missing:
        log.warning(
            "Data Docs keep their CDN links: %s misses %s (run `make docs-assets`)",
            root,
            ", ".join(missing[:3]),
        )
        return 0
    docs_dir = Path(docs_dir)
    _copy_assets(root, docs_dir)
    static = docs_dir / VENDOR.parent
    rewritten = 0
    for page in docs_dir.rglob("*.html"):
        if since is not None and page.stat().st_mtime < since:
            continue
        html = page.read_text(encoding="utf-8")
        new = rewrite_page(html, Path(os.path.relpath(static, page.parent)).as_posix())
        if new != html:
            tmp = page.with_name(page.name + ".tmp")
            tmp.write_text(new, encoding="utf-8")
            os.replace(tmp, page)
            rewritten += 1
    return rewritten
