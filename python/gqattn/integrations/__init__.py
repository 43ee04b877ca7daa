"""Integrations of gqattn with other libraries: `transformers` (Hugging Face attention registry).
Layer: python/ integrations. Each submodule imports its library only when imported itself.
"""
