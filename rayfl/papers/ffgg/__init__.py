"""FFGG (Mishchenko, Islamov, Gorbunov, Horvath, "Partially Personalized Federated Learning",
arXiv 2305.18285): the synthetic quadratic of Example 1 (`quadratic.py`, the dataset
`ffgg_quadratic` and its exact oracle), Fig. 1 and the async / Byzantine studies from Parquet
(`report.py`), and Table 1's pipeline (`table1.py`, `pipeline.py`). Algorithms:
rayfl/algorithms/{ffgg,async_ffgg,l2gd,finetune}.py; jobs: jobs/ffgg/; notes:
docs/replications/ffgg.md."""
