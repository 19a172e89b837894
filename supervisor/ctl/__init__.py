"""jobq-ctl: its parser, one dispatch table, and what it prints (docs/architecture.rst)."""
