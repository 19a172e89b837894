"""A running command (jobq-ctl logs -f, push --wait ...) whose stdout and stderr lines are
collected by two reader threads, each line with the wall-clock time it arrived (comparable
with an epoch a task printed)."""

from __future__ import annotations

import subprocess
import threading
import time
from typing import IO

from tests.conftest import wait_for


class Captured:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.out: list[tuple[float, bytes]] = []  # (time.time() it arrived, the line)
        self.err: list[str] = []
        self.err_at: list[float] = []  # time.time() each stderr line arrived
        self._threads = [threading.Thread(target=self._read, args=(s, i == 0), daemon=True)
                         for i, s in enumerate((proc.stdout, proc.stderr))]
        for t in self._threads:
            t.start()

    @classmethod
    def start(cls, args: list[str], **popen: object) -> Captured:
        return cls(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    **popen))  # type: ignore[call-overload]

    def _read(self, stream: IO[bytes], is_out: bool) -> None:
        for line in iter(stream.readline, b""):
            if is_out:
                self.out.append((time.time(), line))
            else:
                self.err_at.append(time.time())
                self.err.append(line.decode(errors="replace").rstrip("\n"))

    def stdout(self) -> bytes:
        return b"".join(line for _, line in self.out)

    def text(self) -> str:
        return self.stdout().decode(errors="replace")

    def wait_err(self, text: str, timeout: float = 30.0) -> None:
        wait_for(lambda: any(text in line for line in self.err), timeout,
                 what=f"{text!r} on stderr (got {self.err})")

    def wait(self, timeout: float = 60.0) -> int:
        code = self.proc.wait(timeout)
        for t in self._threads:
            t.join(10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait()
