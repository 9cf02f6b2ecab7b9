"""Packages the command line keeps out of its own process because nothing it runs uses them, while importing them
costs every start seconds of CPU.

transformers imports SciPy whenever it is installed (`transformers.modeling_utils` -> `loss.loss_utils` ->
`loss_for_object_detection` -> `scipy.optimize`), for the Hungarian matching of object-detection losses, which
no path of this tool reaches (transformers' other uses of SciPy are its speech-recognition pipeline and the
models' training losses). Measured on this project's 2-core AMD EPYC with `python -m bench.bench_start`
(bench/README.md): 0.45-0.8 s less per model run, 7.69 -> 6.93 s of CPU for a cold `gemma-embed images` on the
tiny Gemma 4 sample.

`sys.modules[name] = None` is Python's documented way to say "not installed" (the import system raises
ModuleNotFoundError and `importlib.util.find_spec` returns None, which is what transformers' availability checks
ask), so transformers takes the paths it takes on a machine without SciPy. Only the console script does this, for
its own process: the library never changes what its caller can import, and a package the process already holds
(imported before the command ran, by a `sitecustomize` for example) is left as it is.
"""

from __future__ import annotations

import sys

UNUSED_PACKAGES = ("scipy",)


def keep_out_unused_packages() -> None:
    """Mark each of UNUSED_PACKAGES the process has not imported yet as not installed."""
    for name in UNUSED_PACKAGES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def let_in_unused_packages() -> None:
    """Undo `keep_out_unused_packages` for a command that does use them (`dedup`: SciPy's connected components;
    `map`: scikit-learn and umap-learn, which import SciPy), before it imports anything."""
    for name in UNUSED_PACKAGES:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]
