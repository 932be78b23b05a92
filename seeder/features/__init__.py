"""Text to vectors: the encoders (MiniLM and other BERTs) and the PCA reduction."""
