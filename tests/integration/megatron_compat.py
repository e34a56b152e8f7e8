"""Megatron-core's own indexed-dataset reader/writer and blending helper, for interop tests and
benchmarks.

megatron-core imports its whole training stack from megatron/core/__init__.py, which needs
torch >= 2.6 and more. It is used in two versions (tests/integration/conftest.py, STACKS): 0.16.1
in the project venv (pip --no-deps, on Debian's torch 1.13) and 0.19 in the current set (on torch
2.15, its cp311 wheel installed with --ignore-requires-python). Both ways we import only the
modules we use, unmodified: a bare `megatron.core` package object points at the installed folder,
and `megatron.core.utils` (imported by indexed_dataset.py for one logging helper,
log_single_rank) is replaced by that one helper.
"""
import importlib.util
import logging
import os
import sys
import types


def _bare_core():
    if "megatron.core" in sys.modules and hasattr(sys.modules["megatron.core"], "_crucible_bare"):
        return
    spec = importlib.util.find_spec("megatron")
    if spec is None:
        raise ImportError("megatron-core is not installed (make venv installs it)")
    root = os.path.join(list(spec.submodule_search_locations)[0], "core")
    core = types.ModuleType("megatron.core")
    core.__path__ = [root]
    core._crucible_bare = True
    sys.modules["megatron.core"] = core
    utils = types.ModuleType("megatron.core.utils")

    def log_single_rank(logger: logging.Logger, *args, rank=0, **kwargs):
        logger.log(*args, **kwargs)

    utils.log_single_rank = log_single_rank
    sys.modules["megatron.core.utils"] = utils


def indexed_dataset():
    """megatron.core.datasets.indexed_dataset (IndexedDataset, IndexedDatasetBuilder, DType)."""
    _bare_core()
    import megatron.core.datasets.indexed_dataset as module
    return module


def blending_helper():
    """megatron.core.datasets.helpers_cpp.build_blending_indices (compiled C++, shipped in the wheel)."""
    _bare_core()
    from megatron.core.datasets import helpers_cpp
    return helpers_cpp.build_blending_indices
