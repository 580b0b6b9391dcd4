"""docs/configuration.md lists every constructor parameter of every public class."""

from __future__ import annotations

import importlib
import inspect
import re

from tests.api_names import ROOT, public_names

# Public classes that are not configured by their user: values the API hands out (their
# fields are in docs/api.md), and the Spark data sources, whose settings are `.option()`
# keys (docs/spark.md, checked by tests/unit/test_spark_options.py).
NOT_CONFIGURED = {
    "logsdk.Record": "a record handed to a handler",
    "logsdk.State": "an enum",
    "logsdk.metrics.MetricDoc": "a metric's description",
    "logsdk.testing.DeliveryReport": "a report check_delivery returns",
    "spark_sink.HandlerSink": "a Spark data source: options",
    "spark_sink.KafkaSource": "a Spark data source: options",
}

# "`Name(...`" starting a line opens that class's table; the table's first column names
# its settings ("`a`, `b`, `c`" for several).
OPENER = re.compile(r"^`(\w+)\(", re.M)


def documented() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    found: dict[str, set[str]] = {}
    for m in OPENER.finditer(text):
        rows: set[str] = set()
        lines = text[m.end() :].splitlines()[1:]
        started = False
        for line in lines:
            if line.startswith("|"):
                started = True
                rows.update(re.findall(r"`(\w+)`", line.split("|")[1]))
            elif started or OPENER.match(line):
                break
        found.setdefault(m.group(1), set()).update(rows)
    return found


def public_classes() -> tuple[dict[str, type], set[str]]:
    """The public classes that load here, and the public names that do not
    (``spark_sink``'s classes load pyspark when first read; the nox sessions do not
    install it), one import of each name."""
    classes: dict[str, type] = {}
    unloaded: set[str] = set()
    for name in public_names():
        module, short = name.rsplit(".", 1)
        try:
            obj = getattr(importlib.import_module(module), short)
        except ImportError:
            unloaded.add(name)
            continue
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            classes[name] = obj
    return classes, unloaded


def test_every_constructor_parameter_has_a_row() -> None:
    """Each public class's constructor parameters (but ``**producer_settings``, which are
    LogProducer's own rows) are rows of its table; a class that takes none needs none."""
    tables = documented()
    missing = []
    for name, cls in public_classes()[0].items():
        if name in NOT_CONFIGURED or getattr(cls, "_is_protocol", False):
            continue  # a Protocol is implemented by the user, not built
        params = [
            p.name
            for p in inspect.signature(cls).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        if not params:
            continue
        rows = tables.get(cls.__name__)
        if rows is None:
            missing.append(f"{name}: no table")
            continue
        missing += [f"{name}({p})" for p in params if p not in rows]
    assert missing == [], f"docs/configuration.md lacks {missing}"


def test_every_table_names_only_real_parameters() -> None:
    """A row for a parameter the class does not take (renamed, removed) fails too."""
    loaded, unloaded = public_classes()
    classes = {cls.__name__: cls for cls in loaded.values()}
    elsewhere = {n.rsplit(".", 1)[1] for n in unloaded}
    stale = []
    for short, rows in documented().items():
        cls = classes.get(short)
        if cls is None and short in elsewhere:
            continue  # its module needs what is not installed here (pyspark)
        assert cls is not None, f"docs/configuration.md has a table for {short}, not public"
        params = set(inspect.signature(cls).parameters)
        if short == "KafkaRenderer":  # takes KafkaProcessor's settings as **kw
            params |= set(inspect.signature(classes["KafkaProcessor"]).parameters)
        stale += [f"{short}({r})" for r in sorted(rows - params)]
    assert stale == [], f"docs/configuration.md documents parameters that do not exist: {stale}"


def test_the_exemptions_are_public_classes() -> None:
    loaded, unloaded = public_classes()
    assert set(NOT_CONFIGURED) <= set(loaded) | unloaded
