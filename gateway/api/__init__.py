"""The OpenAI API the gateway serves: the generation endpoints (chat and text completions,
responses) and their handler, the request protocol, the relay of each request's answer
(streamed or assembled), overlapped admission, and a key's usage routes."""
