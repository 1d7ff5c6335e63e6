"""A device's lifetime: the one guard every call into Vulkan passes through.

Threads may use a device while another closes it.  Each call that touches a Vulkan
object of the device (allocate, map/copy, record, submit and wait, create a pipeline,
update descriptors, release) runs inside :meth:`Lifetime.entry` (or a method decorated
with :func:`entry`): a reader of the device.  :meth:`Lifetime.close` is the writer: it
refuses new entries with ``DeviceError("the device was closed")``, waits until the calls
already inside have returned (their submissions' fences have signalled), and only then
lets the device be destroyed.  Releasing an object (:func:`release`) after that is a
no-op: destroying the device released everything.

Entries nest (a staged write runs a sequence); a nested entry after ``close`` began
raises, which unwinds the outer one, so ``close`` never waits on a thread that waits on it.
"""
from __future__ import annotations

import functools
import os
import threading
import time

from ..errors import DeviceError

#: What :meth:`Lifetime.close` waits for calls in flight beyond their own GPU waits.
CLOSE_MARGIN_S = 10.0
#: How long :meth:`Lifetime.close` waits for calls in flight by default: the GPU wait
#: timeout (``VKML_TIMEOUT``) and a margin, since a call in flight may itself wait that
#: long.  A first run's wait may be longer (``VKML_FIRST_USE_TIMEOUT``): the context's
#: ``close`` passes what the waits in flight were allowed.
CLOSE_WAIT_S = float(os.environ.get("VKML_TIMEOUT", "120")) + CLOSE_MARGIN_S


class Lifetime:
    """In-flight counter and closing flag of one device, under one condition variable."""

    __slots__ = ("_lock", "_cond", "_active", "closing", "closed", "lost", "timed_out")

    def __init__(self):
        # Readers take the condition's lock itself (``Condition.__enter__`` is one more
        # Python call on every entry; the hot path makes three entries per functional call).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._active = 0
        self.closing = False      # set by close(): no new entries
        self.closed = False       # set once the device was destroyed
        self.lost = False         # VK_ERROR_DEVICE_LOST or a timeout: no new work
        #: a wait timed out: that submission may still be running (see try_release)
        self.timed_out = False

    def check(self) -> None:
        """Raise :class:`DeviceError` unless new work may start on the device."""
        if self.closing:
            raise DeviceError("the device was closed")
        if self.lost:
            raise DeviceError("the device was lost; create a new vkml.Device")

    # -- readers -----------------------------------------------------------------------
    def __enter__(self) -> None:
        with self._lock:
            if self.closing or self.lost:
                self.check()
            self._active += 1

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._active -= 1
            if self.closing and not self._active:
                self._cond.notify_all()

    def entry(self) -> "Lifetime":
        """``with lifetime.entry():`` a call into Vulkan (raises once closing)."""
        return self

    def try_enter(self) -> bool:
        """Enter for a release: False (and nothing entered) once closing.  A lost device
        still releases its objects (Vulkan allows destroying objects of a lost device)."""
        with self._lock:
            if self.closing:
                return False
            self._active += 1
            return True

    def try_release(self) -> bool:
        """:meth:`try_enter` for destroying or freeing an object; False also after a wait
        timed out: that submission may still run and read what would be freed (a staging
        buffer, a tensor, a command buffer), so every object waits for ``close``, which
        destroys them after the device drained."""
        with self._lock:
            if self.closing or self.timed_out:
                return False
            self._active += 1
            return True

    # -- the writer --------------------------------------------------------------------
    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Refuse new entries and wait for those in flight.  True for the caller that
        must now destroy the device; False if another close did or is doing it (this one
        returns once that has finished)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            first = not self.closing
            self.closing = True
            while (self._active if first else not self.closed):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DeviceError(f"closing the device: {self._active} call(s) still "
                                      f"running after {timeout:.0f} s")
                self._cond.wait(left)
            return first

    def destroyed(self) -> None:
        """Mark the device destroyed (wakes concurrent :meth:`close` callers)."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()


def entry(method):
    """Decorator: run ``method`` of an object with a ``ctx`` inside its device's entry."""
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        with self.ctx.lifetime:
            return method(self, *args, **kwargs)
    return guarded


def release(method):
    """Decorator: run a release ``method`` inside an entry, or skip it (returning None)
    once the device is closing (destroying it releases everything) or a wait timed out
    (:meth:`Lifetime.try_release`)."""
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        life = self.ctx.lifetime
        if not life.try_release():
            return None
        try:
            return method(self, *args, **kwargs)
        finally:
            life.__exit__()
    return guarded
