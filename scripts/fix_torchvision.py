"""Make PyPI's (CUDA-built) torchvision importable beside the CPU build of torch.

Its compiled ops don't load against the CPU torch, so registering fake kernels
for `torchvision::nms` / `qnms` raises "operator torchvision::nms does not
exist" at import time, and every import of torchvision (transformers and vLLM
do so) dies. The Python parts vidchat needs (image transforms) work without
those ops, so the two registrations are made to skip when the op is missing.
Idempotent: running it twice changes nothing.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

MARKER = "# vidchat: skip fake kernels for ops this torch build lacks"
GUARD = f'''{MARKER}
def _vidchat_register_fake(qualname):
    def wrap(fn):
        try:
            return torch.library.register_fake(qualname)(fn)
        except RuntimeError:
            return fn
    return wrap

'''


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return 0  # nothing to fix
    path = pathlib.Path(spec.origin).with_name("_meta_registrations.py")
    if not path.exists():
        return 0
    text = path.read_text()
    if MARKER in text:
        return 0
    for op in ("nms", "qnms"):
        text = text.replace(
            f'@torch.library.register_fake("torchvision::{op}")', f'@_vidchat_register_fake("torchvision::{op}")'
        )
    anchor = "\n@"  # insert the helper before the first decorated function
    at = text.index(anchor)
    text = text[:at] + "\n" + GUARD + text[at + 1 :]
    # A new file in its place, never a write into the old one: uv installs
    # by hard-linking its cache's files, and an in-place write would patch
    # the cache (and every environment linked to it) as well.
    patched = path.with_name(path.name + ".vidchat-new")
    patched.write_text(text)
    patched.replace(path)
    print(f"fix_torchvision: patched {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
