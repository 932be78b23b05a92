"""The policy layer's operations, as torch ops and as compiled CPU kernels."""
