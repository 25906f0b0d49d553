"""The gateway's side towards the engines: tier routes, replica pools and their HTTP/1.1
client, engine slots, and prefix-aware replica choice."""
