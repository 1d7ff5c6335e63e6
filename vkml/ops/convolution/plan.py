"""A path's dispatches as data.

A path decides everything it records when it is built: each :class:`Step` names its
kernel variant and specialization constants (the pipeline made from them), its grid, its
bindings and its push constants by member name (packed by :func:`vkml.runtime.blocks.pack`
from the manifest, like the uniform parameter blocks the path uploads).  A binding names
either a buffer the path owns or a *role*, one of the tensors an execution binds: ``x``
(input), ``w`` (filter), ``b`` (bias), ``y`` (output), ``r`` (a graph's residual,
read at the output's offsets) and ``s`` (a graph's per-channel input scale).
:func:`record` walks the steps with an execution's tensors in those roles."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...runtime import Bind
from ...runtime.blocks import pack

#: The roles an execution's tensors take in a step's bindings.
ROLES = ("x", "w", "b", "y", "r", "s")


@dataclass(frozen=True)
class Buf:
    """One binding of a step: ``source`` (a role of :data:`ROLES` or an allocation the
    path owns), ``size`` bytes from the start (None: the whole buffer; a role's binding
    is clipped to the buffer bound and rounded down to a multiple of ``align``), access
    and texel format (0: a storage or uniform buffer).  The bias role binds the whole
    bias the operator accepts (``CompiledConvolution.whole``), or ``absent`` where the
    execution has none (any buffer of the right kind: the kernel reads none)."""

    source: object
    size: int | None = None
    access: str = "r"
    fmt: int = 0
    align: int = 1
    absent: object = None


@dataclass
class Step:
    """One dispatch: kernel variant ``kernel`` with ``constants``, ``grid`` workgroups,
    ``binds`` in binding order and ``push`` (member name -> value; None: the kernel
    declares no push constants).  ``subgroup_size``: the full subgroups its pipeline
    requires (0: none)."""

    kernel: str
    constants: dict
    grid: tuple
    binds: tuple
    push: dict | None = None
    subgroup_size: int = 0
    pipe: object = field(default=None, repr=False, compare=False)
    push_bytes: bytes = field(default=b"", repr=False, compare=False)

    def compile(self, op) -> "Step":
        """The step with its pipeline made (``op``'s device)."""
        if self.subgroup_size:
            self.pipe = op.ctx.pipelines.variant(self.kernel, self.constants,
                                                 subgroup_size=self.subgroup_size)
        else:
            self.pipe = op.pipeline(self.kernel, self.constants)
        self.push_bytes = pack(self.kernel, "push", **self.push) if self.push is not None else b""
        return self


def compiled(op, steps) -> list[Step]:
    """``steps`` with their pipelines and push constants made."""
    return [s.compile(op) for s in steps]


def _bind(op, buf: Buf, tensors: dict) -> Bind:
    if buf.source not in ROLES:
        return Bind(buf.source, 0, buf.size, buf.access, buf.fmt)
    alloc = tensors[buf.source]
    if buf.source == "b":
        return Bind(alloc, 0, op.whole(alloc, "bias")) if alloc is not None else Bind(buf.absent)
    size = alloc.size if buf.size is None else min(buf.size, alloc.size)
    return Bind(alloc, 0, size - size % buf.align, buf.access, buf.fmt)


def record(seq, op, steps, **tensors) -> None:
    """Record ``steps`` into ``seq`` with the execution's tensors by role
    (``x=``, ``w=``, ``b=``, ``y=``; a role no step binds may be left out)."""
    for s in steps:
        seq.dispatch(s.pipe, [_bind(op, b, tensors) for b in s.binds], s.grid, s.push_bytes)
