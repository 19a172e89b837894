"""The dashboard's screenshots in the docs (docs/_static/screenshots/), taken in a real headless
Chromium: ``scripts/screenshots [--out DIR]``.

On a throw-away SQLite queue in a temporary folder (loopback only), two real workers
(``jobq-supervisor -n 2``) run sample tasks that give every page something to show: two that
succeeded, one that failed, one cancelled from the dashboard, four running with output, three
pending behind them and one delayed.  A ``jobq-ctl dashboard`` with a token file serves them;
Chromium logs in (the action buttons show), cancels one task and pauses and resumes the queue
with the buttons (the Actions page lists them), then shoots each page of ``PAGES`` at 1280x800
and the overview at 390x844 once each page shows what it should (waits for conditions, no
sleeps).  Every process it started is ended however it ends (and checked with psutil); a
failure is one line on stderr and exit status 1.  The main thread does everything.
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import psutil
from benchlib import BIN, REPO, BenchError, dashboard, supervisor, wait_until

sys.path.insert(0, str(REPO))
from tests.browser import login, set_viewport, start_chromium, why_no_browser  # noqa: E402

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

OUT = REPO / "docs" / "_static" / "screenshots"
DESKTOP, PHONE = (1280, 800), (390, 844)
TOKEN = "screenshots-token-0123456789abcdef"
OPERATOR = "alice"
WORKERS = ("vm-01", "vm-02")
SLOTS = 2  # per worker: 4 running tasks fill both, the pending ones wait
WAIT = 60.0  # seconds for any condition: generous, for a busy machine


class Page(NamedTuple):
    """One screenshot: the dashboard route it shows (a Flask rule), the file, and how wide."""

    rule: str
    name: str
    size: tuple[int, int] = DESKTOP


PAGES = (
    Page("/", "overview"),
    Page("/", "overview-phone", PHONE),
    Page("/workers", "workers"),
    Page("/workers/<worker_id>", "worker"),
    Page("/tasks/<task_id>", "task"),
    Page("/tasks", "tasks"),
    Page("/failed", "failed"),
    Page("/actions", "actions"),
)
# The dashboard's other pages (GET, not under /api/), not shot: why.
NOT_SHOWN = {
    "/login": "a name and a token field",
    "/search": "redirects to a task's page",
    "/failed/clear": "a confirmation page",
    "/static/<path:filename>": "not a page",
    "/metrics": "Prometheus text for a scraper, not a page",
}

# The sample tasks: shell scripts in the tasks' working folder.  Each prints a few lines and
# the long ones then wait (sleep) until their worker is stopped, so every page shows the same
# thing whenever it is shot.
SCRIPTS = {
    "report.sh": """echo "building the $1 report"
echo "read 1,284 rows from warehouse.orders"
echo "wrote reports/$1.html (212 KiB)"
""",
    "etl.sh": """echo "loading data/$1.csv"
[ -e "data/$1.csv" ] || { echo "error: data/$1.csv: no such file" >&2; exit 3; }
for part in 1 2 3 4; do echo "part $part/8: 25,000 rows"; done
sleep 3600
""",
    "train.sh": """echo "training $1: 3 epochs, batch 256"
echo "epoch 1/3  loss 0.912  acc 0.701"
echo "epoch 2/3  loss 0.544  acc 0.826"
echo "epoch 3/3  step 120/400"
sleep 3600
""",
    "render.sh": """echo "rendering $1: 240 frames at 1920x1080"
for f in 1 2 3 4 5 6; do echo "frame $f/240 done in 2.4 s"; done
sleep 3600
""",
}


class Queue:
    """The throw-away queue: its SQLite file, the tasks' folder, and jobq-ctl on it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.db = tmp / "jobq.db"
        self.work = tmp / "jobs"
        (self.work / "data").mkdir(parents=True)
        (self.work / "data" / "2026-11-26.csv").write_text("id,amount\n")
        for name, text in SCRIPTS.items():
            script = self.work / name
            script.write_text("#!/bin/sh\n" + text)
            script.chmod(0o755)

    def base(self) -> list[str]:
        return ["--sqlite-path", str(self.db)]

    def push(self, *cmds: str, extra: tuple[str, ...] = ()) -> list[str]:
        """Push ``cmds`` (run in the tasks' folder); their ids."""
        args = [str(BIN / "jobq-ctl"), *self.base(), "push", "--cwd", str(self.work), *extra]
        for cmd in cmds:
            args += ["-c", cmd]
        res = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=self.tmp)
        if res.returncode != 0:
            raise BenchError(f"jobq-ctl push: {res.stderr.strip()}")
        return res.stdout.split()

    def states(self, ids: list[str]) -> list[str]:
        """Each task's state as its row says ('failed' with a reason for a cancelled one)."""
        conn = sqlite3.connect(self.db, timeout=30)
        try:
            found = dict(conn.execute(
                f"SELECT id, status FROM jobs WHERE id IN ({','.join('?' * len(ids))})", ids))
        finally:
            conn.close()
        return [found.get(i, "missing") for i in ids]

    def wait(self, ids: list[str], state: str, what: str) -> None:
        wait_until(lambda: set(self.states(ids)) == {state}, WAIT, 0.1, what=what)


def _text(driver: WebDriver, element_id: str) -> str:
    """The element's text; empty while the page's own refresh replaces it, or when absent."""
    from selenium.common.exceptions import WebDriverException

    try:
        return driver.find_element("id", element_id).text
    except WebDriverException:
        return ""


def _count(driver: WebDriver, css: str) -> int:
    return len(driver.find_elements("css selector", css))


def _click(driver: WebDriver, element_id: str) -> None:
    """Click a button; the page's own refresh may replace it under us, so find it again until
    the click lands."""
    from selenium.common.exceptions import WebDriverException

    def attempt() -> bool:
        try:
            driver.find_element("id", element_id).click()
            return True
        except WebDriverException:
            return False
    wait_until(attempt, WAIT, 0.1, what=f"the {element_id} button")


def _show(driver: WebDriver, url: str, ready: Callable[[WebDriver], object], what: str) -> None:
    """Open ``url`` and reload until ``ready`` holds (what a worker writes shows up on the
    page's next refresh, or ours)."""
    driver.get(url)

    def check() -> bool:
        if ready(driver):
            return True
        driver.refresh()
        return False
    wait_until(check, WAIT, 0.3, what=what)


@contextmanager
def _browser(tmp: Path) -> Iterator[WebDriver]:
    driver = start_chromium(tmp / "chromium", *DESKTOP)
    try:
        yield driver
    finally:
        driver.quit()


def _stage(q: Queue, stack: ExitStack) -> dict[str, str]:
    """Start the workers and bring the queue to the state the screenshots show (all but the
    cancel, which the browser does); the ids the pages need."""
    ok = q.push("./report.sh daily", "./report.sh hourly")
    failing = q.push("./etl.sh 2026-11-24", extra=("--max-attempts", "1"))
    victim = q.push("./train.sh bert-large")
    for wid in WORKERS:
        stack.enter_context(supervisor(
            [*q.base(), "--worker-id", wid, "-n", str(SLOTS), "--control-interval", "1",
             "--heartbeat-interval", "1"], q.tmp, log=f"{wid}.log", stop_timeout=30))
    q.wait(ok, "succeeded", "the report tasks to succeed")
    q.wait(failing, "failed", "the failing task to fail")
    q.wait(victim, "running", "the task to cancel running")
    running = q.push("./train.sh resnet50", "./train.sh vit-b16", "./render.sh scene-0042")
    q.wait(running, "running", "three long tasks running")
    return {"victim": victim[0], "task": running[0]}


def _fill(q: Queue) -> None:
    """After the cancel: a fourth long task takes the freed slot; three wait behind the
    running ones, one for its not-before time."""
    (etl,) = q.push("./etl.sh 2026-11-26")
    q.wait([etl], "running", "the fourth long task running")
    q.push("./train.sh efficientnet-b0", "./render.sh scene-0043", "./etl.sh 2026-11-27")
    q.push("./report.sh weekly", extra=("--delay", "2h"))


def _act(driver: WebDriver, url: str, q: Queue, ids: dict[str, str]) -> None:
    """Log in, cancel a running task from its page, pause and resume the queue: the Actions
    page's three lines."""
    login(driver, url, TOKEN, OPERATOR, timeout=WAIT)
    driver.get(f"{url}/tasks/{ids['victim']}")
    _click(driver, "cancel")
    q.wait([ids["victim"]], "failed", "the cancelled task to end")
    _fill(q)
    driver.get(url + "/")
    _click(driver, "pause")
    wait_until(lambda: "PAUSED" in _text(driver, "paused"), WAIT, 0.1, what="PAUSED shown")
    _click(driver, "resume")
    wait_until(lambda: _text(driver, "paused") == "no", WAIT, 0.1, what="the queue resumed")


def _ready(ids: dict[str, str]) -> dict[str, tuple[str, Callable[[WebDriver], object]]]:
    """Each page's path and the condition it meets once it shows the staged queue."""
    def overview(d: WebDriver) -> object:
        # pending counts the delayed task too: 3 + 1
        return (_text(d, "count-running") == "4" and _text(d, "count-pending") == "4"
                and f"running: {len(WORKERS)}" in _text(d, "worker-states")
                and _count(d, ".chart line.dot.running"))

    def task(d: WebDriver) -> object:
        return "step 120/400" in _text(d, "output")
    return {
        "overview": ("/", overview),
        "overview-phone": ("/", overview),
        "workers": ("/workers", lambda d: _count(d, "tr.worker") == len(WORKERS)
                    and "running" in _text(d, "workers")),
        "worker": (f"/workers/{WORKERS[0]}", lambda d: _count(d, "#tasks tbody tr") == SLOTS),
        "task": (f"/tasks/{ids['task']}", task),
        "tasks": ("/tasks", lambda d: _count(d, "#tasks tbody tr") == 12),
        "failed": ("/failed", lambda d: _count(d, "section.card") == 2),
        "actions": ("/actions", lambda d: _count(d, "tr.audit") == 3),
    }


def _shoot(driver: WebDriver, url: str, ids: dict[str, str], out: Path) -> list[Path]:
    ready = _ready(ids)
    shots = []
    for page in PAGES:
        path, cond = ready[page.name]
        set_viewport(driver, *page.size)
        _show(driver, url + path, cond, f"the {page.name} page to show the sample queue")
        width = driver.execute_script("return document.documentElement.scrollWidth")
        if width > page.size[0]:
            print(f"scripts/screenshots: warning: {page.name} is {width} px wide at "
                  f"{page.size[0]} px", file=sys.stderr)
        shot = out / f"{page.name}.png"
        if not driver.save_screenshot(str(shot)):
            raise BenchError(f"{shot}: no screenshot saved")
        shots.append(shot)
    return shots


def take(tmp: Path, out: Path) -> list[Path]:
    """Stage the queue in ``tmp``, shoot every page into ``out``; every process started
    here is gone when it returns or raises."""
    out.mkdir(parents=True, exist_ok=True)
    (tmp / "token").write_text(TOKEN + "\n")
    q = Queue(tmp)
    me = psutil.Process()
    started: list[psutil.Process] = []
    try:
        with ExitStack() as stack:
            try:
                ids = _stage(q, stack)
                url = stack.enter_context(dashboard(
                    [*q.base(), "dashboard", "--bind", "127.0.0.1:0", "--token-file",
                     str(tmp / "token"), "--sample-interval", "1"], tmp))
                driver = stack.enter_context(_browser(tmp))
                _act(driver, url, q, ids)
                return _shoot(driver, url, ids, out)
            finally:
                started = me.children(recursive=True)
    finally:
        _gone(started + me.children(recursive=True))


def _gone(procs: list[psutil.Process]) -> None:
    """Every process we started (the workers, their tasks, the dashboard, Chromium) is gone;
    a survivor is killed and reported."""
    _, alive = psutil.wait_procs(procs, timeout=10)
    left = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                p.kill()
                left.append(p.pid)
        except psutil.NoSuchProcess:  # gone meanwhile
            continue
    if left:
        raise BenchError(f"processes left running (killed): {left}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/screenshots", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT,
                        help=f"folder of the PNG files (default {OUT.relative_to(REPO)})")
    ns = parser.parse_args(argv)
    why = why_no_browser()
    if why:
        print(f"scripts/screenshots: error: {why}", file=sys.stderr)
        return 1
    from selenium.common.exceptions import SessionNotCreatedException, WebDriverException

    try:
        with tempfile.TemporaryDirectory(prefix="jobq-screenshots-") as tmp:
            shots = take(Path(tmp), ns.out.resolve())
    except WebDriverException as exc:  # its str() carries a stack trace: the message only
        hint = (" (Chromium's socket path, under TMPDIR, must fit in 107 bytes)"
                if isinstance(exc, SessionNotCreatedException) else "")
        line = " ".join((exc.msg or type(exc).__name__).split()) + hint
        print(f"scripts/screenshots: error: Chromium: {line[:300]}", file=sys.stderr)
        return 1
    except (BenchError, OSError, subprocess.SubprocessError) as exc:
        line = " ".join(str(exc).split()) or type(exc).__name__
        print(f"scripts/screenshots: error: {line[:300]}", file=sys.stderr)
        return 1
    print(f"scripts/screenshots: {len(shots)} screenshots in {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
