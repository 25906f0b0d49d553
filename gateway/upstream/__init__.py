"""The gateway's side towards the engines: tier routes, replica pools and their HTTP/1.1
client, engine slots, prefix-aware replica choice, and relaying one request's answer."""
