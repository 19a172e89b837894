"""The fleet layer: control and output stores, and the worker's fleet threads (agent, outbox,
shipper), wired to the worker by callbacks; never imports worker/ (docs/architecture.rst).
"""
