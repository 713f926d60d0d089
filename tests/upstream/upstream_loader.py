"""Imports named modules of an engine's released wheel without the rest of the package.

vLLM, SGLang and LMCache import torch, CUDA kernels and dozens of packages at module level.
The upstream leg needs only their publishers and hashing code, so `venv.sh` unpacks each
`# source` wheel's .py files and this finder loads *the modules a test names* from those files,
unchanged, while every other module of the package (and any third-party module that is not
installed) becomes a stub: a module whose attributes are placeholder objects that can be
subclassed, called, indexed, combined with `|` in annotations and used as decorators. A stub
that the named modules actually *call* on the paths a test drives would show up as a wrong
answer or an AttributeError in the test, never as silent success: tests compare with hashes
and wire bytes the real code produced.

    vllm = upstream_loader.package("vllm", real=["vllm.distributed.kv_events", ...])
    kv_events = importlib.import_module("vllm.distributed.kv_events")
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent


def pins() -> dict[str, str]:
    """name -> version of every line of pins.txt."""
    out = {}
    for line in (HERE / "pins.txt").read_text().splitlines():
        req = line.split("#", 1)[0].strip()
        if "==" in req:
            name, version = req.split("==", 1)
            out[name.strip()] = version.strip()
    return out


def source_dir(name: str) -> Path:
    """Where venv.sh unpacked a `# source` wheel."""
    cache = Path(os.environ.get("PREFIXLOG_UPSTREAM_CACHE", Path.home() / ".cache/prefixlog/upstream"))
    path = cache / "src" / f"{name}-{pins()[name]}"
    if not (path / ".ready").exists():
        raise RuntimeError(f"{path} is missing: run tests/upstream/venv.sh first")
    return path


class _StubMeta(type):
    """Metaclass of stub placeholders: any attribute, call, index or `|` gives a placeholder."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Stub

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    def __ror__(cls, other):
        return cls

    def __call__(cls, *args, **kwargs):
        # Used as a decorator (`@config`, `@lru_cache(...)`): give back what it decorates.
        if len(args) == 1 and not kwargs and (callable(args[0]) or isinstance(args[0], type)):
            return args[0]
        return super().__call__()

    def __iter__(cls):
        return iter(())

    def __bool__(cls):
        return False


class Stub(metaclass=_StubMeta):
    """A placeholder for anything a stubbed module exports (also usable as a base class)."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Stub

    def __call__(self, *args, **kwargs):
        return Stub


class StubModule(types.ModuleType):
    """A module every attribute of which is [`Stub`] (PEP 562's module `__getattr__`)."""

    __path__: list[str] = []  # a package, so `import stub.sub` works too

    _real: set[str] = set()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if f"{self.__name__}.{name}" in self._real:
            # `from pkg import submodule` of a module loaded for real.
            import importlib

            return importlib.import_module(f"{self.__name__}.{name}")
        if name == "init_logger":
            import logging

            return logging.getLogger
        return Stub


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: str, src: Path, real: set[str], stub_missing: bool):
        self.root, self.src, self.real, self.stub_missing = root, src, real, stub_missing

    def _file(self, fullname: str) -> Path | None:
        rel = Path(*fullname.split("."))
        for cand in (self.src / rel.with_suffix(".py"), self.src / rel / "__init__.py"):
            if cand.exists():
                return cand
        return None

    def find_spec(self, fullname, path=None, target=None):
        ours = fullname == self.root or fullname.startswith(self.root + ".")
        if ours and fullname in self.real:
            file = self._file(fullname)
            if file is None:
                raise ImportError(f"{fullname} is not in the {self.root} wheel ({self.src})")
            is_pkg = file.name == "__init__.py"
            return importlib.util.spec_from_file_location(
                fullname, file, submodule_search_locations=[str(file.parent)] if is_pkg else None
            )
        if ours:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        top = fullname.split(".", 1)[0]
        if self.stub_missing and isinstance(sys.modules.get(top), StubModule):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        if self.stub_missing and "." not in fullname and fullname not in sys.modules:
            # A third-party package the named modules import that the venv does not have
            # (torch, transformers, ...): stubbed, never installed.
            for finder in sys.meta_path:
                if isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
                    continue
                if finder.find_spec(fullname, path, target) is not None:
                    return None
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = StubModule(spec.name)
        module.__path__ = []
        module._real = self.real
        return module

    def exec_module(self, module):
        pass


def package(root: str, real: list[str], *, stub_missing: bool = True) -> Path:
    """Makes `import root.x` load the named modules from the unpacked wheel and stub the rest.
    Returns the unpacked wheel's directory."""
    src = source_dir(root if root != "lmcache" else "lmcache")
    for finder in sys.meta_path:
        if isinstance(finder, _Finder) and finder.root == root:
            finder.real |= set(real)
            return src
    sys.meta_path.insert(0, _Finder(root, src, set(real), stub_missing))
    return src


def version(name: str) -> str:
    """The pinned version of a package, as the leg reports what ran."""
    return pins()[name]
