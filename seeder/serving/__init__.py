"""A trained model as a retriever: load once, answer batches of new questions."""
