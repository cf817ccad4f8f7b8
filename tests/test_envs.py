"""The environment-variable registry: README's table is generated from it, every
``DEEPINFER_*`` name the runtime spells is registered, and the accessors keep each
variable's parsing (and name the variable and its values when one is invalid)."""

import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from deepinfer_sm80 import envs

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Environment variables\n\n"


def readme_table() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION) + len(SECTION)
    end = text.index("\n## ", start)
    return text[start:end]


def test_readme_table_is_generated_from_the_registry():
    assert readme_table() == envs.markdown_table(), (
        "README.md's environment table differs from deepinfer_sm80.envs.markdown_table(): "
        "paste the generated table under '## Environment variables'"
    )


def test_every_name_the_runtime_spells_is_registered():
    out = subprocess.run(
        ["git", "grep", "-ohE", r"DEEPINFER_[A-Z0-9_]*[A-Z0-9]", "--", "overlay/"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    spelled = set(out.split())
    assert "DEEPINFER_FORCE" in spelled  # the scan sees the runtime's names
    assert spelled - set(envs.BY_NAME) == set()


def test_names_are_unique_and_entries_complete():
    names = [v.name for v in envs.REGISTRY]
    assert len(names) == len(set(names))
    for var in envs.REGISTRY:
        assert var.kind in ("flag", "choice", "str", "path", "list"), var.name
        assert var.readers and var.meaning, var.name
        assert (var.kind == "choice") == bool(var.choices) or var.kind == "flag", var.name


@pytest.mark.parametrize(
    ("value", "on"), [(None, False), ("1", True), ("0", False), ("", False), ("true", False)]
)
def test_default_off_flag_is_on_only_for_exactly_1(value, on):
    environ = {} if value is None else {"DEEPINFER_FORCE": value}
    assert envs.flag("DEEPINFER_FORCE", environ) is on


@pytest.mark.parametrize(
    ("value", "on"), [(None, True), ("0", False), (" 0 ", False), ("", True), ("no", True)]
)
def test_default_on_flag_is_off_only_for_0(value, on):
    environ = {} if value is None else {"DEEPINFER_YOCO": value}
    assert envs.flag("DEEPINFER_YOCO", environ) is on


def test_choice_normalizes_and_defaults():
    name = "DEEPINFER_SPARSE_MLA_DECODE"
    assert envs.choice(name, {}) == "auto"
    assert envs.choice(name, {name: ""}) == "auto"
    assert envs.choice(name, {name: " Triton "}) == "triton"


def test_invalid_choice_names_the_variable_and_the_values():
    name = "DEEPINFER_SPARSE_MLA_PREFILL"
    with pytest.raises(ValueError) as err:
        envs.choice(name, {name: "cutlass"})
    assert str(err.value) == (
        "DEEPINFER_SPARSE_MLA_PREFILL='cutlass': expected one of auto, tilelang, triton"
    )


def test_get_returns_the_raw_value_or_the_registered_default():
    assert envs.get("DEEPINFER_PATCHES", {"DEEPINFER_PATCHES": " a,b "}) == " a,b "
    url = "DEEPINFER_URL"
    assert envs.get(url, {}) == envs.get(url, {url: ""}) == "http://127.0.0.1:8000"
    key = "VLLM_API_KEY"  # no registered default
    assert envs.get(key, {}) is None and envs.get(key, {key: ""}) is None
    assert envs.get("DEEPINFER_CONFIG_DIR", {}, default="x") == "x"  # the caller's default
    assert envs.get(url, {}, default=None) is None


def test_computed_defaults_are_the_folders_the_readers_used():
    assert envs.get("DEEPINFER_RUNTIME_DIR", {}) == str(Path(tempfile.gettempdir()) / "deepinfer")
    assert envs.get("DEEPINFER_CONFIG_DIR", {}) == str(ROOT / "configs")
    assert envs.get("DEEPINFER_RUNTIME_DIR", {"DEEPINFER_RUNTIME_DIR": "/run/x"}) == "/run/x"


def test_unregistered_name_and_wrong_kind_are_refused():
    with pytest.raises(KeyError, match=re.escape("DEEPINFER_NOPE is not in")):
        envs.get("DEEPINFER_NOPE", {})
    with pytest.raises(TypeError, match="DEEPINFER_URL is a str, not a flag"):
        envs.flag("DEEPINFER_URL", {})
    with pytest.raises(TypeError, match="DEEPINFER_FORCE is a flag, not a choice"):
        envs.choice("DEEPINFER_FORCE", {})


def test_markdown_table_has_one_row_per_variable():
    rows = envs.markdown_table().splitlines()
    assert rows[:2] == ["| variable | values | read by | meaning |", "|---|---|---|---|"]
    assert len(rows) == 2 + len(envs.REGISTRY)
    assert "| `DEEPINFER_YOCO` | `0`, default `1` | vllm_plugin |" in envs.markdown_table()
