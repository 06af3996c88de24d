"""The round pipeline: privacy, compression and robust aggregation written once, applied to
every algorithm that declares a model-shaped upload (`AlgorithmConfig.uploads`)."""
