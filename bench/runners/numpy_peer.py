"""NumPy as a peer: ``numpy.pad`` for padding; for the other operators the bench's own
reference algorithm (strided slices and ``matmul``), in float32.  float16 workloads are
computed in float32 and rounded (NumPy has no float16 BLAS)."""
from __future__ import annotations

import numpy as np

from .. import operators
from . import Runner


class NumpyPeer(Runner):
    name = "numpy"

    @classmethod
    def probe(cls) -> str:
        return np.__version__

    def prepare(self, workload, inputs):
        op, p, dtype = workload.op, workload.p, workload.np_dtype
        work = np.float32 if dtype == np.float16 and op != "pad" else dtype

        def run():
            y = operators.compute(op, p, inputs, work)
            return y if y.dtype == dtype else y.astype(dtype)

        return run


RUNNERS = [NumpyPeer]
