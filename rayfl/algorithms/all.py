"""Importing this module imports every algorithm's module: what a worker that may be asked to
run any algorithm preloads (rayfl.engine.head_process)."""

from rayfl.algorithms import import_all

import_all()
