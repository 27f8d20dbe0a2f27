"""A PyTorch inference engine with an OpenAI-compatible server; independent of the gateway."""
