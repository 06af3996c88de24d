"""FedRZO (Qiu, Shanbhag, Yousefian, NeurIPS 2023): problems, figures and notes beyond its algorithms.

Zeroth-order FL for nondifferentiable (FedRZO_nn, Alg. 1), bilevel (FedRZO_bl, Alg. 2) and
minimax problems, "Zeroth-Order Methods for Nondifferentiable, Nonconvex, and Hierarchical
Federated Optimization" (arXiv 2309.13024). The paper reports no number
in a table, only plots (Figs. 1-4), so there is no published CSV here: `report.py` draws Figs. 1,
3 and 4 (log of the average loss against communication rounds) from Parquet; jobs are in
jobs/fedrzo/ and the note in docs/replications/fedrzo.md."""
