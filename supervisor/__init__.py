"""jobq-supervisor: run queue-driven shell tasks under renewed leases."""

__version__ = "0.1.0"
