"""A stop raised while the model loads passes through the libraries' own `except Exception:` handlers untouched."""

from __future__ import annotations

import signal
import sys

import pytest

from gemma_embed.interrupts import Interrupted


def test_a_stop_inside_a_hub_lazy_import_is_not_printed_on_stdout_nor_taken_for_an_import_error(tmp_path, capsys):
    # huggingface_hub's lazy attribute access (its `_attach`, which its own package uses for hf_api and the rest)
    # prints "Error importing ..." to stdout for any Exception raised while the submodule imports: with a stop as
    # an Exception, a Ctrl-C while the model loaded put that line among --jsonl records.
    from huggingface_hub import _attach

    (tmp_path / "stopping_package").mkdir()
    (tmp_path / "stopping_package" / "__init__.py").write_text("")
    (tmp_path / "stopping_package" / "loaded.py").write_text(
        "import signal\nfrom gemma_embed.interrupts import Interrupted\nraise Interrupted(signal.SIGINT)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        getattr_, _ = _attach("stopping_package", submodules=["loaded"])
        with pytest.raises(Interrupted) as stopped:
            getattr_("loaded")
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("stopping_package", "stopping_package.loaded"):
            sys.modules.pop(name, None)
    assert stopped.value.signum == signal.SIGINT
    assert capsys.readouterr().out == ""
    try:
        raise Interrupted(signal.SIGTERM)
    except Exception:  # noqa: BLE001 - the handler a library writes around a download or an import
        pytest.fail("a library's `except Exception:` took the stop")
    except Interrupted:
        pass
