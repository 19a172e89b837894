"""Shared vocabulary: settings, tasks, option parsing, signing, back-off, threads, Azure.

Imports nothing else of the package and starts no thread (docs/architecture.rst).
"""
