"""Model definitions, one folder per architecture (only DeepSeek-V3 today)."""
