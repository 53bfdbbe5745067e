"""Well-known graphs by their dimensions, so a GNNJob can say ``dataset: pubmed`` instead of four numbers.

Dimensions are what the estimator, the runtime prior and the simulator need; the graphs themselves are not shipped.
Edge counts are directed edges as PyG stores them (an undirected edge counts twice). Sources: PyG's dataset
documentation for Cora, CiteSeer, PubMed, Reddit and the OGB node-property datasets (arxiv made undirected, as PyG's
``ToUndirected`` leaves it); the CoGNN paper's Table IV (seed ``002_*``) for the others. Cora and CiteSeer raw files
are available offline (``shared/data/graphs``), so the worker can train on the real graphs.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class GraphDataset(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    nodes: int
    edges: int
    features: int
    classes: int
    planetoid: str | None = None
    """The ``torch_geometric.datasets.Planetoid`` name when the raw files can be loaded offline."""
    source: str = ""


_CATALOGUE: tuple[GraphDataset, ...] = (
    GraphDataset(
        name="cora", nodes=2708, edges=10556, features=1433, classes=7, planetoid="Cora", source="PyG Planetoid"
    ),
    GraphDataset(
        name="citeseer", nodes=3327, edges=9104, features=3703, classes=6, planetoid="CiteSeer", source="PyG Planetoid"
    ),
    GraphDataset(name="pubmed", nodes=19717, edges=88648, features=500, classes=3, source="PyG Planetoid"),
    GraphDataset(name="reddit", nodes=232965, edges=114615892, features=602, classes=41, source="PyG Reddit"),
    GraphDataset(name="ogbn-arxiv", nodes=169343, edges=2315598, features=128, classes=40, source="OGB, undirected"),
    GraphDataset(name="ogbn-products", nodes=2449029, edges=123718280, features=100, classes=47, source="OGB"),
    GraphDataset(name="proteins", nodes=43471, edges=162088, features=29, classes=2, source="CoGNN Table IV"),
    GraphDataset(name="artist", nodes=50515, edges=1638396, features=100, classes=12, source="CoGNN Table IV"),
    GraphDataset(name="soc-blogcatalog", nodes=88784, edges=2093195, features=128, classes=39, source="CoGNN Table IV"),
    GraphDataset(name="dd", nodes=334925, edges=1686092, features=98, classes=2, source="CoGNN Table IV"),
    GraphDataset(name="amazon0601", nodes=410236, edges=4878875, features=96, classes=22, source="CoGNN Table IV"),
    GraphDataset(name="twitter", nodes=580768, edges=1435116, features=1323, classes=2, source="CoGNN Table IV"),
    GraphDataset(name="yeast", nodes=1714644, edges=3636546, features=74, classes=2, source="CoGNN Table IV"),
    GraphDataset(name="ovcar-8h", nodes=1890931, edges=3946402, features=66, classes=2, source="CoGNN Table IV"),
)

_ALIASES = {"soc-blog": "soc-blogcatalog", "blogcatalog": "soc-blogcatalog", "amazon": "amazon0601"}


def dataset_names() -> tuple[str, ...]:
    """Canonical names, in catalogue order (the CRD's enum lists exactly these)."""
    return tuple(d.name for d in _CATALOGUE)


def get_dataset(name: str) -> GraphDataset:
    """Look a dataset up by name, case-insensitively; ``KeyError`` lists the known names."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    for dataset in _CATALOGUE:
        if dataset.name == key:
            return dataset
    raise KeyError(f"unknown dataset {name!r}; known datasets: {', '.join(dataset_names())}")
