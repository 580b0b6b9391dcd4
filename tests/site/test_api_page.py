"""The API reference as built: every public name rendered, every class with its
constructor's signature, no Sphinx role shown raw on any page (no browser needed)."""

from __future__ import annotations

import html
import importlib
import re
import zlib
from pathlib import Path

from tests.api_names import origins, public_names

ROLE = re.compile(r":(?:meth|class|func|attr|exc|mod|data|obj|const|ref):`?[\w~.]")


def inventory(out: Path) -> dict[str, tuple[str, int]]:
    """objects.inv of the built site: identifier -> (kind, priority; 1 = rendered there)."""
    raw = (out / "objects.inv").read_bytes()
    body = zlib.decompress(raw.partition(b"zlib.\n")[2]).decode()
    found = {}
    for line in body.splitlines():
        name, kind, priority, _ = line.split(" ", 3)
        found[name] = (kind, int(priority))
    return found


def text_of(page: Path) -> str:
    source = page.read_text(encoding="utf-8")
    article = source[source.find("<article") : source.find("</article>")]
    article = re.sub(r"<(script|style)\b.*?</\1>", "", article, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", article))


def test_every_public_name_is_in_the_reference(site: tuple[str, Path]) -> None:
    """Each name of logsdk.__all__, the integrations, sinks, metrics, testing and
    spark_sink is an entry of the built API reference (its own, or the one of the
    module that defines it)."""
    inv = inventory(site[1])
    missing = []
    for name in public_names():
        module, short = name.rsplit(".", 1)
        home = origins(module).get(short)
        if name not in inv and not (home and f"{home}.{short}" in inv):
            missing.append(name)
    assert missing == [], f"not in the API reference: {missing}"


def test_every_class_shows_its_constructor_signature(site: tuple[str, Path]) -> None:
    """Every class rendered on the API page that has a constructor of its own (an
    ``__init__`` written in logsdk or spark_sink, a dataclass's included) is followed by
    its signature (``LogProducer(bootstrap_servers: str, ...)``) before its docstring."""
    out = site[1]
    source = (out / "api" / "index.html").read_text(encoding="utf-8")
    rendered = [n for n, (kind, prio) in inventory(out).items() if kind == "py:class" and prio == 1]
    classes = [n for n in rendered if has_own_constructor(n)]
    assert len(classes) >= 15, classes
    unsigned = []
    for name in classes:
        start = source.find(f'id="{name}"')
        assert start >= 0, name
        nxt = source.find('<div class="doc doc-object', start)
        chunk = source[start : nxt if nxt > 0 else len(source)]
        short = name.rsplit(".", 1)[-1]
        signature = re.search(r'<div class="doc-signature[^"]*">.*?</div>', chunk, re.S)
        if signature is None or not text_of_html(signature.group(0)).startswith(short + "("):
            unsigned.append(name)
    assert unsigned == [], f"no constructor signature shown: {unsigned}"


def has_own_constructor(name: str) -> bool:
    module, short = name.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), short)
    init = getattr(cls, "__init__", None)
    return getattr(init, "__module__", "").startswith(("logsdk", "spark_sink"))


def text_of_html(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


def test_no_page_shows_a_sphinx_role(site: tuple[str, Path]) -> None:
    """No built page's text carries a raw role (``:meth:`close```) outside code blocks."""
    out = site[1]
    found = []
    for page in sorted(out.rglob("index.html")):
        source = page.read_text(encoding="utf-8")
        source = re.sub(r"<(pre|code)\b.*?</\1>", "", source, flags=re.S)
        text = html.unescape(re.sub(r"<[^>]+>", "", source))
        found += [f"{page.relative_to(out)}: {m.group(0)}" for m in ROLE.finditer(text)]
    assert found == [], "\n".join(found)


#: What an adopter with ten minutes asks (issue 48), and words the answer cannot do
#: without, on the site's first two pages (home and getting started).
QUESTIONS = {
    "install": ["pip install logsdk"],
    "dictConfig": ["dictConfig", "logsdk.integrations.logging.KafkaHandler"],
    "Kafka down": ["Kafka down", "spool"],
    "gunicorn": ["gunicorn"],
    "cost per call against the alternatives": ["SysLogHandler", "µs"],
    "reading records back": ["LogConsumer", "logsdk tail"],
}


def test_the_first_two_pages_answer_an_adopters_questions(site: tuple[str, Path]) -> None:
    """Home and getting started, as built: install, dictConfig, Kafka down, gunicorn, the
    cost of a log call beside the alternatives, reading records back."""
    out = site[1]
    text = text_of(out / "index.html") + text_of(out / "getting-started" / "index.html")
    missing = [
        f"{question}: {word!r}"
        for question, words in QUESTIONS.items()
        for word in words
        if word not in text
    ]
    assert missing == [], "\n".join(missing)
