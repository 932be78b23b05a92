"""Measurement: ``seeder evaluate``, ``seeder benchmark`` and the trained model as a method."""
