"""vkml/dml/tensor_desc.py's helpers (the TensorDesc rules are tested with the operators
that validate them: tests/test_padding.py, tests/test_descriptor_holes.py)."""
from __future__ import annotations

import numpy as np

from vkml import dml


def test_broadcast_tensor_desc():
    """NumPy's right-aligned broadcast as zero strides, checked against NumPy's own view."""
    for shape, sizes in (((3, 1), (2, 3, 4)), ((4,), (2, 3, 4)), ((), (2,)), ((2, 3), (2, 3)),
                         ((1, 1), (5, 1))):
        d = dml.broadcast_tensor_desc("float32", shape, sizes)
        view = np.broadcast_to(np.empty(shape, np.float32), sizes)
        assert d.sizes == sizes
        assert all(mine == theirs // 4 for mine, theirs, n in      # (a size-1 dimension's
                   zip(d.element_strides, view.strides, sizes) if n > 1)   # stride is moot)
        assert (d.strides is None) == (shape == sizes)
