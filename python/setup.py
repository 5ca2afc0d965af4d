"""`pip install ./python` from a checkout: the package with the checkout's
libsymm.so and symm tool inside, so that it works wherever it is installed.

`make wheel` puts them into the package itself (tools/build_wheel.py); an
editable install (`pip install -e python`) finds them in ../build at run
time. A plain install copies them from ../build here, or refuses, saying
how to build them, when the checkout has none.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CHECKOUT_BUILD = Path(__file__).resolve().parent.parent / "build"


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the package reads ../build where it is
        pkg = Path(self.build_lib) / "symm"
        if (pkg / "libsymm.so").exists():
            return  # already bundled (make wheel)
        lib, tool = CHECKOUT_BUILD / "libsymm.so", CHECKOUT_BUILD / "symm"
        if not lib.is_file() or not tool.is_file():
            raise SystemExit(
                f"symm: `pip install ./python` bundles the checkout's build/libsymm.so and build/symm, "
                f"and {CHECKOUT_BUILD} has {'neither' if not lib.is_file() and not tool.is_file() else 'only one of them'}. "
                "Run `make lib cli` in the repository first (Go 1.26 and a C compiler), or `make wheel` and "
                "`pip install build/dist/symm-*.whl`."
            )
        shutil.copy2(lib, pkg / "libsymm.so")
        (pkg / "bin").mkdir(exist_ok=True)
        shutil.copy2(tool, pkg / "bin" / "symm")


setup(cmdclass={"build_py": BuildPyWithLibrary})
