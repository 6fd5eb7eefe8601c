"""Example files, chat templates, batching (pad + mask) and sampling plans."""
