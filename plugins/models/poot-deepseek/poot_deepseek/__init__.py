"""poot-deepseek: the DeepSeek-V2 and V3 (MLA, MoE) model family for poot."""
