"""Shared vocabulary: settings, tasks, option parsing, signing, back-off, threads, the Azure account.

Imports nothing else of the package and starts no thread (docs/architecture.rst).
"""
