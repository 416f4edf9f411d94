"""The model a fleet serves: its card, tokenizer and chat template, incremental detokenizing.
Used by the frontend and the workers alike; imports ``schemas`` and ``base`` only."""
