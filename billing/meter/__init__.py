"""The request path: admission and settlement against Redis, the usage events they write,
and what a gateway process does while Redis does not answer."""
