"""The documentation site in a real browser: every page of the built site opened in
headless Chromium; a broken link, image or diagram, or a console error fails it."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str | None:
    for name in CHROMIUM:
        path = shutil.which(name)
        if path:
            return path
    return None


def why_not() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -e '.[site]'"
    if chromium() is None:
        return (
            "no Chromium on PATH (Debian: apt-get install chromium; .ci/run installs it): "
            "the docs site is not checked in a browser here"
        )
    return None


pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


def pages(out: Path) -> list[str]:
    """Every page of the built site, as its path below the root ("" for the home page)."""
    found = []
    for p in out.rglob("index.html"):
        if "assets" in p.parts:
            continue
        rel = p.relative_to(out).parent.as_posix()
        found.append("" if rel == "." else rel + "/")
    return sorted(found)


def test_every_page_loads_with_its_links_images_and_diagrams(site: tuple[str, Path]) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    base, out = site
    paths = pages(out)
    assert len(paths) >= 15
    problems: list[str] = []
    links: set[str] = set()
    diagrams = 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            current = [""]
            page.on(
                "console",
                lambda m: (
                    problems.append(f"{current[0]}: console {m.type}: {m.text}")
                    if m.type == "error"
                    else None
                ),
            )
            page.on("pageerror", lambda e: problems.append(f"{current[0]}: page error: {e}"))
            # A request the next goto() cancels fails with net::ERR_ABORTED: the browser
            # asks for the favicon after the page is idle (seen once: api/'s favicon.png
            # aborted by the next page). A missing resource answers 4xx (the response
            # handler below) and a broken image has no size (checked below): those fail.
            page.on(
                "requestfailed",
                lambda r: (
                    None
                    if r.failure == "net::ERR_ABORTED"
                    else problems.append(f"{current[0]}: request failed: {r.url} ({r.failure})")
                ),
            )
            page.on(
                "response",
                lambda r: (
                    problems.append(f"{current[0]}: {r.status} {r.url}")
                    if r.status >= 400
                    else None
                ),
            )
            for path in paths:
                current[0] = path or "/"
                page.goto(urllib.parse.urljoin(base, path), wait_until="networkidle")
                source = (out / path / "index.html").read_text(encoding="utf-8")
                blocks = source.count('<pre class="mermaid">')
                if blocks:
                    # The theme renders each block into a closed shadow root: a rendered
                    # diagram is a div.mermaid with a size; a source left as text is not.
                    try:
                        page.wait_for_function(
                            "[...document.querySelectorAll('div.mermaid')].length === "
                            f"{blocks} && [...document.querySelectorAll('div.mermaid')]"
                            ".every(d => d.getBoundingClientRect().height > 50)",
                            timeout=30_000,
                        )
                        diagrams += blocks
                    except PlaywrightTimeout:
                        problems.append(f"{path}: {blocks} diagram(s) not all rendered in 30 s")
                broken = page.evaluate(
                    "[...document.images].filter(i => !i.complete || i.naturalWidth === 0)"
                    ".map(i => i.src)"
                )
                problems += [f"{path}: broken image {src}" for src in broken]
                for href in page.evaluate(
                    "[...document.querySelectorAll('a[href]')].map(a => a.href)"
                ):
                    if href.startswith(base):
                        links.add(href.split("#", 1)[0])
        finally:
            browser.close()
    for link in sorted(links):
        try:
            with urllib.request.urlopen(link, timeout=10) as resp:
                if resp.status != 200:
                    problems.append(f"link {link}: {resp.status}")
        except urllib.error.HTTPError as exc:
            problems.append(f"link {link}: {exc.code}")
    assert problems == [], "\n".join(problems)
    assert diagrams >= 6, f"only {diagrams} diagrams rendered"
