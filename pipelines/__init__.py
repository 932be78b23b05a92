"""Thin Ray entry points that compose ``seeder`` library calls: preprocess (Ray Data), train (Ray Train)
and benchmark (Ray Data). Run them as scripts (``python pipelines/train.py``) or through ``ray job
submit``; the library never imports this package."""
