"""Knowledge graphs on disk: the store, per-query subgraphs and the importers."""
