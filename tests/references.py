"""The tests' independent references, one per operator: ``from references import
fold_reference``.  They are defined in ``bench/references.py`` because the installed
bench checks its runners against the same ones and must not import the tests (the tests
import the bench).  ``tests/test_references.py`` checks each once against PyTorch."""
from bench.references import (ACTIVATION_DEFAULTS, ACTIVATION_FORMULAS, PAD_MODES,  # noqa: F401
                              activation_reference, convolution_reference, fold_reference,
                              lp_pooling_reference, pad_reference, unfold_reference,
                              window_counts, window_taps)

__all__ = ["ACTIVATION_DEFAULTS", "ACTIVATION_FORMULAS", "PAD_MODES", "activation_reference",
           "convolution_reference", "fold_reference", "lp_pooling_reference", "pad_reference",
           "unfold_reference", "window_counts", "window_taps"]
