"""The OpenAI-compatible HTTP server over one engine (`eagletree serve`)."""
