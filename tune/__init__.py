"""The Ray Tune entry point (``python tune/sweep.py``); the Ray-free sweep pieces live in ``seeder.training.sweep``.

Imported as ``tune`` only by its own scripts; Ray's tuner is ``ray.tune``, a different name."""
