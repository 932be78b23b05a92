"""Data made from nothing or from a graph alone: synthetic graphs and generated questions."""
