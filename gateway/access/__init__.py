"""Who may call the gateway: API keys and their orgs in Redis, bearer-key authentication,
and the admin API that manages them."""
