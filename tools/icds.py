"""Print the Vulkan ICD manifests vkml's tests use, joined for ``VK_ICD_FILENAMES``:
Mesa's lavapipe (from the system) and SwiftShader (unpacked by tools/setup)."""
from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def icds() -> list[str]:
    found = []
    dirs = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"]
    for d in dirs:
        found += sorted(glob.glob(os.path.join(d, "lvp_icd*.json")))
        if found:
            break
    swiftshader = ROOT / ".drivers" / "swiftshader" / "vk_swiftshader_icd.json"
    if swiftshader.exists():
        found.append(str(swiftshader))
    return found


if __name__ == "__main__":
    paths = icds()
    if not paths:
        sys.exit("icds: neither lavapipe nor SwiftShader found; run tools/setup")
    print(os.pathsep.join(paths))
