"""The documentation site in a real browser: every page of the built site opened in
headless Chromium; a broken link, image or diagram, or a console error fails it, and so
does a code block cut on the right or a diagram whose text is drawn too small to read."""

from __future__ import annotations

import html
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

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
    wide: list[str] = []
    small: list[str] = []
    links: set[str] = set()
    diagrams = 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            # The width the pages are read at (issue 48's reader: 1400 px; the theme's
            # content column is then 868 px wide).
            page = browser.new_page(viewport={"width": 1400, "height": 900})
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
                        small += [f"{path}: {d}" for d in small_diagrams(page, source)]
                    except PlaywrightTimeout:
                        problems.append(f"{path}: {blocks} diagram(s) not all rendered in 30 s")
                # A code block wider than its column scrolls: what is past its right edge
                # is cut off for a reader.
                cut = page.evaluate(
                    "[...document.querySelectorAll('article pre > code')]"
                    ".filter(c => c.scrollWidth > c.clientWidth + 1)"
                    ".map(c => c.textContent.trim().split('\\n')[0].slice(0, 60))"
                )
                wide += [f"{path}: {first!r}" for first in cut]
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
    assert wide == [], "code blocks wider than their column:\n" + "\n".join(wide)
    assert small == [], "diagrams drawn too small to read:\n" + "\n".join(small)


# Mermaid writes a diagram's text at 16 px and scales the whole picture down to its
# column: below this scale the text is under about 10 px.
LEGIBLE_SCALE = 0.6


def small_diagrams(page: Any, source: str) -> list[str]:
    """The page's diagrams drawn at less than LEGIBLE_SCALE of their own size. The theme
    draws each into a closed shadow root, so each source is drawn again by the page's
    own mermaid, off the page, for its natural width (a gantt chart takes its column's
    width whatever its content: left out)."""
    sources = [
        html.unescape(m)
        for m in re.findall(r'<pre class="mermaid"><code>(.*?)</code></pre>', source, re.S)
    ]
    widths = page.evaluate(
        "[...document.querySelectorAll('div.mermaid')].map(d => d.getBoundingClientRect().width)"
    )
    found = []
    for i, (text, width) in enumerate(zip(sources, widths, strict=True)):
        if text.lstrip().startswith("gantt"):
            continue
        svg = page.evaluate(
            "async ([id, s]) => (await mermaid.render(id, s)).svg.slice(0, 2000)",
            [f"legibility-{i}", text],
        )
        natural = re.search(r"max-width:\s*([\d.]+)px", svg)
        assert natural is not None, svg[:200]
        scale = width / float(natural.group(1))
        if scale < LEGIBLE_SCALE:
            first = text.strip().split("\n")[0]
            found.append(f"diagram {i} ({first}...): drawn at {scale:.2f} of its size")
    return found
