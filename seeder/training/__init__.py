"""Training: the one loop and the sweep trial, without Ray."""
