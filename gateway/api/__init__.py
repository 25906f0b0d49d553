"""The OpenAI API the gateway serves: the generation endpoints (chat and text completions,
responses) and their handler, the request protocol, streamed and assembled answers,
overlapped admission, and a key's usage routes."""
