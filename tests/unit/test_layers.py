"""The layers of docs/architecture.md are the import-linter contract that
`lint-imports` checks (scripts/test.sh), so neither the page nor the code drifts."""

from __future__ import annotations

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAME_COLUMN = 27  # the width of the page's left column


def _contract(contract_id: str) -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [contract] = [c for c in config["contracts"] if c["id"] == contract_id]
    return [" ".join(layer.split()) for layer in contract["layers"]]


def _page_layers() -> list[str]:
    """The left column of the page's layer diagram, a line beginning with two
    spaces continuing the layer above it."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    diagram = page.split("## Layers", 1)[1].split("```", 2)[1]
    layers: list[str] = []
    for line in diagram.strip("\n").splitlines():
        name = line[:NAME_COLUMN].strip()
        if not name:
            continue
        if line.startswith("  "):
            layers[-1] += " " + name
        else:
            layers.append(name)
    return layers


def test_the_architecture_page_lists_the_checked_layers() -> None:
    assert _page_layers() == _contract("layers")


def test_the_runtime_docstring_lists_its_checked_order() -> None:
    import stepstone.runtime

    listed = [
        line.split()[0] for line in (stepstone.runtime.__doc__ or "").splitlines() if line.startswith("    ")
    ]
    assert listed == _contract("runtime")
