"""poot-qwen: the Qwen2, Qwen3 and their MoE variants model family for poot."""
