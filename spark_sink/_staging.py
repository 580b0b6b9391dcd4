"""Where ``logsdk-sink`` stages a batch's rows between the executors and the driver.

Each write task (an executor) writes its rows as one Arrow IPC stream file; the driver's
``commit`` reads the files its commit messages name. On one machine that is a local
directory; on a cluster it must be storage every executor and the driver reach: an
object store or HDFS, through `pyarrow.fs`.

``stagingDir`` is a local path or a URI: ``file:``, ``s3://bucket/prefix`` (also
``s3a://``), ``gs://bucket/prefix`` (also ``gcs://``), ``hdfs://host:port/path``.
Options of the filesystem are sink options ``staging.<name>`` with pyarrow's names
(``staging.endpoint_override``, ``staging.region``, ...). Credentials come from the
filesystem's usual chain (for S3: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
``~/.aws``, the instance's role) unless given as options; either way they are never
logged nor shown in a repr or an error.

A ``file`` URI names the path pyarrow's ``FileSystem.from_uri`` gives for it, in every
form (``file:/p``, ``file:///p``, escapes such as ``%20``; a query or fragment is not part of
the path), and ``file://localhost/p`` names ``/p`` as ``file:///p`` does (RFC 8089; pyarrow
refuses every host); a form pyarrow refuses (relative, another host, a user, a bad escape)
fails `Staging.parse()`. So the driver and every executor resolve the same absolute
path, whatever their working directory.

A file is whole when a reader sees it: on a local filesystem it is written as ``.tmp``
and renamed; an object store makes an object visible only when its upload completes.
"""

from __future__ import annotations

import contextlib
import re
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from logsdk.errors import SparkSourceError

#: Per scheme: the filesystem options a sink accepts, and how each is read from text
#: (str unless named here).
_S3_OPTIONS: dict[str, type] = {
    "access_key": str,
    "secret_key": str,
    "session_token": str,
    "anonymous": bool,
    "role_arn": str,
    "session_name": str,
    "external_id": str,
    "load_frequency": int,
    "region": str,
    "request_timeout": float,
    "connect_timeout": float,
    "scheme": str,
    "endpoint_override": str,
    "background_writes": bool,
    "allow_bucket_creation": bool,
    "allow_bucket_deletion": bool,
    "check_directory_existence_before_creation": bool,
    "force_virtual_addressing": bool,
    "tls_ca_file_path": str,
}
_GCS_OPTIONS: dict[str, type] = {
    "anonymous": bool,
    "access_token": str,
    "target_service_account": str,
    "default_bucket_location": str,
    "scheme": str,
    "endpoint_override": str,
    "project_id": str,
}
_HDFS_OPTIONS: dict[str, type] = {
    "user": str,
    "replication": int,
    "buffer_size": int,
    "default_block_size": int,
    "kerb_ticket": str,
}
_SCHEMES: dict[str, dict[str, type]] = {
    "s3": _S3_OPTIONS,
    "s3a": _S3_OPTIONS,
    "gs": _GCS_OPTIONS,
    "gcs": _GCS_OPTIONS,
    "hdfs": _HDFS_OPTIONS,
    "file": {},
}
#: Option names whose values are never shown.
_SECRET = re.compile(r"secret|token|password|key|credential", re.IGNORECASE)
#: Sink options that configure the staging filesystem start with this.
PREFIX = "staging."


def _convert(name: str, kind: type, text: str) -> Any:
    if kind is bool:
        low = text.strip().lower()
        if low not in ("true", "false"):
            raise SparkSourceError(f"option {PREFIX}{name} must be true or false")
        return low == "true"
    if kind in (int, float):
        try:
            return kind(text.strip())
        except ValueError:
            raise SparkSourceError(f"option {PREFIX}{name} must be a number") from None
    return text


@dataclass(frozen=True)
class Staging:
    """A staging root (a URI or a local path) and its filesystem's options.

    Picklable and cheap to copy: the filesystem itself is made where it is used (on
    each executor and on the driver), from the options and that process's environment.
    """

    uri: str
    #: (name, text) pairs of ``staging.*`` options, names without the prefix.
    options: tuple[tuple[str, str], ...] = ()
    _fs: list[Any] = field(default_factory=list, repr=False, compare=False)

    @staticmethod
    def parse(where: str, options: Mapping[str, str]) -> Staging:
        """Check ``where`` and the ``staging.*`` options; raise SparkSourceError naming a bad one.

        ``options`` are the sink's options, lower-cased; other keys are ignored.
        """
        scheme = urllib.parse.urlsplit(where).scheme.lower()
        if len(scheme) <= 1:  # no scheme, or a Windows drive letter
            uri, scheme = str(Path(where).absolute()), "file"
        elif scheme == "file":
            _file_path(where)  # one that pyarrow refuses fails here, on the driver
            uri = where
        elif scheme not in _SCHEMES:
            raise SparkSourceError(
                f"stagingDir {_shown(where)!r}: scheme {scheme!r} is not supported; use a "
                "local path or a file://, s3://, s3a://, gs://, gcs:// or hdfs:// URI"
            )
        else:
            uri = where
        known = _SCHEMES[scheme]
        given = sorted((k[len(PREFIX) :], v) for k, v in options.items() if k.startswith(PREFIX))
        for name, text in given:
            if name not in known:
                accepted = ", ".join(PREFIX + k for k in sorted(known)) or "none"
                raise SparkSourceError(
                    f"unknown option {PREFIX}{name} for a {scheme}:// stagingDir; "
                    f"accepted: {accepted}"
                )
            _convert(name, known[name], text)
        if given and urllib.parse.urlsplit(uri).query:
            raise SparkSourceError(
                f"stagingDir {_shown(uri)!r}: give the filesystem's options either in the "
                f"URI's query string or as {PREFIX}* options, not both"
            )
        return Staging(uri, tuple(given))

    @property
    def scheme(self) -> str:
        # A local path is stored absolute: it starts with "/", so it has no scheme.
        return urllib.parse.urlsplit(self.uri).scheme.lower() or "file"

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{PREFIX}{k}={'***' if _SECRET.search(k) else v!r}" for k, v in self.options
        )
        return f"Staging({_shown(self.uri)!r}{', ' + shown if shown else ''})"

    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.uri, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "uri", state["uri"])
        object.__setattr__(self, "options", state["options"])
        object.__setattr__(self, "_fs", [])

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """The filesystem and the root's path on it (made once per process)."""
        if not self._fs:
            self._fs.append(self._open())
        fs, root = self._fs[0]
        return fs, root

    def _open(self) -> tuple[pafs.FileSystem, str]:
        scheme = self.scheme
        known = _SCHEMES[scheme]
        kwargs = {name: _convert(name, known[name], text) for name, text in self.options}
        parts = urllib.parse.urlsplit(self.uri)
        if scheme == "file":  # a URI, or a local path made absolute by parse()
            return pafs.LocalFileSystem(), _file_path(self.uri) if parts.scheme else self.uri
        try:
            if not kwargs:
                fs, root = pafs.FileSystem.from_uri(self.uri)
                return fs, root.rstrip("/")
            root = (parts.netloc + urllib.parse.unquote(parts.path)).rstrip("/")
            if scheme in ("s3", "s3a"):
                return pafs.S3FileSystem(**kwargs), root
            if scheme in ("gs", "gcs"):
                return pafs.GcsFileSystem(**kwargs), root
            host = f"hdfs://{parts.hostname}" if parts.hostname else "default"
            hdfs = pafs.HadoopFileSystem(host, parts.port or 8020, **kwargs)
            return hdfs, urllib.parse.unquote(parts.path).rstrip("/")
        except (OSError, ValueError, TypeError, pa.ArrowException) as exc:
            raise SparkSourceError(
                f"stagingDir {_shown(self.uri)!r}: cannot open its filesystem: {exc}"
            ) from exc

    def check(self) -> None:
        """Create the root and write, read and remove a probe file (a bad root fails here)."""
        fs, root = self.filesystem()
        probe = f"{root}/.probe-{uuid.uuid4().hex}"
        try:
            fs.create_dir(root, recursive=True)
            with fs.open_output_stream(probe) as out:
                out.write(b"logsdk")
            with fs.open_input_stream(probe) as f:
                if f.read() != b"logsdk":
                    raise OSError("the probe file read back differently")
            fs.delete_file(probe)
        except (OSError, pa.ArrowException) as exc:
            raise SparkSourceError(
                f"stagingDir {_shown(self.uri)!r} is not writable here: {exc}"
            ) from exc

    def batch_dir(self, sink_id: str, batch_id: int) -> str:
        """The folder of one batch's files."""
        return f"{self.filesystem()[1]}/{sink_id}/batch-{batch_id}"

    def write(self, folder: str, name: str, batches: Iterator[pa.RecordBatch]) -> tuple[str, int]:
        """Write ``batches`` as one Arrow stream file; (its path, rows); ("", 0) when empty.

        Nothing is left behind for an empty iterator. A local file appears whole (written
        as ``.tmp``, then renamed); an object appears when its upload completes.
        """
        fs, _ = self.filesystem()
        local = isinstance(fs, pafs.LocalFileSystem)
        first = next(batches, None)
        if first is None:
            return "", 0
        fs.create_dir(folder, recursive=True)
        final = f"{folder}/{name}"
        target = final + ".tmp" if local else final
        rows = 0
        with fs.open_output_stream(target) as out, pa.ipc.new_stream(out, first.schema) as writer:
            writer.write_batch(first)
            rows += first.num_rows
            for batch in batches:
                writer.write_batch(batch)
                rows += batch.num_rows
        if local:
            fs.move(target, final)
        return final, rows

    def read(self, path: str) -> pa.Table:
        """One staged file's rows."""
        fs, _ = self.filesystem()
        with fs.open_input_stream(path) as f:
            return pa.ipc.open_stream(f).read_all()

    def drop(self, folder: str) -> None:
        """Remove one batch's folder (gone already: nothing to do)."""
        fs, _ = self.filesystem()
        with contextlib.suppress(FileNotFoundError):
            fs.delete_dir(folder)

    def drop_through(self, sink_id: str, batch_id: int) -> None:
        """Remove every ``batch-N`` folder of ``sink_id`` with N <= ``batch_id``."""
        fs, root = self.filesystem()
        selector = pafs.FileSelector(f"{root}/{sink_id}", allow_not_found=True)
        for info in fs.get_file_info(selector):
            tail = info.base_name[len("batch-") :]
            if info.base_name.startswith("batch-") and tail.isdigit() and int(tail) <= batch_id:
                self.drop(info.path)

    def listing(self) -> list[str]:
        """Every file under the root, relative to it, sorted (for tests and operators)."""
        fs, root = self.filesystem()
        selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
        infos = fs.get_file_info(selector)
        return sorted(i.path[len(root) + 1 :] for i in infos if i.type == pafs.FileType.File)


#: ``file://localhost`` followed by the path (or nothing): the host RFC 8089 reads as none.
_LOCALHOST = re.compile(r"\Afile://localhost(?=[/?#]|\Z)", re.IGNORECASE)


def _file_path(uri: str) -> str:
    """The absolute local path the ``file`` URI ``uri`` names, as pyarrow resolves it
    (``localhost`` read as no host). Raises SparkSourceError for a form pyarrow refuses."""
    canonical = _LOCALHOST.sub("file://", uri, count=1)
    canonical = "file" + canonical[len("file") :]  # pyarrow knows the scheme in lower case
    try:
        fs, path = pafs.FileSystem.from_uri(canonical)
    except (ValueError, pa.ArrowException) as exc:  # UnicodeDecodeError: a ValueError
        why = str(exc).replace(canonical, _shown(uri))  # pyarrow's text quotes the URI
        raise SparkSourceError(
            f"stagingDir {_shown(uri)!r} is not a file URI pyarrow can open ({why}); write "
            "file:///absolute/path (file:/absolute/path, file://localhost/absolute/path) "
            "or a plain local path"
        ) from None  # not chained: pyarrow's own text would show a password
    # Every process must resolve the same place: never a path relative to its directory.
    if not isinstance(fs, pafs.LocalFileSystem) or not Path(path).is_absolute():
        raise SparkSourceError(
            f"stagingDir {_shown(uri)!r}: pyarrow reads it as {path!r} on {fs.type_name}, "
            "not an absolute local path; write file:///absolute/path"
        )
    return str(path)


def _shown(uri: str) -> str:
    """``uri`` without a password or query string (they may hold credentials)."""
    parts = urllib.parse.urlsplit(uri)
    if "://" not in uri:
        return uri
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    if parts.username:
        host = f"{parts.username}@{host}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))
