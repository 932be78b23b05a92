"""The SeedER policy: network, rollouts, losses, the one inference path and the one model format."""
