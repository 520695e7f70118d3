"""Sampling: the sampler, the penalties it applies and the per-step inputs it reads."""
