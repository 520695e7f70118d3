"""The backends a perf run drives (one `Backend` each, registered by name): refengine in process, the Hugging Face peers, OpenAI-compatible servers."""
