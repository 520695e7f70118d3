"""Models: the decoder, its architecture config, the presets and where weights and tokenizers come from."""
