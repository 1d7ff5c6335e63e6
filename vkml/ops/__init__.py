"""Operator implementations: one module per DML operator page, registered by
``@implements`` when imported.  Every module here is imported, so a new operator needs
no registration line."""
from __future__ import annotations

import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")
del _info
