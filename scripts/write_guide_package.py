"""Write the extending guide's package (myfl/: FedAvgM, FedNova, FedDyn, a CNN, a dataset, a
partitioner; job.yaml; its Parquet data) into a directory, as the guide's reader would: what
`rayfl bench fedavg-mlp --algorithm myfl.fedavgm:FedAvgM,algorithm.beta=0` times a user's
algorithm with.

    python scripts/write_guide_package.py /tmp/myfl && cd /tmp/myfl
    rayfl bench fedavg-mlp --hosts 2 --vectorize auto --algorithm myfl.fedavgm:FedAvgM,algorithm.beta=0"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from guide_blocks import blocks  # noqa: E402  (the docs' own block reader, shared with the tests)


def write_package(where: Path) -> Path:
    """The guide's titled blocks as files under `where`, and its data made."""
    for block in blocks((REPO / "docs" / "guides" / "extending.md").read_text()):
        if block.title is not None:
            target = where / block.title
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
    subprocess.run([sys.executable, "make_data.py"], cwd=where, check=True, timeout=120)
    return where


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} DIRECTORY")
    print(write_package(Path(sys.argv[1])))
