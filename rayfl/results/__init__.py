"""Run results: streamed to Parquet by `RunWriter`, read back by `load`, drawn by `plots`."""

from rayfl.results.load import Results, load
from rayfl.results.writer import RunWriter

__all__ = ["Results", "RunWriter", "load"]
