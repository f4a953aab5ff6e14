"""Start the reference registry (``docker-registry``, distribution 2.8) and read its access log.

The access log (Apache combined format, on the registry's stdout) is how tests prove what the
Docker daemon really fetched: e.g. that 20 concurrent check-and-pull calls caused one pull.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from services.stack.natsserver import free_port

INSTALL_HINT = "run: apt-get install -y docker-registry"

CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""

# 127.0.0.1 - - [29/Nov/2026:08:42:16 +0000] "GET /v2/small/manifests/1 HTTP/1.1" 200 739 "" "ua"
_LINE = re.compile(r'^\S+ \S+ \S+ \[[^\]]*\] "(\S+) (\S+) [^"]*" (\d{3}) ')


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query string
    status: int


def parse_access_log(text: str) -> list[Request]:
    requests = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            requests.append(Request(m[1], m[2].split("?", 1)[0], int(m[3])))
    return requests


class Registry:
    """One registry on 127.0.0.1:PORT (loopback registries are insecure-by-default in dockerd)."""

    def __init__(self, root: Path | None = None, port: int | None = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="hoist-registry-"))
        self.port = port or free_port()
        self.access_log = self.root / "access.log"
        self.error_log = self.root / "registry.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        """The registry part of an image reference: ``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def start(self, timeout: float = 20.0) -> Registry:
        binary = shutil.which("docker-registry")
        if binary is None:
            self.stop()
            raise RuntimeError(f"docker-registry not found on PATH; {INSTALL_HINT}")
        config = self.root / "config.yml"
        config.write_text(CONFIG.format(storage=self.root / "storage", port=self.port))
        with open(self.access_log, "ab") as out, open(self.error_log, "ab") as err:
            self.proc = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=err)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = self.error_log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"docker-registry did not start; log {self.error_log}:\n{log}")
            time.sleep(0.05)
        return self

    def _answers(self, query: str = "") -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v2/{query}", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def mark(self) -> int:
        """A position in the access log; pass it as ``since`` to see only later requests."""
        self.settle()
        return self.access_log.stat().st_size

    def settle(self, timeout: float = 5.0) -> None:
        """Wait until every request answered so far is in the log.

        The registry writes a line after answering, so a client may finish before its line
        lands. A sentinel request sent now is logged after the earlier ones.
        """
        token = uuid.uuid4().hex
        self._answers(f"?sentinel={token}")
        deadline = time.monotonic() + timeout
        while token.encode() not in self.access_log.read_bytes():
            if time.monotonic() > deadline:
                raise TimeoutError(f"registry access log {self.access_log} stopped growing")
            time.sleep(0.01)

    def requests(self, since: int = 0) -> list[Request]:
        """Requests logged after position ``since`` (see mark), sentinels left out."""
        self.settle()
        with open(self.access_log, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        return [r for r in parse_access_log(text) if r.path != "/v2/"]

    def count(self, method: str, path_pattern: str, since: int = 0) -> int:
        """How many ``method`` requests whose path matches the regex ``path_pattern`` (fully)."""
        pattern = re.compile(path_pattern)
        return sum(
            1 for r in self.requests(since) if r.method == method and pattern.fullmatch(r.path)
        )

    def counts(self, since: int = 0) -> Counter[tuple[str, str]]:
        """Requests per (method, path) since a mark: handy in assertion messages."""
        return Counter((r.method, r.path) for r in self.requests(since))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def manifest_path(repository: str) -> str:
    """Regex for manifest fetches of a repository (by tag or by digest)."""
    return rf"/v2/{re.escape(repository)}/manifests/[^/]+"


def blob_path(repository: str) -> str:
    return rf"/v2/{re.escape(repository)}/blobs/sha256:[0-9a-f]+"
