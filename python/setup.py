"""`pip install ./python` from a checkout: the package with the checkout's
libsymm.so and symm tool inside, so that it works wherever it is installed.

`make wheel` puts them into the package itself (tools/build_wheel.py); an
editable install (`pip install -e python`) finds them in ../build at run
time. A plain install copies them from ../build here, or refuses, saying
how to build them, when the checkout has none.

A wheel that carries them is a platform wheel with `make wheel`'s tag
(py3-none-manylinux_2_<N>_<arch>, from tools/build_wheel.py), not
py3-none-any: pip must refuse it where the binaries cannot run.
"""

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1 has it in the wheel package
    from wheel.bdist_wheel import bdist_wheel

CHECKOUT_BUILD = Path(__file__).resolve().parent.parent / "build"
LIB, TOOL = CHECKOUT_BUILD / "libsymm.so", CHECKOUT_BUILD / "symm"
BUILD_WHEEL = CHECKOUT_BUILD.parent / "tools" / "build_wheel.py"


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the package reads ../build where it is
        pkg = Path(self.build_lib) / "symm"
        # SYMM_TORCH_ALLOCATOR=1's start-up line, at site-packages' top, and
        # the module it imports (the variable's words).
        for name in ("symm_autoload.pth", "symm_autoload.py"):
            shutil.copy2(pkg / "_boot" / name, Path(self.build_lib) / name)
        if (pkg / "libsymm.so").exists():
            return  # already bundled (make wheel)
        if not LIB.is_file() or not TOOL.is_file():
            raise SystemExit(
                f"symm: `pip install ./python` bundles the checkout's build/libsymm.so and build/symm, "
                f"and {CHECKOUT_BUILD} has {'neither' if not LIB.is_file() and not TOOL.is_file() else 'only one of them'}. "
                "Run `make lib cli` in the repository first (Go 1.24 or newer and a C compiler), or `make wheel` and "
                "`pip install build/dist/symm-*.whl`."
            )
        shutil.copy2(LIB, pkg / "libsymm.so")
        (pkg / "bin").mkdir(exist_ok=True)
        shutil.copy2(TOOL, pkg / "bin" / "symm")


def _bundles() -> bool:
    """Whether the wheel carries the checkout's binaries (build_py copies them)."""
    return LIB.is_file() and TOOL.is_file() and BUILD_WHEEL.is_file()


class PlatformWheel(bdist_wheel):
    """Tags the wheel as `make wheel` does when it carries the binaries."""

    def finalize_options(self):
        super().finalize_options()
        if _bundles():
            self.root_is_pure = False

    def get_tag(self):
        if not _bundles():
            return super().get_tag()  # build_py refuses such a build
        spec = importlib.util.spec_from_file_location("build_wheel", BUILD_WHEEL)
        tools = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tools)
        return "py3", "none", tools.platform_tag([LIB, TOOL])


setup(cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel})
