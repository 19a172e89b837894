"""The data plane: jobq-supervisor's entry and every thread it runs (docs/architecture.rst)."""
