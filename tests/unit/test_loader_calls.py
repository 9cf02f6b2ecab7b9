"""No remote code, ever: the package's source calls transformers' loaders in one place only, always with
`trust_remote_code=False`, and reads no pickle. The source is read as an AST, so a new call site anywhere fails
here before it ships."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import gemma_embed
from gemma_embed.models import loading

PACKAGE = Path(gemma_embed.__file__).parent
THE_LOADER = ("models/loading.py", "load_pretrained")
AUTO_NAME = re.compile(r"^Auto[A-Z]\w*$")
# Loaders that build or read a model by other roads than load_pretrained, and the pickle readers.
FORBIDDEN_NAMES = {"SentenceTransformer", "pipeline", "from_pretrained", "load", "loads", "Unpickler"}
FORBIDDEN_MODULES = ("pickle", "dill", "cloudpickle", "joblib", "sentence_transformers")


def loader_violations(source: str, relative: str) -> list[str]:
    """Every place in one module's source that loads from a checkpoint outside `load_pretrained`, names an
    Auto class, passes trust_remote_code other than False, or imports a pickle reader."""
    found = []
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def function_of(node) -> str | None:
        while node in parents:
            node = parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                return node.name
        return None

    def where(node) -> str:
        return f"{relative}:{node.lineno}"

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "from_pretrained":
            if (relative, function_of(node)) != THE_LOADER:
                found.append(f"{where(node)}: .from_pretrained outside {THE_LOADER[1]}")
        if isinstance(node, ast.Attribute) and node.attr == "load" and isinstance(node.value, ast.Name):
            if node.value.id in ("torch", "pickle"):
                found.append(f"{where(node)}: {node.value.id}.load")
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name is not None and (AUTO_NAME.match(name) or name == "SentenceTransformer"):
            found.append(f"{where(node)}: {name} used directly (call load_pretrained)")
        if isinstance(node, ast.ImportFrom | ast.Import):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(m.split(".")[0] in FORBIDDEN_MODULES for m in modules):
                found.append(f"{where(node)}: imports {', '.join(modules)}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformers"):
                for alias in node.names:
                    if AUTO_NAME.match(alias.name) or alias.name in FORBIDDEN_NAMES:
                        found.append(f"{where(node)}: imports {alias.name} from {node.module}")
        if isinstance(node, ast.keyword) and node.arg == "trust_remote_code":
            if not (isinstance(node.value, ast.Constant) and node.value.value is False):
                found.append(f"{where(node.value)}: trust_remote_code={ast.unparse(node.value)}")
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and t.slice.value == "trust_remote_code"
            for t in node.targets
        ):
            if not (isinstance(node.value, ast.Constant) and node.value.value is False):
                found.append(f"{where(node)}: trust_remote_code set to {ast.unparse(node.value)}")
    return found


def test_the_package_loads_checkpoints_only_through_load_pretrained():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        violations += loader_violations(path.read_text(encoding="utf-8"), relative)
    assert violations == []
    loader = ast.parse((PACKAGE / THE_LOADER[0]).read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(loader) if isinstance(n, ast.Attribute) and n.attr == "from_pretrained"]
    assert len(calls) == 1  # the one call, in load_pretrained


def test_the_check_catches_each_kind_of_call_site():
    snippets = {
        "from transformers import AutoTokenizer\nAutoTokenizer.from_pretrained(p)": 3,
        "import transformers\ntransformers.AutoProcessor.from_pretrained(p, trust_remote_code=True)": 3,
        "def f(cls, p):\n    return cls.from_pretrained(p)": 1,
        "import torch\nstate = torch.load(p)": 1,
        "import pickle": 1,
        "from sentence_transformers import SentenceTransformer\nSentenceTransformer(p)": 2,
        "kwargs['trust_remote_code'] = flag": 1,
        "from transformers import pipeline": 1,
    }
    for source, count in snippets.items():
        assert len(loader_violations(source, "x.py")) >= count, source
    allowed = (
        "def load_pretrained(a, f, **k):\n    k['trust_remote_code'] = False\n    return a.from_pretrained(f, **k)"
    )
    assert loader_violations(allowed, THE_LOADER[0]) == []
    assert loader_violations(allowed, "models/other.py") != []


def test_every_json_file_transformers_loaders_read_is_checked():
    from transformers import tokenization_utils_base as tokenization
    from transformers import utils
    from transformers.utils import hub

    names = {
        utils.CONFIG_NAME,
        utils.FEATURE_EXTRACTOR_NAME,
        utils.IMAGE_PROCESSOR_NAME,
        utils.VIDEO_PROCESSOR_NAME,
        utils.AUDIO_TOKENIZER_NAME,
        utils.PROCESSOR_NAME,
        tokenization.TOKENIZER_CONFIG_FILE,
        tokenization.SPECIAL_TOKENS_MAP_FILE,
        tokenization.ADDED_TOKENS_FILE,
        hub.LEGACY_PROCESSOR_CHAT_TEMPLATE_FILE,
    }
    assert names <= set(loading.LOADER_JSON_FILES)
