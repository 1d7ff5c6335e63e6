"""``vkml.Tensor``: an array in device memory.

A tensor owns one device allocation.  ``shape`` and ``dtype`` say how vkml's functional
API reads it; the DML layer binds it as a raw buffer whose size must cover the
``TotalTensorSizeInBytes`` of the descriptor it is bound to (DirectML binds buffers,
not typed arrays).
"""
from __future__ import annotations

import math
import weakref

import numpy as np


class Tensor:
    """A device tensor; create one with :func:`vkml.tensor` or :func:`vkml.empty`."""

    __slots__ = ("device", "shape", "dtype", "nbytes", "_alloc", "_finalizer", "__weakref__")

    def __init__(self, device, shape, dtype, alloc, nbytes: int, owner: bool = True):
        self.device = device
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        #: Bytes the tensor's buffer holds for binding: at least ``size * itemsize``.
        self.nbytes = int(nbytes)
        self._alloc = alloc
        # A tensor that does not own its allocation (vkml's own view of memory held
        # elsewhere, e.g. a result array's pages) never frees it.
        self._finalizer = weakref.finalize(self, alloc.heap.defer_free, alloc) if owner else None

    @property
    def allocation(self):
        """The device allocation holding the tensor (``runtime.Allocation``), for the
        operator layer's bindings."""
        return self._alloc

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numpy(self) -> np.ndarray:
        """Download into a new NumPy array."""
        out = np.empty(self.shape, dtype=self.dtype)
        self.device.check_open()
        self.device.context.read(self._alloc, out)
        return out

    def read_bytes(self, nbytes: int | None = None) -> np.ndarray:
        """The first ``nbytes`` raw bytes of the buffer (all of it by default)."""
        out = np.empty(self.nbytes if nbytes is None else nbytes, dtype=np.uint8)
        self.device.check_open()
        self.device.context.read(self._alloc, out)
        return out

    def write(self, array) -> "Tensor":
        """Upload ``array`` (same number of bytes or fewer) into this tensor."""
        data = np.ascontiguousarray(array)
        if data.nbytes > self.nbytes:
            raise ValueError(f"{data.nbytes} bytes do not fit a tensor of {self.nbytes}")
        self.device.check_open()
        self.device.context.write(self._alloc, data)
        return self

    def free(self) -> None:
        """Give the memory back now (otherwise it goes with the last reference)."""
        if self._finalizer is not None and self._finalizer.detach() is not None:
            self._alloc.free()

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        return f"vkml.Tensor(shape={self.shape}, dtype={self.dtype}, device={self.device.name!r})"
