"""Task output: one pump thread reads every task's pipe, logs it line by line, keeps a tail,
and hands the raw bytes to the output-store thread (fleet/shipper.py, never a store call
here: a slow store must not stop the pipe being read).

One thread with epoll instead of a reader thread per task: starting a thread per task cost the
main thread more than the spawn itself at high task rates.  Lines are logged with the task id;
the last ~20 KiB are kept for the failure reason; an optional per-task log file gets the raw
bytes.  A task printing faster than the log writer takes its lines gets the excess dropped
with a counted marker (``logs.OutputSink``), after its log file and tail have them: its pipe
is read at full speed, so the task never waits on the supervisor's stderr.  When a pipe
reaches EOF (every holder of its write end is gone) ``on_eof`` runs on the pump thread.  The
pump never blocks on a pipe: leftovers of a task that still hold it simply keep it open until
they are killed, and the main loop does not wait for that (see worker/loop.py).
"""

from __future__ import annotations

import collections
import logging
import os
import selectors
import threading
from typing import IO, TYPE_CHECKING, Callable

from ..core.threads import Flag, start_thread
from .logs import OutputAccount, output_sink
from .task_logs import TaskLogDir

if TYPE_CHECKING:
    from ..core.settings import Settings
    from ..fleet.output.base import AttemptKey
    from ..fleet.shipper import OutputShipper

OUTPUT_TAIL_BYTES = 20 * 1024
MAX_LINE = 64 * 1024  # a line longer than this is logged in pieces


class TaskOutput:
    """One task's output state.  Written by the pump thread; ``text()`` from any thread."""

    def __init__(self, task_id: str, pipe: IO[bytes], on_eof: Callable[[], None],
                 logger: logging.Logger, log_file: str | None = None,
                 key: AttemptKey | None = None,
                 log_file_done: Callable[[str], None] | None = None) -> None:
        self.task_id = task_id
        self.key = key  # the attempt in the output store
        self.shipper: OutputShipper | None = None  # set by OutputPump.add
        self.log_lines = True  # False with --task-output off: only the tail is kept
        self.pipe = pipe
        self.on_eof = on_eof
        self.log = logger
        self.log_file = log_file
        self.log_file_done = log_file_done  # the file is closed: the purge may take it
        self.closed = Flag()
        self.account = OutputAccount(logger.name, task_id)
        self._tail = bytearray()
        self._partial = b""
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None

    # -- pump thread ---------------------------------------------------------------------
    def open_file(self) -> None:
        if not self.log_file:
            return
        try:
            self._file = open(self.log_file, "ab")
        except OSError as exc:
            self.log.warning("cannot open task log %s: %s", self.log_file, exc,
                             extra={"task_id": self.task_id})

    def feed(self, data: bytes) -> None:
        if self.shipper is not None and self.key is not None:
            self.shipper.feed(self.key, data)  # a list append under a lock: never the store
        if self._file is not None:
            try:
                self._file.write(data)
                self._file.flush()
            except OSError as exc:
                self.log.warning("task log %s: %s; no longer writing it", self.log_file, exc,
                                 extra={"task_id": self.task_id})
                self._close_file()
        with self._lock:
            self._tail += data
            if len(self._tail) > 2 * OUTPUT_TAIL_BYTES:  # trimmed now and then, not per read
                del self._tail[:-OUTPUT_TAIL_BYTES]
        if not self.log_lines:
            return
        buf = self._partial + data
        sink = output_sink(self.log)
        if sink is not None and not sink.taking(self.account):
            # Dropped anyway: count the lines instead of making them (a flood is mostly this).
            end = buf.rfind(b"\n") + 1
            pieces = max(0, (len(buf) - end - 1) // MAX_LINE)  # as the loop below cuts them
            self._partial = buf[end + pieces * MAX_LINE:]
            sink.drop(self.account, buf.count(b"\n", 0, end) + pieces)
            return
        *lines, self._partial = buf.split(b"\n")
        while len(self._partial) > MAX_LINE:
            lines.append(self._partial[:MAX_LINE])
            self._partial = self._partial[MAX_LINE:]
        self._emit(lines)

    def finish(self) -> None:
        if self._partial:
            self._emit([self._partial])
            self._partial = b""
        sink = output_sink(self.log)
        if sink is not None:
            sink.marker(self.account)  # before on_eof: the count precedes "finished"
        self._close_file()
        if self.log_file and self.log_file_done is not None:
            self.log_file_done(self.log_file)
        if self.shipper is not None and self.key is not None:
            self.shipper.end(self.key)
        try:
            self.pipe.close()
        except OSError:
            pass
        self.closed.set()
        self.on_eof()

    def _close_file(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def _emit(self, lines: list[bytes]) -> None:
        if not lines or not self.log.isEnabledFor(logging.INFO):
            return
        sink = output_sink(self.log)
        if sink is not None:
            sink.offer(self.account, lines)
            return
        for raw in lines:
            self.log.info("%s", raw.decode("utf-8", "replace"),
                          extra={"task_id": self.task_id, "stream": "output"})

    # -- any thread ----------------------------------------------------------------------
    def text(self) -> str:
        with self._lock:
            tail = bytes(self._tail[-OUTPUT_TAIL_BYTES:])
        text = tail.decode("utf-8", "replace")
        return text[:-1] if text.endswith("\n") else text


class OutputPump:
    """The pump thread and its registry.  ``add`` is called by the spawner threads (by the
    main thread if that failed), ``flush`` by the main thread."""

    def __init__(self, shipper: OutputShipper | None = None, mode: str = "local",
                 task_logs: TaskLogDir | None = None) -> None:
        self.shipper = shipper
        self.task_logs = task_logs  # --task-log-dir: file names, and their purge thread
        self.mode = mode  # --task-output as resolved: store, local or off
        self._selector = selectors.DefaultSelector()
        self._new: collections.deque[TaskOutput] = collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_worker(cls, settings: Settings) -> OutputPump:
        """The pump, with the output-store thread unless output is not stored, and with
        ``--task-log-dir`` its purge thread (main thread)."""
        from ..fleet.shipper import OutputShipper

        shipper = OutputShipper.for_worker(settings)
        mode = "store" if shipper is not None else (
            "off" if settings.task_output == "off" else "local")
        task_logs = (TaskLogDir(settings.task_log_dir, settings.task_output_retention)
                     if settings.task_log_dir else None)
        return cls(shipper, mode, task_logs)

    def describe(self) -> str:
        """``--task-output`` as resolved, and where the store is, for the start-up line."""
        return f"store ({self.shipper.where})" if self.shipper is not None else self.mode

    def start(self) -> None:
        if self.shipper is not None:
            self.shipper.start()  # opens the store on its own thread: no task waits for it
        if self.task_logs is not None:
            self.task_logs.start()
        self._thread = start_thread(self._run, "output-pump", bulk=True)

    def add(self, output: TaskOutput) -> None:
        """Start pumping a task's pipe (a spawner thread, or the main thread).

        Without a log file the pipe goes straight into the pump's epoll set: epoll_ctl is safe
        while the pump waits in epoll_wait, the selector's map entry is written before the fd
        is armed, and so the pump need not be woken for every task.  A log file is opened on
        the pump thread (a slow disk must not stall the main loop): ``flush`` hands those
        pipes over, once per main-loop turn."""
        output.shipper, output.log_lines = self.shipper, self.mode != "off"
        if output.log_file:
            self._new.append(output)
            return
        fd = output.pipe.fileno()
        os.set_blocking(fd, False)
        self._selector.register(fd, selectors.EVENT_READ, output)

    def flush(self) -> None:
        """Wake the pump once per main-loop turn, not once per task (main thread)."""
        if self._new:
            self._poke()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._poke()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.shipper is not None:  # after the pump: its last reads and ends are in
            self.shipper.stop()
        if self.task_logs is not None:
            self.task_logs.stop()

    def _poke(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # already awake

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _events in self._selector.select():
                    output = key.data
                    if output is None:
                        self._drain_wake()
                        continue
                    self._read(output)
                while self._new:
                    output = self._new.popleft()
                    output.open_file()
                    os.set_blocking(output.pipe.fileno(), False)
                    self._selector.register(output.pipe.fileno(), selectors.EVENT_READ, output)
        finally:
            for key in list(self._selector.get_map().values()):
                if key.data is not None:
                    self._selector.unregister(key.fd)
                    key.data.finish()
            self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _read(self, output: TaskOutput) -> None:
        fd = output.pipe.fileno()
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError as exc:
            output.log.debug("output read failed: %s", exc, extra={"task_id": output.task_id})
            data = b""
        if data:
            output.feed(data)
            return
        self._selector.unregister(fd)
        output.finish()
