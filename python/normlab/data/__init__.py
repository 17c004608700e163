"""Data preparation: text into the nanoGPT token files the train job reads (data.source "tokens")."""
