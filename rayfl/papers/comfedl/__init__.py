"""ComFedL (Huang & Li, "Compositional federated learning: applications in distributionally
robust averaging and meta learning", arXiv 2106.11264 v3): the robust-FL figures 2, 3 and 6
from Parquet (`report.py`) and the MAML comparison, Figs. 4 and 5 (`maml_report.py`). The
paper reports curves only, so no published numbers ship here. Algorithms:
`rayfl/algorithms/comfedl.py`, `drfa.py`, `qfedavg.py` (and the MAML family); jobs:
`jobs/comfedl/`; replication notes: `docs/replications/comfedl.md`."""
