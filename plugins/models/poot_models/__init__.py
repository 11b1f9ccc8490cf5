"""poot-models: the model families poot ships (llama, qwen, gemma, phi, mistral, MoE, MLA)."""
