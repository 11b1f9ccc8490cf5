"""poot-llama: the Llama, Mistral and Mixtral model family for poot."""
