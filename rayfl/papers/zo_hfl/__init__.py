"""ZO-HFL (Qiu et al., arXiv 2504.01839): Table I's published numbers (`table1.csv`), the
Table I grid and Fig. 2 from Parquet (`report.py`), and the appendix toy problem of Fig. 3
(`toy.py`). Jobs: `jobs/zo_hfl/`; replication notes: `docs/replications/zo-hfl.md`."""
