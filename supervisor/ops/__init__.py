"""What an operator sees and does, as data: used by jobq-ctl and the dashboard (docs/architecture.rst)."""
