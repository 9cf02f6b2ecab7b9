"""Packages the command line keeps out of its own process because nothing it runs uses them, while importing them
costs every start seconds of CPU.

transformers imports SciPy whenever it is installed (`transformers.modeling_utils` -> `loss.loss_utils` ->
`loss_for_object_detection` -> `scipy.optimize`), for the Hungarian matching of object-detection losses, which
no path of this tool reaches (transformers' other uses of SciPy are its speech-recognition pipeline and the
models' training losses). Measured on this project's 2-core AMD EPYC: 0.5-0.7 s of the 7.1 s of CPU a cold
`gemma-embed images` on the tiny Gemma 4 sample takes (6.6 -> 6.0 s user CPU, alternated, 3 runs each side).

`sys.modules[name] = None` is Python's documented way to say "not installed" (the import system raises
ModuleNotFoundError and `importlib.util.find_spec` returns None, which is what transformers' availability checks
ask), so transformers takes the paths it takes on a machine without SciPy. Only the console script does this, for
its own process: the library never changes what its caller can import, and a package the process already holds
(imported before the command ran, by a `sitecustomize` for example) is left as it is.
"""

from __future__ import annotations

import sys

UNUSED_PACKAGES = ("scipy",)


def keep_out_unused_packages(names: tuple[str, ...] = UNUSED_PACKAGES) -> tuple[str, ...]:
    """Mark each of `names` the process has not imported yet as not installed; returns the names marked."""
    marked = []
    for name in names:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]
            marked.append(name)
    return tuple(marked)
