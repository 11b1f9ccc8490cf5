"""poot-phi3: the Phi-3 model family for poot."""
