"""Build hook: a non-editable build (``pip install .``, scripts/install-service) records the
commit of the checkout it was built from, so ``--version`` and ``jobq-ctl workers`` tell two
builds of one release apart.  Everything else is in setup.cfg.

The commit goes into the build directory only (``supervisor/core/BUILT_FROM``), never into the
checkout; an editable install reads the checkout's commit at run time instead
(supervisor/core/build.py, which this file loads on its own to read the commit the same way).
"""

import importlib.util
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


def _build_module():
    spec = importlib.util.spec_from_file_location(
        "_jobq_build", os.path.join(ROOT, "supervisor", "core", "build.py"))
    module = importlib.util.module_from_spec(spec)
    before, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no .pyc in the checkout
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = before
    return module


class BuildPyWithCommit(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # editable: read at run time from the checkout
        build = _build_module()
        target = os.path.join(self.build_lib, "supervisor", "core", build.BUILT_FROM)
        # Written on every build, also empty: a build directory reused from an older
        # checkout must not keep that checkout's commit.
        with open(target, "w", encoding="ascii") as f:
            f.write((build.read_commit(ROOT) or "") + "\n")

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            outputs.append(os.path.join(self.build_lib, "supervisor", "core", "BUILT_FROM"))
        return outputs


setup(cmdclass={"build_py": BuildPyWithCommit})
