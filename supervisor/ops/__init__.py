"""What an operator sees and does, as data, for jobq-ctl and the dashboard.

See docs/architecture.rst.
"""
