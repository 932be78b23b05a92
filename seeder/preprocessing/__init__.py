"""Preprocessing without Ray: the stages, the artifacts they write and the derived defaults."""
