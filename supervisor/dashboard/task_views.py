"""The task and failed pages, the output API and their actions (cancel, requeue, clear),
registered on the app by create_app (app.py).  Every view runs on one of waitress's request
threads; the reads and writes are in tasks.py."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from flask import Flask, abort, jsonify, render_template, request
from flask.typing import ResponseReturnValue

from ..backends.task_list import MAX_PAGE, PAGE, TASK_STATES, BadCursor, TaskQuery
from ..ops.audit import count_text, tasks_text
from . import tasks
from .auth import Auth
from .data import DataSource, Unavailable

# Task and worker ids as push and the workers print them; anything else is a malformed query.
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}")
NUMBER = re.compile(r"[0-9]{1,15}")


def id_or_400(value: str | None, what: str) -> str:
    value = (value or "").strip()
    if not ID.fullmatch(value):
        abort(400, f"not a {what} id: {value[:60]!r}")
    return value


def found_or_404(data: DataSource, what: str, raw_id: str) -> Mapping[str, Any]:
    """The task or worker (``what``) ``raw_id`` names on ``data``'s queue, else a 400 (a
    malformed id) or 404 (a request thread)."""
    lookup: Callable[[str], Mapping[str, Any] | None] = (
        data.task if what == "task" else data.worker)
    found = lookup(id_or_400(raw_id, what))
    if found is None:
        more = data.missing_text() if what == "task" else ""
        abort(404, f"no {what} {raw_id!r} on queue {data.queue}{more}")
    return found


def _int_arg(name: str, low: int, required: bool) -> int | None:
    value = request.args.get(name)
    if value is None and not required:
        return None
    if value is None or not NUMBER.fullmatch(value) or int(value) < low:
        abort(400, f"?{name}= takes a whole number of at least {low}")
    return int(value)


def _task_query() -> TaskQuery:
    """The tasks page's filters from its query string (a bad one: 400)."""
    states = tuple(request.args.getlist("state"))
    if any(s not in TASK_STATES for s in states):
        abort(400, f"?state= takes {', '.join(TASK_STATES)}")
    worker = request.args.get("worker", "").strip() or None
    if worker is not None:
        worker = id_or_400(worker, "worker")
    text = request.args.get("q", "").strip()[:200] or None
    after = request.args.get("after") or None
    if after is not None and len(after) > 300:
        abort(400, "?after= is a cursor the previous page links to")
    limit = _int_arg("limit", 1, required=False) or PAGE
    return TaskQuery(states=states, worker=worker, text=text, cursor=after,
                     limit=min(limit, MAX_PAGE))


def register(app: Flask, current: Callable[[], DataSource], auth: Auth,
             done: Callable[[str, str], ResponseReturnValue]) -> None:
    """Add the views (main thread, before serving).  ``current``: the request's queue."""

    @app.get("/tasks/<task_id>")
    def task(task_id: str) -> str:
        found = found_or_404(current(), "task", task_id)
        try:
            stored: list[int] | None = tasks.output_attempts(current(), found["id"])
            output_error = None
        except Unavailable as exc:
            stored, output_error = None, exc.text
        # an attempt cancelled before it ran (no worker) has no output to show
        attempts = sorted({a["attempt"] for a in found["attempts"] if a["worker"]}
                          | set(stored or []))
        chosen = _int_arg("attempt", 1, required=False)
        return render_template("task.html", t=found, output_attempts=attempts, chosen=chosen,
                               output_error=output_error, cap_kib=tasks.CAP >> 10)

    @app.get("/api/task/<task_id>")
    def api_task(task_id: str) -> ResponseReturnValue:
        return jsonify(found_or_404(current(), "task", task_id))

    @app.get("/api/task/<task_id>/output")
    def api_output(task_id: str) -> ResponseReturnValue:
        task_id = id_or_400(task_id, "task")
        attempt = _int_arg("attempt", 1, required=True)
        offset = _int_arg("offset", 0, required=False)
        assert attempt is not None
        if offset is None:  # the first call of a page: is there such a task at all?
            found_or_404(current(), "task", task_id)
        return jsonify(tasks.output_json(current(), task_id, attempt, offset))

    def page(query: TaskQuery) -> tuple[list[dict[str, Any]], str | None, str | None]:
        try:
            return tasks.task_page(current(), query)
        except BadCursor as exc:
            abort(400, f"?after=: {exc}")

    @app.get("/tasks")
    def task_list() -> str:
        query = _task_query()
        rows, after, note = page(query)
        return render_template("tasks.html", rows=rows, after=after, note=note, query=query,
                               states=TASK_STATES)

    @app.get("/api/tasks")
    def api_task_list() -> ResponseReturnValue:
        rows, after, note = page(_task_query())
        return jsonify({"tasks": rows, "next": after, "note": note})

    @app.get("/failed")
    def failed() -> str:
        rows, total = tasks.failed_json(current())
        return render_template("failed.html", rows=rows, total=total)

    @app.get("/api/failed")
    def api_failed() -> ResponseReturnValue:
        rows, total = tasks.failed_json(current())
        return jsonify({"tasks": rows, "total": total})

    # ------------------------------------------------------------------ actions
    @app.post("/tasks/<task_id>/cancel")
    def task_cancel(task_id: str) -> ResponseReturnValue:
        auth.check_post()
        task_id = id_or_400(task_id, "task")
        if tasks.cancel(current(), task_id, auth.who() or "") is None:
            abort(409, f"task {task_id} has already ended: nothing to cancel")
        return done("cancel", tasks_text([task_id]))

    @app.post("/tasks/<task_id>/requeue")
    def task_requeue(task_id: str) -> ResponseReturnValue:
        auth.check_post()
        task_id = id_or_400(task_id, "task")
        if tasks.requeue(current(), [task_id]) == 0:
            abort(409, f"task {task_id} is not failed or cancelled: nothing to requeue")
        return done("requeue", tasks_text([task_id]))

    @app.post("/failed/requeue")
    def failed_requeue() -> ResponseReturnValue:
        auth.check_post()
        ids = [id_or_400(i, "task") for i in request.form.getlist("id")]
        if not ids:
            abort(400, "no task ids given")
        n = tasks.requeue(current(), ids)
        return done("requeue", tasks_text(ids, n, "shown failed tasks"))

    @app.post("/tasks/bulk")
    def tasks_bulk() -> ResponseReturnValue:
        """The selected tasks' cancel or requeue: a confirmation page first (the same form
        again with confirm=yes), then the action."""
        auth.check_post()
        action = request.form.get("action")
        if action not in ("cancel", "requeue"):
            abort(400, "action= is cancel or requeue")
        ids = list(dict.fromkeys(id_or_400(i, "task") for i in request.form.getlist("id")))
        if not ids:
            abort(400, "no task selected")
        if len(ids) > MAX_PAGE:
            abort(400, f"at most {MAX_PAGE} tasks at once")
        if request.form.get("confirm") != "yes":
            return render_template("bulk.html", action=action, ids=ids,
                                   back=request.form.get("back") or "")
        if action == "cancel":
            n = tasks.cancel_many(current(), ids, auth.who() or "")
        else:
            n = tasks.requeue(current(), ids)
        return done(action, tasks_text(ids, n, "selected tasks"))

    @app.route("/failed/clear", methods=["GET", "POST"])
    def failed_clear() -> ResponseReturnValue:
        if request.method == "GET":  # the confirmation step
            if not auth.context()["can_act"]:
                abort(403, "log in to clear failed tasks")
            return render_template("clear.html", total=tasks.failed_count(current()))
        auth.check_post()
        if request.form.get("confirm") != "yes":
            abort(400, "clearing needs confirm=yes (the confirmation page sends it)")
        n = tasks.clear_failed(current())
        return done("clear", count_text(n, "failed tasks"))
