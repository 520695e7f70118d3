"""The engine: LLMEngine's step loop over the scheduler and the runner, and its input and output processing."""
