"""rayfl's own callbacks, registered like a user's (see rayfl.registry)."""

from rayfl.registry import CALLBACKS

BUILTIN = [
    ("early_stopping", "stopping:early_stopping", "stopping:EarlyStoppingConfig", "Stop when a metric stops improving (patience)"),
    ("best_checkpoint", "stopping:best_checkpoint", "stopping:BestCheckpointConfig", "Keep the best global model as best_model.npz"),
    ("budget", "stopping:budget", "stopping:BudgetConfig", "Stop on a simulated-time or wall-time budget"),
    ("tensorboard", "trackers:tensorboard", "trackers:TensorBoardConfig", "Mirror the rounds and evals rows to TensorBoard"),
    ("mlflow", "trackers:mlflow_tracker", "trackers:MLflowConfig", "Mirror the rounds and evals rows and the job to MLflow"),
]

for name, make, config, summary in BUILTIN:
    CALLBACKS.register(name, f"rayfl.callbacks.{make}", config=f"rayfl.callbacks.{config}", summary=summary, origin="built-in")
