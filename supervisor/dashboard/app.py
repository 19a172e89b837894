"""The dashboard's Flask app: pages, the JSON API under /api/ and the action endpoints.
Every view runs on one of waitress's request threads (see serve.py); reads and writes go
through DataSource (data.py), so a queue or store that is down is a 503 page and never a
traceback.  Actions write the same signed control records as ``jobq-ctl`` and carry the
login as ``who``; each is kept in the audit log as jobq-ctl's are (ops/audit.py)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flask import (
    Flask,
    Response,
    abort,
    has_request_context,
    jsonify,
    redirect,
    render_template,
    request,
    url_for,
)
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException

from ..ops.audit import ids_text
from ..ops.results import ended_text
from ..ops.times import duration_text
from .auth import NAME, Auth
from .charts import depth_chart, depth_series, finished_chart
from .data import DataSource, Refused, Unavailable
from .edges import HostCheck, LoginThrottle, local_path, page_text
from .history import History, restore, summed_per_minute
from .prom import register as register_metrics
from .queues import Queues
from .sessions import DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_AGE, Sessions
from .task_views import found_or_404, id_or_400
from .task_views import register as register_task_views

log = logging.getLogger("jobq.dashboard")
ACTIONS = ("drain", "stop")
ACTIONS_SHOWN = 100  # operator actions on the actions page


def _flag_arg(name: str) -> bool:
    value = request.args.get(name, "0")
    if value not in ("0", "1"):
        abort(400, f"?{name}= takes 0 or 1")
    return value == "1"


def create_app(data: DataSource | Sequence[DataSource],
               history: History | Mapping[str, History] | None = None,
               token: str | None = None, secret: bytes | None = None, refresh: int = 5,
               token_file: str | None = None, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
               clock: Callable[[], float] = time.monotonic, max_age: float = DEFAULT_MAX_AGE,
               hosts: HostCheck | None = None, secure_cookies: bool = False) -> Flask:
    """The WSGI app (built on the main thread before serving starts).  ``data``: one queue's
    DataSource, or one per queue (``history``: then a History per queue name).  ``refresh``:
    seconds between an open page's refreshes (each one costs backend and store calls).
    ``token``: the operators' token, ``token_file`` the file it was read from (read again
    per request); ``idle_timeout`` ends a session unused that long, ``max_age`` any session
    that old (``clock``: monotonic seconds, injected by tests; the login throttle's too).
    ``hosts``: the Host names answered (default: loopback's); ``secure_cookies``: the
    session cookie is sent over HTTPS only (behind a TLS proxy).  Each History is filled
    with what the control store kept of its queue's last window (history.restore)."""
    app = Flask(__name__)
    app.secret_key = secret or os.urandom(32)  # sessions end when the dashboard restarts
    app.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Strict",
                      MAX_CONTENT_LENGTH=64 * 1024)
    if secure_cookies:  # __Host-: no other site of the domain can set or shadow it
        app.config.update(SESSION_COOKIE_SECURE=True, SESSION_COOKIE_NAME="__Host-session")
    # Strings from messages (ids, commands, reasons) keep no control or bidi character in a
    # page: autoescaping leaves U+202E alone, and it would reorder what follows.
    app.jinja_env.finalize = page_text
    (hosts or HostCheck("127.0.0.1")).install(app)
    auth = Auth(token, Sessions(idle_timeout, clock, max_age), token_file)
    throttle = LoginThrottle(clock=clock)
    queues = Queues([data] if isinstance(data, DataSource) else data)
    histories: Mapping[str, History] = (
        history if isinstance(history, Mapping)
        else {queues.names[0]: history or History()})
    started = time.time()
    for name, d in queues.sources.items():  # a fresh dashboard draws the last hour at once
        if name in histories:
            restore(d, histories[name], started)
    current = queues.current

    @app.url_defaults
    def _same_queue(endpoint: str, values: dict[str, Any]) -> None:
        # links stay on the page's queue; the first queue's URLs carry none (old URLs)
        if endpoint != "static" and has_request_context():
            name = request.args.get("queue")
            if name and name != queues.names[0] and name in queues.sources:
                values.setdefault("queue", name)

    @app.context_processor
    def _common() -> dict[str, Any]:
        name = request.args.get("queue")
        here = name if name in queues.sources else queues.names[0]
        return {"queue": here, "queues": queues.names if queues.several else [],
                "ago": duration_text, "ended": ended_text, "refresh": refresh,
                **auth.context()}

    def _page(status: int, title: str, text: str) -> tuple[str, int]:
        return render_template("error.html", title=title, text=text), status

    @app.errorhandler(Unavailable)
    def _unavailable(exc: Unavailable) -> ResponseReturnValue:
        log.warning("dashboard: %s unavailable: %s", exc.what, exc.text)
        if request.path.startswith("/api/"):
            return jsonify(error=str(exc)), 503
        return _page(503, f"The {exc.what} is unavailable", exc.text)

    @app.errorhandler(Refused)
    def _refused(exc: Refused) -> ResponseReturnValue:
        log.warning("dashboard: %s refused a write: %s", exc.what, exc.text)
        text = (f"The {exc.what} refused it: {exc.text}. This dashboard's credentials "
                "may only read (a read-only database role): nothing was changed.")
        if request.path.startswith("/api/"):
            return jsonify(error=text), 403
        return _page(403, "Not allowed with a read-only role", text)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> ResponseReturnValue:
        code = exc.code or 500
        if request.path.startswith("/api/"):
            return jsonify(error=exc.description), code
        return _page(code, f"{code} {exc.name}", exc.description or "")

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> ResponseReturnValue:
        log.exception("dashboard: unexpected error on %s", request.path)
        return _page(500, "Unexpected error", "the dashboard's log has the details")

    @app.after_request
    def _headers(resp: Response) -> Response:
        resp.headers["Content-Security-Policy"] = ("default-src 'self'; style-src 'self'; "
                                                   "img-src 'self' data:; frame-ancestors "
                                                   "'none'")
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"
        resp.headers["Cache-Control"] = "no-store"
        return resp

    # ------------------------------------------------------------------ pages
    @app.get("/")
    def overview() -> str:
        if queues.several:  # every queue, whatever ?queue= says
            rows = queues.rows()
        else:
            d = current()
            rows = [{"name": d.queue, "status": d.status(), "error": None,
                     "cancelled": d.cancelled(), "flag": None}]
        now = time.time()
        try:
            workers: dict[str, int] | None
            workers, flags = queues.fleet()
            store_error = None
        except Unavailable as exc:
            workers, flags, store_error = None, {}, str(exc)
        for row in rows:
            row["flag"] = flags.get(row["name"])
        shown = [histories[n] for n in queues.names if n in histories]
        window = shown[0].window if shown else 3600.0
        return render_template(
            "overview.html", rows=rows, several=queues.several, workers=workers,
            store_error=store_error,
            running=[(row["name"], r) for row in rows if row["status"]
                     for r in row["status"]["running"]],
            depths=[(n, depth_chart(samples, now, histories[n].window), depth_series(samples))
                    for n in queues.names if n in histories
                    for samples in [histories[n].samples()]],
            finished=finished_chart(summed_per_minute(shown), now, window))

    @app.get("/actions")
    def actions() -> str:
        try:
            found, store_error = current().audits_or_raise(ACTIONS_SHOWN), None
        except Unavailable as exc:
            found, store_error = [], str(exc)
        return render_template("actions.html", actions=found, store_error=store_error,
                               limit=ACTIONS_SHOWN)

    @app.get("/api/actions")
    def api_actions() -> ResponseReturnValue:
        return jsonify(current().audits_or_raise(ACTIONS_SHOWN))

    @app.get("/workers")
    def workers() -> str:
        show_all = _flag_arg("all")
        return render_template("workers.html", workers=current().workers(show_all),
                               show_all=show_all)

    @app.get("/workers/<worker_id>")
    def worker(worker_id: str) -> str:
        return render_template("worker.html", w=found_or_404(current(), "worker", worker_id))

    @app.get("/search")
    def search() -> ResponseReturnValue:
        here = current()
        task_id = queues.resolve_id(id_or_400(request.args.get("id"), "task"), here)
        found = queues.find_task(task_id, here) if queues.several else here
        return redirect(url_for("task", task_id=task_id, queue=(found or here).queue))

    # ------------------------------------------------------------------ JSON API
    @app.get("/api/status")
    def api_status() -> ResponseReturnValue:
        # several queues: the per-queue object of ``jobq-ctl status --queue a,b --json``
        return jsonify(queues.status_json() if queues.several else current().status())

    @app.get("/api/workers")
    def api_workers() -> ResponseReturnValue:
        return jsonify(current().workers(_flag_arg("all")))

    @app.get("/api/worker/<worker_id>")
    def api_worker(worker_id: str) -> ResponseReturnValue:
        return jsonify(found_or_404(current(), "worker", worker_id))

    # ------------------------------------------------------------------ auth
    @app.route("/login", methods=["GET", "POST"])
    def login() -> ResponseReturnValue:
        if not auth.enabled:
            abort(403, "the dashboard is read-only (started without --token-file)")
        if request.method == "GET":
            return render_template("login.html", error=None)
        auth.check_post(need_login=False)
        name = request.form.get("name", "").strip() or "operator"
        if not NAME.fullmatch(name):
            abort(400, "a name is 1-40 letters, digits, '.', '_' or '-'")
        client = request.remote_addr or "?"
        wait, first = throttle.attempt(client)
        if wait:  # the token is not even compared: guessing goes no faster than the bound
            if first:  # one line per flood, not one per request
                log.warning("dashboard: logins from %s refused for %.0f s: too many failed "
                            "logins (%d a minute from one address, %d from all)", client,
                            wait, throttle.per_client, throttle.overall)
            page = render_template("login.html", error=(
                f"too many failed logins: try again in {wait:.0f} s"))
            return page, 429, {"Retry-After": str(max(1, round(wait)))}
        if auth.login(request.form.get("token", ""), name):
            throttle.succeeded(client)
        else:
            log.warning("dashboard: failed login as %r from %s", name, request.remote_addr)
            error = "wrong token" if auth.usable() else (
                "no login works now: the token file is unusable (the dashboard's log says why)")
            return render_template("login.html", error=error), 403
        log.warning("dashboard: %s logged in from %s", auth.who(), request.remote_addr)
        return redirect(url_for("overview"))

    @app.post("/logout")
    def logout() -> ResponseReturnValue:
        auth.check_post(need_login=False)  # an ended session's logout clears its cookie
        who = auth.logout()
        if who is not None:
            log.warning("dashboard: %s logged out from %s", who, request.remote_addr)
        return redirect(url_for("overview"))

    # ------------------------------------------------------------------ actions
    def _done(action: str, detail: str = "") -> ResponseReturnValue:
        who = auth.who() or ""
        data = current()
        # The audit trail: this line, and an audit record in the control store, worded as
        # jobq-ctl's (ops/audit.py)
        what = f"{action} {detail}".strip()
        log.warning("dashboard: action %s on queue %s by %s", what, data.queue, who)
        if not data.audit(action, detail, who, time.time()):
            log.warning("dashboard: action %s by %s not kept in the control store (down)",
                        what, who)
        back = request.form.get("back") or ""
        return redirect(back if local_path(back) else url_for("overview"))

    @app.post("/queue/<action>")
    def queue_action(action: str) -> ResponseReturnValue:
        auth.check_post()
        if action not in ("pause", "resume"):
            abort(404, f"no queue action {action!r}")
        current().pause(action == "pause", auth.who() or "")
        return _done(action)

    @app.post("/workers/<worker_id>/<action>")
    def worker_action(worker_id: str, action: str) -> ResponseReturnValue:
        auth.check_post()
        if action not in ACTIONS:
            abort(404, f"no worker action {action!r}")
        worker_id = id_or_400(worker_id, "worker")
        data = current()
        if not data.command(worker_id, action, auth.who() or ""):
            abort(404, f"no live worker {worker_id!r} on queue {data.queue}")
        return _done(action, ids_text([worker_id]))

    register_task_views(app, current, auth, _done)
    register_metrics(app, queues)  # /metrics: the fleet's gauges for Prometheus
    return app

