"""The runners: vkml on a Vulkan device, and its peers.

A peer is a module here with a ``Peer`` subclass of :class:`Runner`.  Whether it is used
is decided at run time: a peer whose package is missing, or that cannot run a workload
(an operator or mode it lacks, a data type, a layer with no Vulkan kernel), raises
:class:`Absent` with the reason, and the report lists it as absent: never an error.
"""
from __future__ import annotations

import importlib


class Absent(Exception):
    """This runner cannot run this workload (or at all); the message says why."""


class Runner:
    """A way to run a workload.  ``prepare`` returns a function that runs it once on the
    workload's NumPy inputs and returns a NumPy output (end to end: NumPy in and out)."""

    #: Name in reports ("torch-cpu", "ncnn-vulkan", ...).
    name = ""
    #: The runner runs on a Vulkan device (a row per device), not on the CPU.
    on_device = False

    def __init__(self, device=None):
        self.device = device

    @classmethod
    def probe(cls) -> str:
        """The peer's version; raises :class:`Absent` when it cannot be used here."""
        raise NotImplementedError

    def prepare(self, workload, inputs: list):
        """A callable running ``workload`` once; raises :class:`Absent` when it cannot."""
        raise NotImplementedError

    def close(self) -> None:
        pass


def require(module: str, package: str | None = None):
    """Import a peer's package or raise :class:`Absent` naming what to install: the
    package itself, or the ``bench`` extra (every peer, as pyproject.toml lists them)."""
    try:
        return importlib.import_module(module)
    except Exception as exc:          # noqa: BLE001  (ImportError, or a broken install)
        package = package or module
        raise Absent(f"{package} is not installed ({type(exc).__name__}: {exc}); "
                     f"pip install {package} (or every peer: pip install 'vkml[bench]')"
                     ) from None


#: Peer modules, in report order.  vkml itself is ``bench.runners.vkml_runner``.
PEERS = ("numpy_peer", "torch_peer", "onnx_peer", "ncnn_peer")


def peer_classes() -> list[type[Runner]]:
    """The peer runner classes (their packages are imported only when probed)."""
    out = []
    for mod in PEERS:
        m = importlib.import_module(f"{__name__}.{mod}")
        out += list(getattr(m, "RUNNERS", ()))
    return out
