"""``jobq-ctl dashboard``: a web view of one queue's fleet (Flask, served by waitress), on
the same seams as ``jobq-ctl``.  See docs/architecture.rst, "The dashboard".

Modules: ``serve.py`` (options, waitress, signals), ``app.py`` (routes), ``data.py`` (per-thread
backend and control store), ``auth.py`` (token login, CSRF), ``sessions.py`` (the server-side
login sessions), ``history.py`` (the depth sampler thread), ``charts.py`` (server-side SVG);
templates/ and static/ ship in the package.
"""
