"""logsdk-sink's staging area through pyarrow.fs: a local path, and a real S3 API server."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from logsdk.errors import SparkSourceError
from spark_sink._sink import SinkOptions
from spark_sink._staging import Staging
from tests.spark.conftest import S3Server

pytestmark = [pytest.mark.spark]

SECRET = "do-not-show-me-0451"


def batches(n: int, size: int = 100) -> Iterator[pa.RecordBatch]:
    for b in range(n):
        yield pa.record_batch({"i": list(range(b * size, (b + 1) * size))})


def exercise(staging: Staging) -> None:
    """Write two batches' files and an empty task, read them back, drop through batch 0."""
    staging.check()
    first = staging.batch_dir("sink", 0)
    path, rows = staging.write(first, "part-0-0-a.arrow", batches(3))
    assert rows == 300
    assert staging.read(path).column("i").to_pylist() == list(range(300))
    assert staging.write(first, "part-1-0-b.arrow", batches(0)) == ("", 0)
    later, _ = staging.write(staging.batch_dir("sink", 1), "part-0-0-c.arrow", batches(1))
    assert staging.listing() == ["sink/batch-0/part-0-0-a.arrow", "sink/batch-1/part-0-0-c.arrow"]
    staging.drop_through("sink", 0)
    assert staging.listing() == ["sink/batch-1/part-0-0-c.arrow"]
    staging.drop(staging.batch_dir("sink", 1))
    staging.drop(staging.batch_dir("sink", 7))  # never written: nothing to do
    staging.drop_through("other", 5)
    assert staging.listing() == []
    assert later.endswith("sink/batch-1/part-0-0-c.arrow")


def test_a_local_path_and_a_file_uri_stage_whole_files(tmp_path: Path) -> None:
    exercise(Staging.parse(str(tmp_path / "a dir #1"), {}))
    exercise(Staging.parse((tmp_path / "b").as_uri(), {}))
    assert not list(tmp_path.rglob("*.tmp"))


def test_staging_on_an_s3_server(s3_server: S3Server) -> None:
    """Written, read, dropped on a real S3 API; credentials from the environment chain."""
    staging = Staging.parse(s3_server.uri("unit"), s3_server.options)
    exercise(staging)
    copy = pickle.loads(pickle.dumps(staging))  # as an executor gets it: no open filesystem
    assert copy == staging
    exercise(copy)


def test_a_bad_staging_dir_fails_at_start_and_shows_no_secret(s3_server: S3Server) -> None:
    options = {
        **s3_server.options,
        "staging.secret_key": SECRET,
        "staging.access_key": "someone",
        "sqlite.path": "unused.db",
    }
    bad = Staging.parse("s3://no-such-bucket/x", options)
    assert SECRET not in repr(bad)
    assert "staging.secret_key='***'" in repr(bad)
    with pytest.raises(SparkSourceError, match="not writable") as err:
        bad.check()
    assert SECRET not in str(err.value)
    with pytest.raises(SparkSourceError, match="not writable"):
        SinkOptions.parse({**options, "stagingDir": "s3://no-such-bucket/x"})


@pytest.mark.parametrize(
    ("where", "options", "message"),
    [
        ("ftp://host/x", {}, "scheme 'ftp' is not supported"),
        ("s3://b/x", {"staging.endpoint": "http://h"}, "unknown option staging.endpoint"),
        ("/tmp/x", {"staging.region": "eu"}, "accepted: none"),
        ("s3://b/x", {"staging.anonymous": "yes"}, "must be true or false"),
        ("s3://b/x", {"staging.connect_timeout": "soon"}, "must be a number"),
        ("s3://b/x?region=eu", {"staging.scheme": "http"}, "not both"),
    ],
)
def test_bad_staging_options_are_named(where: str, options: dict[str, str], message: str) -> None:
    with pytest.raises(SparkSourceError, match=message):
        Staging.parse(where, options)


def test_a_uri_password_and_query_are_not_shown() -> None:
    staging = Staging.parse(f"hdfs://me:{SECRET}@namenode:8020/staging?x={SECRET}", {})
    assert SECRET not in repr(staging)
    assert "hdfs://me@namenode:8020/staging" in repr(staging)


#: Every way of writing ``file`` URIs for one directory ``{d}`` (an absolute path, with
#: a space and an "A" in its last name: "a b A"), each with the form pyarrow resolves it
#: from. pyarrow refuses a host, even ``localhost``; RFC 8089 makes ``file://localhost/p``
#: the same file as ``file:///p``, and so does the sink.
FILE_FORMS = [
    ("file:{d}/a%20b%20%41", "file:{d}/a%20b%20%41"),
    ("file://{d}/a%20b%20%41", "file://{d}/a%20b%20%41"),
    ("file://localhost{d}/a%20b%20%41", "file://{d}/a%20b%20%41"),
    ("FILE://LocalHost{d}/a%20b%20%41", "file://{d}/a%20b%20%41"),
    ("file:{d}/a%20b%20A#part", "file:{d}/a%20b%20A#part"),
    ("file:{d}/a%20b%20A?x=1", "file:{d}/a%20b%20A?x=1"),
    ("file://{d}/a%20b%20A/", "file://{d}/a%20b%20A/"),
]


@pytest.mark.parametrize(
    ("form", "as_pyarrow"),
    FILE_FORMS,
    ids=[f.split("{d}")[0] + "..." + f.split("{d}")[1] for f, _ in FILE_FORMS],
)
def test_a_file_uri_stages_where_pyarrow_resolves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str, as_pyarrow: str
) -> None:
    """Every form of a ``file`` URI stages in the directory pyarrow's own ``from_uri`` gives
    (an executor writes, and the driver reads, the same place whatever their working
    directory), never under the working directory."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    d = str(tmp_path)
    uri = form.format(d=d)
    _, expected = pafs.FileSystem.from_uri(as_pyarrow.format(d=d))
    assert expected == f"{d}/a b A"
    staging = Staging.parse(uri, {})
    assert staging.filesystem()[1] == expected
    copy = pickle.loads(pickle.dumps(staging))  # as an executor gets it
    assert copy.filesystem()[1] == expected
    exercise(staging)
    staging.write(staging.batch_dir("sink", 3), "part-0-0-a.arrow", batches(1))
    assert (tmp_path / "a b A/sink/batch-3/part-0-0-a.arrow").is_file()
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize(
    "form",
    [
        "file:relative/dir",
        "file:",
        "file://otherhost/tmp/x",
        "file://user@localhost/tmp/x",
        "file:/tmp/a%zz",
        "file:/tmp/%FF",
        f"file://me:{SECRET}@localhost/tmp/x",
    ],
)
def test_a_file_uri_pyarrow_refuses_fails_at_parse_with_what_to_write(form: str) -> None:
    with pytest.raises(pa.ArrowInvalid if "%FF" not in form else UnicodeDecodeError):
        pafs.FileSystem.from_uri(form)
    with pytest.raises(SparkSourceError, match=r"write file:///absolute/path") as err:
        Staging.parse(form, {})
    assert SECRET not in str(err.value)
