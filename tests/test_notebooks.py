"""The notebooks run top to bottom with small sizes (their ``parameters`` cell replaced)."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SMALL = {
    "00_quickstart.ipynb": "SEEDS = 64\nROUNDS = 10\nAGENTS = 4\nH = 10",
    "01_heterogeneity_fedlsa_vs_scafflsa.ipynb": "SEEDS = 32\nROUNDS = 10\nAGENTS = 4\nH = 5\nETA = 0.1",
    "02_quantization_and_erasures.ipynb": "SEEDS = 32\nROUNDS = 12\nAGENTS = 4",
}


def test_every_notebook_is_covered():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(SMALL)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_notebook_runs(name, tmp_path):
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    params = [c for c in book.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "each notebook has one cell tagged 'parameters'"
    params[0].source = SMALL[name]
    nbclient.NotebookClient(book, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the notebook draws figures"
